//! Redis Sentinel started by a test: a master, its replicas, and three sentinels monitoring
//! the master under one name (quorum 2), with a short down-after so a killed master is failed
//! over within a few seconds.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{RedisServer, free_port, raw_command, server_binary, wait_until};

/// The master's name the sentinels monitor.
pub const MASTER_NAME: &str = "limitermaster";

/// How long a sentinel waits before it calls a silent master down.
pub const DOWN_AFTER_MS: u64 = 500;

/// One sentinel process.
#[derive(Debug)]
struct SentinelProcess {
    port: u16,
    child: Child,
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A master, its replicas and three sentinels (see the module docs).
#[derive(Debug)]
pub struct SentinelSet {
    /// The master as started (a failover may demote it).
    pub master: RedisServer,
    /// The replicas as started (a failover promotes one).
    pub replicas: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    dir: std::path::PathBuf,
}

impl SentinelSet {
    /// Starts a master and `replicas` replicas with `extra` arguments (an ACL user, say), and
    /// waits until every sentinel knows every replica and the other sentinels.
    pub fn start(replicas: usize, extra: Vec<String>) -> Self {
        let master = RedisServer::start_with(extra.clone());
        let mut replica_args = extra;
        replica_args.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            master.port.to_string(),
        ]);
        let replicas: Vec<RedisServer> = (0..replicas)
            .map(|_| RedisServer::start_with(replica_args.clone()))
            .collect();
        for replica in &replicas {
            let port = replica.port;
            wait_until("a replica to be in sync", || {
                raw_command(port, "INFO replication")
                    .is_some_and(|r| r.contains("master_link_status:up"))
            });
        }
        let dir = std::env::temp_dir().join(format!(
            "limiter-sentinels-{}-{}",
            std::process::id(),
            master.port
        ));
        std::fs::create_dir_all(&dir).expect("a directory for the sentinels");
        let sentinels = (0..3)
            .map(|i| Self::spawn_sentinel(&dir, i, master.port))
            .collect();
        let known = format!("*{}", replicas.len());
        let set = Self {
            master,
            replicas,
            sentinels,
            dir,
        };
        for sentinel in &set.sentinels {
            let port = sentinel.port;
            wait_until("each sentinel to know the replicas and the others", || {
                let replicas = raw_command(port, &format!("SENTINEL REPLICAS {MASTER_NAME}"));
                let others = raw_command(port, &format!("SENTINEL SENTINELS {MASTER_NAME}"));
                replicas.is_some_and(|r| r.starts_with(&known))
                    && others.is_some_and(|r| r.starts_with("*2"))
            });
        }
        set
    }

    fn spawn_sentinel(dir: &std::path::Path, index: usize, master_port: u16) -> SentinelProcess {
        let port = free_port();
        let config = dir.join(format!("sentinel-{index}.conf"));
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER_NAME} 4000\nsentinel parallel-syncs {MASTER_NAME} 1\n",
                dir.display()
            ),
        )
        .expect("write a sentinel's configuration");
        let child = Command::new(server_binary())
            .arg(&config)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start a sentinel");
        wait_until("a sentinel to answer PING", || {
            raw_command(port, "PING").is_some_and(|r| r.starts_with("+PONG"))
        });
        SentinelProcess { port, child }
    }

    /// The sentinels' URLs.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}", s.port))
            .collect()
    }

    /// The port the sentinels name as the master now (asking the first that answers).
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let reply = raw_command(
                s.port,
                &format!("SENTINEL GET-MASTER-ADDR-BY-NAME {MASTER_NAME}"),
            )?;
            // *2 $9 127.0.0.1 $5 port
            reply.lines().nth(4)?.trim().parse().ok()
        })
    }

    /// Kills the master (SIGKILL) and waits until the sentinels name a replica: the instant
    /// they did, and which replica.
    pub fn fail_over(&mut self) -> (Instant, usize) {
        let ports: Vec<u16> = self.replicas.iter().map(|r| r.port).collect();
        self.master.kill();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(promoted) = self
                .master_port()
                .and_then(|port| ports.iter().position(|&p| p == port))
            {
                return (Instant::now(), promoted);
            }
            assert!(
                Instant::now() < deadline,
                "the sentinels never promoted the replica"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        self.sentinels.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
