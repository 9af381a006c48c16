//! Real `redis-server` processes for the tests (feature `redis-server`), each on a free
//! loopback port, killed on drop: the Redis backend's, the middleware's and limiterd's tests.
//! One server here (with a TLS port and ACL users when asked); clusters with or without
//! replicas in [`cluster`]; a master, a replica and three sentinels in [`sentinel`];
//! certificates generated per test in [`tls`] (feature `tls-certs`).
//!
//! The server binary is `$REDIS_SERVER` if set, else `redis-server` on the `PATH` (Debian's
//! `redis-server` package; `.ci/run` installs it when missing). Nothing here depends on a server
//! already running.

mod cluster;
mod sentinel;
#[cfg(feature = "tls-certs")]
pub mod tls;

pub use cluster::{ClusterOptions, RedisCluster};
pub use sentinel::{DOWN_AFTER_MS, MASTER_NAME, SentinelOptions, SentinelSet};

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) fn server_binary() -> String {
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

/// Waits until the replica on `replica` has every write the master on `master` acknowledged
/// (their replication offsets are equal): a failover then loses nothing. Both plaintext ports.
pub fn wait_until_replicated(master: u16, replica: u16) {
    let offset = |port: u16, field: &str| -> Option<u64> {
        raw_command(port, "INFO replication")?
            .lines()
            .find_map(|l| l.strip_prefix(field)?.trim().parse().ok())
    };
    wait_until("a replica to have every write", || {
        let wanted = offset(master, "master_repl_offset:");
        wanted.is_some() && offset(replica, "slave_repl_offset:") == wanted
    });
}

/// Logs in with `password` (the default user), then sends one inline command: its raw reply.
pub fn raw_command_as(port: u16, password: Option<&str>, command: &str) -> Option<String> {
    let Some(password) = password else {
        return raw_command(port, command);
    };
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    stream
        .write_all(format!("AUTH {password}\r\n{command}\r\n").as_bytes())
        .ok()?;
    let mut reply = Vec::new();
    let mut buffer = vec![0; 8192];
    // The login's answer, then the command's.
    while reply.len() <= "+OK\r\n".len() {
        let n = stream.read(&mut buffer).ok()?;
        if n == 0 {
            break;
        }
        reply.extend_from_slice(&buffer[..n]);
    }
    let text = String::from_utf8_lossy(&reply).into_owned();
    text.strip_prefix("+OK\r\n").map(str::to_owned)
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

/// The calls of `command` (`fcall`, `function|load`) that `stats`, a server's
/// `INFO commandstats`, counts; 0 for one it has not run.
pub fn calls_in(stats: &str, command: &str) -> u64 {
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:")))
        .and_then(|fields| fields.split(',').find_map(|f| f.strip_prefix("calls=")))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// Waits (polling every 20 ms, at most 20 s) until `ready`.
pub fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    /// The loopback port the server listens on in plaintext (the tests' own inspection port
    /// when it also has a TLS port); kept across [`RedisServer::restart`].
    pub port: u16,
    /// Its TLS port, if it has one.
    pub tls_port: Option<u16>,
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
        Self::start_on(free_port(), None, extra)
    }

    /// A fresh server on `port`, with a TLS port if given, and `extra` arguments.
    pub(crate) fn start_on(port: u16, tls_port: Option<u16>, mut extra: Vec<String>) -> Self {
        let dir = std::env::temp_dir().join(format!("limiter-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        if let Some(tls_port) = tls_port {
            extra.splice(0..0, ["--tls-port".to_owned(), tls_port.to_string()]);
        }
        let mut server = Self {
            port,
            tls_port,
            child: None,
            dir,
            extra,
        };
        server.spawn();
        server
    }

    /// A fresh server with ACL `users` beside the `default` user (each a rule list as
    /// `ACL SETUSER` takes it, the name first: `limiter on >secret ~limiter:* +@all`).
    pub fn start_with_users(users: &[&str]) -> Self {
        let mut extra = Vec::new();
        for user in users {
            extra.push("--user".to_owned());
            extra.extend(user.split_whitespace().map(str::to_owned));
        }
        Self::start_with(extra)
    }

    /// The server's own directory (for files it reads, such as certificates).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
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
        // A server whose default user needs a password answers NOAUTH: it is up.
        wait_until("redis-server to answer PING", || {
            raw_command(port, "PING")
                .is_some_and(|r| r.starts_with("+PONG") || r.starts_with("-NOAUTH"))
        });
    }

    /// The `redis://` URL a client connects with.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The `rediss://` URL of its TLS port at `host` (`localhost`, `127.0.0.1`, or a name
    /// its certificate does not hold).
    pub fn tls_url(&self, host: &str) -> String {
        let port = self.tls_port.expect("a server started with a TLS port");
        format!("rediss://{host}:{port}")
    }

    /// Whether the process is running.
    pub fn is_running(&self) -> bool {
        self.child.is_some()
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
