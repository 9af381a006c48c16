//! limiterd as the xtask checks run it: the debug build on a free loopback port, its address
//! read from its first line, killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

/// limiterd, killed when dropped.
pub(crate) struct Daemon {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Builds the debug limiterd as README's test command (`cargo test --workspace`) builds it for
/// the integration tests: the same features, so after the tests (as in `.ci/run`) nothing is
/// compiled. A `cargo build -p limiterd` unifies features over limiterd alone and compiled
/// about 40 crates again (57 s on 2 cores, 2026-11-27).
pub(crate) fn build_limiterd() -> Result<(), String> {
    crate::run::cargo(&["test", "--workspace", "--no-run"], &[])
}

/// The debug build of limiterd on a free loopback port, with `env` set for it and `args`
/// added.
pub(crate) fn start_limiterd(env: &[(&str, &str)], args: &[&str]) -> Result<Daemon, String> {
    let binary = crate::run::target_dir().join("debug/limiterd");
    let mut child = Command::new(&binary)
        .args(["--listen", "127.0.0.1:0", "--log-level", "warn"])
        .args(args)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", binary.display()))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let mut reader = BufReader::new(stdout);
    let mut first = String::new();
    reader
        .read_line(&mut first)
        .map_err(|e| format!("limiterd's banner: {e}"))?;
    // Keep reading the rest of its output, so its stdout stays open while it serves.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    let addr = first
        .trim()
        .strip_prefix("limiterd listening on http://")
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("unexpected first line from limiterd: {first:?}"))?;
    Ok(Daemon { child, addr })
}
