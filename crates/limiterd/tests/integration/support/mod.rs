//! What the process tests share: a limiterd binary started on a free loopback port (killed on
//! drop), a keep-alive JSON client for it (over the testkit's HTTP/1.1 client), a gRPC channel
//! whose calls have a deadline, where a section's daemon counts (its memory or a Redis of its
//! own), and temporary files; unkey's v2 calls (`unkey.rs`); fixed windows on a real clock
//! (`windows.rs`); calendar quotas on one (`calendars.rs`).

pub(crate) mod calendars;
pub(crate) mod unkey;
pub(crate) mod windows;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde_json::Value;

/// A running limiterd, killed on drop.
pub(crate) struct Daemon {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
    /// Its stdout after the first line (taken by the recorder when recorded).
    pub(crate) stdout: Option<BufReader<std::process::ChildStdout>>,
    /// Everything it wrote to stdout after its first line and to stderr, when started by
    /// [`Daemon::start_recorded`].
    pub(crate) recorded: Option<std::sync::Arc<std::sync::Mutex<String>>>,
}

impl Daemon {
    pub(crate) fn start(args: &[&str]) -> Self {
        Self::start_with_env(args, &[])
    }

    /// Started on the configuration `config` (written to the temporary file `file`), its store
    /// the Redis at `redis_url`.
    pub(crate) fn on_redis(file: &str, config: &str, redis_url: &str) -> Self {
        let config = temp_file(file, config);
        Self::start(&[
            "--config",
            config.to_str().expect("UTF-8"),
            "--redis",
            redis_url,
        ])
    }

