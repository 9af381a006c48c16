//! Redis Sentinel started by a test: a master, its replicas, and three sentinels monitoring
//! the master under one name (quorum 2), with a short down-after so a killed master is failed
//! over within a few seconds.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{RedisServer, free_port, raw_command, raw_command_as, server_binary, wait_until};

/// The master's name the sentinels monitor.
pub const MASTER_NAME: &str = "limitermaster";

/// How long a sentinel waits before it calls a silent master down.
pub const DOWN_AFTER_MS: u64 = 500;

/// One sentinel process.
#[derive(Debug)]
struct SentinelProcess {
    port: u16,
    tls_port: Option<u16>,
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
    /// The sentinels' own password, if they need one.
    password: Option<String>,
}

/// How to start a [`SentinelSet`].
#[derive(Debug, Clone, Default)]
pub struct SentinelOptions {
    /// Replicas of the master.
    pub replicas: usize,
    /// Arguments for the master and the replicas (an ACL user, say).
    pub extra: Vec<String>,
    /// The sentinels' own password (`requirepass`), if any.
    pub password: Option<String>,
    /// TLS everywhere (clients, replication, the sentinels' links), on these certificates;
    /// every process keeps a plaintext port for the test's own inspection.
    #[cfg(feature = "tls-certs")]
    pub tls: Option<super::tls::TestCerts>,
}

impl SentinelSet {
    /// Starts a master and `replicas` replicas with `extra` arguments (an ACL user, say), and
    /// waits until every sentinel knows every replica and the other sentinels.
    pub fn start(replicas: usize, extra: Vec<String>) -> Self {
        Self::start_with(&SentinelOptions {
            replicas,
            extra,
            ..SentinelOptions::default()
        })
    }

    /// A set as `options` say (see [`start`](Self::start)).
    pub fn start_with(options: &SentinelOptions) -> Self {
        #[cfg(feature = "tls-certs")]
        let tls = options.tls.as_ref();
        let data = |extra: Vec<String>| -> RedisServer {
            #[cfg(feature = "tls-certs")]
            if let Some(certs) = tls {
                let mut args = extra;
                args.extend(["--tls-replication".to_owned(), "yes".to_owned()]);
                return RedisServer::start_tls(certs, false, args);
            }
            RedisServer::start_with(extra)
        };
        let master = data(options.extra.clone());
        // What the sentinels and the replicas reach the master at: its TLS port under TLS.
        let master_port = master.tls_port.unwrap_or(master.port);
        let mut replica_args = options.extra.clone();
        replica_args.extend([
            "--replicaof".to_owned(),
            "127.0.0.1".to_owned(),
            master_port.to_string(),
        ]);
        let replicas: Vec<RedisServer> = (0..options.replicas)
            .map(|_| data(replica_args.clone()))
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
        let password = options.password.as_deref();
        #[cfg(feature = "tls-certs")]
        let tls_lines = tls.map_or_else(String::new, |certs| {
            let path = |p: &std::path::PathBuf| p.display().to_string();
            format!(
                "tls-port {{tls_port}}\ntls-replication yes\ntls-auth-clients no\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n",
                path(&certs.server_cert),
                path(&certs.server_key),
                path(&certs.ca)
            )
        });
        #[cfg(not(feature = "tls-certs"))]
        let tls_lines = String::new();
        let sentinels = (0..3)
            .map(|i| Self::spawn_sentinel(&dir, i, master_port, password, &tls_lines))
            .collect();
        let known = format!("*{}", replicas.len());
        let set = Self {
            master,
            replicas,
            sentinels,
            dir,
            password: options.password.clone(),
        };
        for sentinel in &set.sentinels {
            let port = sentinel.port;
            let ask = |command: &str| raw_command_as(port, password, command);
            wait_until("each sentinel to know the replicas and the others", || {
                let replicas = ask(&format!("SENTINEL REPLICAS {MASTER_NAME}"));
                let others = ask(&format!("SENTINEL SENTINELS {MASTER_NAME}"));
                replicas.is_some_and(|r| r.starts_with(&known))
                    && others.is_some_and(|r| r.starts_with("*2"))
            });
        }
        set
    }

    fn spawn_sentinel(
        dir: &std::path::Path,
        index: usize,
        master_port: u16,
        password: Option<&str>,
        tls_lines: &str,
    ) -> SentinelProcess {
        let port = free_port();
        let tls_port = (!tls_lines.is_empty()).then(free_port);
        let config = dir.join(format!("sentinel-{index}.conf"));
        // Sentinels that ask for a password log in to one another with it too.
        let login = password.map_or_else(String::new, |p| {
            format!("requirepass {p}\nsentinel sentinel-pass {p}\n")
        });
        let tls = tls_lines.replace("{tls_port}", &tls_port.unwrap_or(0).to_string());
        std::fs::write(
            &config,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout {MASTER_NAME} 4000\nsentinel parallel-syncs {MASTER_NAME} 1\n{login}{tls}",
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
            raw_command(port, "PING")
                .is_some_and(|r| r.starts_with("+PONG") || r.starts_with("-NOAUTH"))
        });
        SentinelProcess {
            port,
            tls_port,
            child,
        }
    }

    /// The sentinels' URLs (`rediss://` at their TLS ports when they have them).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| match s.tls_port {
                Some(port) => format!("rediss://127.0.0.1:{port}"),
                None => format!("redis://127.0.0.1:{}", s.port),
            })
            .collect()
    }

    /// The port the sentinels name as the master now (asking the first that answers; a TLS
    /// port under TLS).
    pub fn master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            let reply = raw_command_as(
                s.port,
                self.password.as_deref(),
                &format!("SENTINEL GET-MASTER-ADDR-BY-NAME {MASTER_NAME}"),
            )?;
            // *2 $9 127.0.0.1 $5 port
            reply.lines().nth(4)?.trim().parse().ok()
        })
    }

    /// Waits until every replica has every write the master acknowledged: a failover then
    /// loses nothing.
    pub fn wait_for_replication(&self) {
        for replica in &self.replicas {
            super::wait_until_replicated(self.master.port, replica.port);
        }
    }

    /// Kills the master (SIGKILL) and waits until the sentinels name a replica: the instant
    /// they did, and which replica.
    pub fn fail_over(&mut self) -> (Instant, usize) {
        let ports: Vec<u16> = self
            .replicas
            .iter()
            .map(|r| r.tls_port.unwrap_or(r.port))
            .collect();
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
