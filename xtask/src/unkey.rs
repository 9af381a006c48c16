//! `cargo xtask unkey`: unkey's published SDKs (`@unkey/api`, `@unkey/ratelimit`, pinned in
//! `xtask/unkey/package.json` and its lock file) drive limiterd unchanged. It installs them
//! with `npm ci` (Node 18 or later), starts limiterd with a root key (`LIMITERD_ROOT_KEY`),
//! and runs `xtask/unkey/sdk.mjs`, which checks limits, costs, `multiLimit` all or nothing,
//! missing and wrong keys, and bad input.

use std::process::Command;

use crate::daemon::start_limiterd;
use crate::run::{cargo, root};

/// The key the check's limiterd accepts (a test key, nothing else accepts it).
const ROOT_KEY: &str = "xtask-unkey-root-key";

/// The task.
pub(crate) fn run() -> Result<(), String> {
    cargo(&["build", "-p", "limiterd", "--bin", "limiterd"], &[])?;
    let dir = root().join("xtask/unkey");
    let npm = Command::new("npm")
        .args(["ci", "--no-audit", "--no-fund"])
        .current_dir(&dir)
        .status()
        .map_err(|e| format!("cannot run npm ({e}): install Node.js 18 or later with npm"))?;
    if !npm.success() {
        return Err(format!("npm ci in {} failed ({npm})", dir.display()));
    }
    let daemon = start_limiterd(&[("LIMITERD_ROOT_KEY", ROOT_KEY)])?;
    let base = format!("http://{}", daemon.addr);
    let node = Command::new("node")
        .args(["sdk.mjs", &base, ROOT_KEY])
        .current_dir(&dir)
        .status()
        .map_err(|e| format!("cannot run node ({e}): install Node.js 18 or later"))?;
    if node.success() {
        println!("xtask unkey: unkey's SDKs pass against limiterd");
        Ok(())
    } else {
        Err(format!(
            "unkey's SDKs failed against limiterd ({node}); see the FAIL line above"
        ))
    }
}