    /// [`start`](Self::start) with environment variables set for the process.
    pub(crate) fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::spawn(args, env, Stdio::inherit())
    }

    /// [`start_with_env`](Self::start_with_env), recording everything it writes (see
    /// [`Daemon::output`]).
    pub(crate) fn start_recorded(args: &[&str], env: &[(&str, &str)]) -> Self {
        Self::recording(Self::spawn(args, env, Stdio::piped()))
    }

    /// [`start_recorded`](Self::start_recorded), the process allowed at most `open_files`
    /// file descriptors (`ulimit -n`).
    pub(crate) fn start_recorded_with_files(args: &[&str], open_files: u32) -> Self {
        Self::recording(Self::spawn_limited(
            args,
            &[],
            Stdio::piped(),
            Some(open_files),
        ))
    }

    /// `daemon`, its output recorded from now on.
    fn recording(mut daemon: Self) -> Self {
        let recorded = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let stderr = daemon.child.stderr.take().expect("piped");
        let stdout = daemon.stdout.take().expect("stdout not yet taken");
        for stream in [
            Box::new(BufReader::new(stderr)) as Box<dyn BufRead + Send>,
            Box::new(stdout),
        ] {
            let into = std::sync::Arc::clone(&recorded);
            std::thread::spawn(move || {
                for line in stream.lines().map_while(Result::ok) {
                    let mut text = into
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    text.push_str(&line);
                    text.push('\n');
                }
            });
        }
        daemon.recorded = Some(recorded);
        daemon
    }

    /// What a recorded daemon wrote so far (stdout after its first line, and stderr).
    pub(crate) fn output(&self) -> String {
        self.recorded
            .as_ref()
            .expect("started by start_recorded")
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Waits (at most 20 s) until a recorded daemon's output holds `what`.
    pub(crate) fn wait_for_output(&self, what: &str) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let output = self.output();
            if output.contains(what) {
                return output;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "limiterd never wrote {what:?}:\n{output}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    fn spawn(args: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Self {
        Self::spawn_limited(args, env, stderr, None)
    }

    fn spawn_limited(
        args: &[&str],
        env: &[(&str, &str)],
        stderr: Stdio,
        open_files: Option<u32>,
    ) -> Self {
        let binary = env!("CARGO_BIN_EXE_limiterd");
        let mut command = match open_files {
            None => Command::new(binary),
            // The shell lowers its limit and becomes limiterd (same process, same limit).
            Some(n) => {
                let mut shell = Command::new("sh");
                shell.args([
                    "-c",
                    &format!("ulimit -n {n} && exec \"$0\" \"$@\""),
                    binary,
                ]);
                shell
            }
        };
        let mut child = command
            .args(args)
            .envs(env.iter().copied())
            .args(["--listen", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start limiterd");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut first = String::new();
        stdout
            .read_line(&mut first)
            .expect("limiterd prints where it listens");
        let addr = first
            .trim()
            .strip_prefix("limiterd listening on http://")
            .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
            .parse()
            .expect("an address");
        Self {
            child,
            addr,
            stdout: Some(stdout),
            recorded: None,
        }
    }
}

impl Daemon {
    /// Reads the daemon's output up to the line starting with `prefix`; the rest of it.
    pub(crate) fn line_after(&mut self, prefix: &str) -> String {
        loop {
            let mut line = String::new();
            let read = self
                .stdout
                .as_mut()
                .expect("not recorded")
                .read_line(&mut line)
                .expect("limiterd's output");
            assert!(read > 0, "limiterd ended its output before {prefix:?}");
            if let Some(rest) = line.trim_end().strip_prefix(prefix) {
                return rest.to_owned();
            }
        }
    }
}

impl Daemon {
    /// Sends the signal `name` (`TERM`, `HUP`) to the daemon.
    pub(crate) fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the daemon to exit, at most `within`.
    pub(crate) fn exits_within(&mut self, within: std::time::Duration) -> std::process::ExitStatus {
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(exit) = self.child.try_wait().expect("wait") {
                return exit;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "limiterd was still running {within:?} after the signal"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A keep-alive HTTP/1.1 connection to a daemon (the testkit's client), speaking JSON.
pub(crate) struct Client {
    inner: limiter_testkit::http_client::Client,
}

impl Client {
    pub(crate) async fn connect(addr: SocketAddr) -> Self {
        Self {
            inner: limiter_testkit::http_client::Client::connect(addr).await,
        }
    }

    pub(crate) async fn send(&mut self, method: &str, path: &str, body: &str) -> (u16, String) {
        let reply = self
            .inner
            .request(method, path, &[("content-type", "application/json")], body)
            .await;
        (reply.status.as_u16(), reply.body)
    }

    /// A request with the headers given (none added).
    pub(crate) async fn send_with(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> (u16, String) {
        let reply = self.inner.request(method, path, headers, body).await;
        (reply.status.as_u16(), reply.body)
    }

    /// A request with the headers given (none added): the whole reply, headers included.
    pub(crate) async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> limiter_testkit::http_client::Reply {
        self.inner.request(method, path, headers, body).await
    }

    pub(crate) async fn post(&mut self, path: &str, body: &Value) -> (u16, Value) {
        let (status, text) = self.send("POST", path, &body.to_string()).await;
        let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        (status, value)
    }

    pub(crate) async fn decide(&mut self, body: Value) -> Value {
        let (status, value) = self.post("/v1/ratelimit", &body).await;
        assert_eq!(status, 200, "{value}");
        value
    }
}

pub(crate) fn temp_file(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("limiterd-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write");
    path
}

/// Where a test's daemon counts: its own memory, or a Redis server of its own, started here
/// (so a section run again starts from empty counters either way).
pub(crate) struct Counting {
    pub(crate) server: Option<limiter_testkit::redis_server::RedisServer>,
    url: Option<String>,
}

impl Counting {
    /// In memory, or (`on_redis`) on a fresh Redis.
    pub(crate) fn new(on_redis: bool) -> Self {
        let server = on_redis.then(limiter_testkit::redis_server::RedisServer::start);
        let url = server
            .as_ref()
            .map(limiter_testkit::redis_server::RedisServer::url);
        Self { server, url }
    }

    /// The daemon's store arguments: `--redis URL`, or none.
    pub(crate) fn args(&self) -> Vec<&str> {
        self.url
            .iter()
            .flat_map(|u| ["--redis", u.as_str()])
            .collect()
    }

    /// A file name for `name` apart from other runs': `{name}-redis-{port}.{extension}`, or
    /// `{name}-memory.{extension}`.
    pub(crate) fn file_name(&self, name: &str, extension: &str) -> String {
        match &self.server {
            Some(server) => format!("{name}-redis-{}.{extension}", server.port),
            None => format!("{name}-memory.{extension}"),
        }
    }
}

/// A gRPC channel to the daemon at `addr` on which every call ends within a bound: tonic sets
/// no deadline of its own, and a call on a channel whose daemon stopped (or whose port another
/// process took) can otherwise wait forever, hanging the whole suite.
pub(crate) async fn grpc_channel(addr: &str) -> tonic::transport::Channel {
    tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("an address")
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .expect("connect over gRPC")
}
