//! `cargo xtask unkey`: unkey's published SDKs (`@unkey/api`, `@unkey/ratelimit`, pinned in
//! `xtask/unkey/package.json` and its lock file) drive limiterd unchanged. It installs them
//! with `npm ci` (Node 18 or later) and runs `xtask/unkey/sdk.mjs` (limits, costs,
//! `multiLimit` all or nothing, every override operation with a pattern, missing and wrong
//! keys, bad input) twice: against limiterd in memory, then against two limiterd processes on
//! one `redis-server` (started here on a free loopback port), where it also checks that they
//! count one budget and share overrides.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};

use crate::daemon::start_limiterd;
use crate::run::root;

/// A `redis-server` on a free loopback port, killed when dropped.
struct Redis(Child, u16);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> Result<Redis, String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run redis-server ({e}): install Debian's `redis-server`"))?;
    // Ready when it accepts a connection (within 10 s).
    for _ in 0..400 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(Redis(child, port));
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    Err(format!("redis-server did not listen on port {port}"))
}

fn node(dir: &std::path::Path, args: &[&str]) -> Result<(), String> {
    let status = Command::new("node")
        .arg("sdk.mjs")
        .args(args)
        .current_dir(dir)
        .status()
        .map_err(|e| format!("cannot run node ({e}): install Node.js 18 or later"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "unkey's SDKs failed against limiterd ({status}); see the FAIL line above"
        ))
    }
}

/// The key the check's limiterd accepts (a test key, nothing else accepts it).
const ROOT_KEY: &str = "xtask-unkey-root-key";

/// The task.
pub(crate) fn run() -> Result<(), String> {
    crate::daemon::build_limiterd()?;
    let dir = root().join("xtask/unkey");
    let npm = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir)
        .status()
        .map_err(|e| format!("cannot run npm ({e}): install Node.js 18 or later with npm"))?;
    if !npm.success() {
        return Err(format!("npm ci in {} failed ({npm})", dir.display()));
    }
    let env = [("LIMITERD_ROOT_KEY", ROOT_KEY)];
    let daemon = start_limiterd(&env, &[])?;
    node(&dir, &[&format!("http://{}", daemon.addr), ROOT_KEY])?;
    println!("xtask unkey: unkey's SDKs pass against limiterd in memory");
    drop(daemon);

    let redis = start_redis()?;
    let url = format!("redis://127.0.0.1:{}", redis.1);
    let first = start_limiterd(&env, &["--redis", &url])?;
    let second = start_limiterd(&env, &["--redis", &url])?;
    let (a, b) = (
        format!("http://{}", first.addr),
        format!("http://{}", second.addr),
    );
    node(&dir, &[&a, ROOT_KEY, &b])?;
    println!("xtask unkey: unkey's SDKs pass against two limiterd on one Redis");
    Ok(())
}
