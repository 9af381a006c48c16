//! Real `redis-server` processes for the tests (feature `redis-server`), each on a free
//! loopback port, killed on drop: the Redis backend's, the middleware's and limiterd's tests.
//!
//! The server binary is `$REDIS_SERVER` if set, else `redis-server` on the `PATH` (Debian's
//! `redis-server` package; `.ci/run` installs it when missing). Nothing here depends on a server
//! already running.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn server_binary() -> String {
    std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned())
}

/// A port nothing listens on now, and never handed out before by this process: a test that
/// kills its server must not see another test's server come up on the same port (its client
/// would reconnect to it and find fresh state).
pub fn free_port() -> u16 {
    static HANDED_OUT: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut handed_out = HANDED_OUT
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = listener.local_addr().expect("local address").port();
        if !handed_out.contains(&port) {
            handed_out.push(port);
            return port;
        }
    }
}

/// Sends one inline command and returns the raw reply (enough for PING and CLUSTER INFO).
pub fn raw_command(port: u16, command: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream.write_all(format!("{command}\r\n").as_bytes()).ok()?;
    let mut buffer = vec![0; 8192];
    let n = stream.read(&mut buffer).ok()?;
    Some(String::from_utf8_lossy(&buffer[..n]).into_owned())
}

fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    /// The loopback port the server listens on; kept across [`RedisServer::restart`].
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    extra: Vec<String>,
}

impl RedisServer {
    /// A fresh server on a free port, with nothing persisted.
    pub fn start() -> Self {
        Self::start_with(Vec::new())
    }

    /// A fresh server on a free port, with `extra` command-line arguments after the defaults
    /// (for example `--cluster-enabled yes`).
    pub fn start_with(extra: Vec<String>) -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("limiter-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let mut server = Self {
            port,
            child: None,
            dir,
            extra,
        };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let child = Command::new(server_binary())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start `{}` ({e}); install Debian's redis-server package or set REDIS_SERVER to its path",
                    server_binary()
                )
            });
        self.child = Some(child);
        let port = self.port;
        wait_until("redis-server to answer PING", || {
            raw_command(port, "PING").is_some_and(|r| r.starts_with("+PONG"))
        });
    }

    /// The `redis://` URL a client connects with.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills the process (SIGKILL): connections drop, state is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, empty.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// A synchronous client for setting up and inspecting keys.
    pub fn client(&self) -> redis::Connection {
        redis::Client::open(self.url())
            .and_then(|c| c.get_connection())
            .expect("connect to the test server")
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of three masters, each slot range on its own process.
#[derive(Debug)]
pub struct RedisCluster {
    /// The three masters, in slot order.
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three masters, assigns each a third of the slots and waits for `cluster_state:ok`.
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(vec![
                    "--cluster-enabled".into(),
                    "yes".into(),
                    "--cluster-node-timeout".into(),
                    "2000".into(),
                ])
            })
            .collect();
        // Each master takes a third of the 16384 slots, then they meet.
        let thirds = [(0, 5460), (5461, 10922), (10923, 16383)];
        for (node, (first, last)) in nodes.iter().zip(thirds) {
            let reply = raw_command(node.port, &format!("CLUSTER ADDSLOTSRANGE {first} {last}"));
            assert!(
                reply.as_deref().is_some_and(|r| r.starts_with("+OK")),
                "{reply:?}"
            );
        }
        for node in &nodes[1..] {
            let reply = raw_command(
                nodes[0].port,
                &format!("CLUSTER MEET 127.0.0.1 {}", node.port),
            );
            assert!(
                reply.as_deref().is_some_and(|r| r.starts_with("+OK")),
                "{reply:?}"
            );
        }
        for node in &nodes {
            let port = node.port;
            wait_until("the cluster to be ok", || {
                raw_command(port, "CLUSTER INFO").is_some_and(|r| {
                    r.contains("cluster_state:ok") && r.contains("cluster_known_nodes:3")
                })
            });
        }
        Self { nodes }
    }

    /// Every node's URL, the seed list a cluster client takes.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// The index of the master serving `key` (by the slots [`start`](Self::start) gave each,
    /// the slot as the cluster itself computes it).
    pub fn master_of(&self, key: &str) -> usize {
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.nodes[0].client())
            .expect("CLUSTER KEYSLOT");
        match slot {
            0..=5460 => 0,
            5461..=10922 => 1,
            _ => 2,
        }
    }

    /// How many script calls (`FCALL`, `EVALSHA`, `EVAL`) each master has run since its stats
    /// were last reset.
    pub fn script_calls(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .map(|node| {
                let info: String = redis::cmd("INFO")
                    .arg("commandstats")
                    .query(&mut node.client())
                    .expect("INFO commandstats");
                info.lines()
                    .filter(|l| {
                        ["cmdstat_fcall:", "cmdstat_evalsha:", "cmdstat_eval:"]
                            .iter()
                            .any(|c| l.starts_with(c))
                    })
                    .filter_map(|l| {
                        l.split([':', ','])
                            .find_map(|f| f.strip_prefix("calls="))
                            .and_then(|n| n.parse::<u64>().ok())
                    })
                    .sum()
            })
            .collect()
    }
}

/// A decision of a limit counted in microseconds (the Rust twin of a Redis limit,
/// `RedisLimit::in_micros`, whose "ns" are microseconds) as the Redis limiter reports it, in
/// nanoseconds.
pub fn micros_as_nanos(d: limiter_core::Decision) -> limiter_core::Decision {
    let ns = |us: u64| us.saturating_mul(1_000);
    if d.is_allowed() {
        limiter_core::Decision::allow(d.limit(), d.remaining(), ns(d.reset_after_nanos()))
    } else {
        limiter_core::Decision::deny(
            d.limit(),
            d.remaining(),
            ns(d.retry_after_nanos()),
            ns(d.reset_after_nanos()),
        )
    }
}

/// The bytes a limiter key holds (read them with limiter-redis's `RedisLimit::twin_state`), or
/// `None` for an absent key.
pub fn stored_state(conn: &mut redis::Connection, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(key)
        .query(conn)
        .expect("read a limiter key")
}
