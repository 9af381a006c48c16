//! Running commands from the workspace root, echoing them, and failing with a clear message.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The root of the workspace xtask is run in: the one `cargo xtask` names at run time
/// (`CARGO_MANIFEST_DIR`, xtask's own folder, set by `cargo run`), else the first folder
/// above the current one whose `Cargo.toml` has a `[workspace]` with an `xtask` folder beside
/// it. Never the folder xtask was compiled in: a binary built by another checkout (a shared
/// target directory) still works on this one.
pub(crate) fn root() -> PathBuf {
    root_from(
        std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from),
        std::env::current_dir().ok(),
    )
    .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
}

/// [`root`] from xtask's folder as `cargo run` named it and the current folder.
fn root_from(xtask: Option<PathBuf>, here: Option<PathBuf>) -> Option<PathBuf> {
    let named = xtask
        .and_then(|xtask| xtask.parent().map(Path::to_path_buf))
        .filter(|root| is_workspace(root));
    named.or_else(|| {
        here?
            .ancestors()
            .find(|dir| is_workspace(dir))
            .map(Path::to_path_buf)
    })
}

fn is_workspace(dir: &Path) -> bool {
    dir.join("xtask").is_dir()
        && std::fs::read_to_string(dir.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]"))
}

/// The target directory cargo builds this workspace into: `CARGO_TARGET_DIR` (relative to the
/// workspace) when set, else what `cargo metadata` reports (a `build.target-dir` setting), else
/// `target/` in the workspace.
pub(crate) fn target_dir() -> PathBuf {
    let root = root();
    target_dir_from(&root, std::env::var_os("CARGO_TARGET_DIR"), || {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--no-deps"])
            .current_dir(&root)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .and_then(|o| serde_json::from_slice::<serde_json::Value>(&o.stdout).ok())
            .and_then(|v| v["target_directory"].as_str().map(PathBuf::from))
    })
}

/// [`target_dir`] from the workspace `root`, `CARGO_TARGET_DIR` and what cargo reports.
fn target_dir_from(
    root: &Path,
    env: Option<std::ffi::OsString>,
    reported: impl FnOnce() -> Option<PathBuf>,
) -> PathBuf {
    match env.filter(|d| !d.is_empty()) {
        Some(dir) => root.join(dir),
        None => reported().unwrap_or_else(|| root.join("target")),
    }
}

/// `cargo ARGS` in `dir` with extra environment variables; an error names the failed command.
pub(crate) fn cargo_in(
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    command.args(args).current_dir(dir);
    // What `cargo run` set for xtask itself is not passed on: build scripts that watch one of
    // these (ring's watches `CARGO_MANIFEST_DIR`) would see it change between a plain `cargo
    // test` and the same command from xtask, and rebuild everything above them each time.
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(set_by_cargo_run) {
            command.env_remove(key);
        }
    }
    for (key, value) in env {
        command.env(key, value);
    }
    let shown = env
        .iter()
        .map(|(k, v)| format!("{k}={v} "))
        .collect::<String>()
        + "cargo "
        + &args.join(" ");
    eprintln!("xtask: $ {shown}");
    let status = command
        .status()
        .map_err(|e| format!("could not start `{shown}`: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{shown}` failed ({status})"))
    }
}

/// Whether `name` is an environment variable `cargo run` sets for the package it runs (xtask),
/// which a nested cargo must not inherit.
fn set_by_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
        )
}

/// `cargo ARGS` at the workspace root.
pub(crate) fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    cargo_in(&root(), args, env)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workspace_is_the_one_run_in_not_the_one_compiled_in() {
        let this = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        // Named by cargo at run time.
        let found = root_from(Some(this.join("xtask")), None).expect("found");
        assert!(is_workspace(&found));
        // From a folder inside the workspace.
        let inside = this.join("crates/limiter-core/src");
        assert_eq!(
            root_from(None, Some(inside)).map(|p| p.canonicalize().unwrap()),
            Some(this.canonicalize().unwrap())
        );
        // A name that is no workspace falls to the current folder's.
        let elsewhere = root_from(
            Some(PathBuf::from("/nonexistent/xtask")),
            Some(this.clone()),
        );
        assert_eq!(elsewhere, Some(this.clone()));
        assert_eq!(root_from(None, Some(PathBuf::from("/"))), None);
    }

    #[test]
    fn a_nested_cargo_inherits_nothing_cargo_run_set_for_xtask() {
        for name in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_BIN_NAME",
            "CARGO_CRATE_NAME",
        ] {
            assert!(set_by_cargo_run(name), "{name}");
        }
        // What the user set for every cargo is passed on.
        for name in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_INCREMENTAL",
            "RUSTFLAGS",
        ] {
            assert!(!set_by_cargo_run(name), "{name}");
        }
    }

    #[test]
    fn the_target_directory_follows_cargo_target_dir_then_cargo() {
        let root = Path::new("/work/ws");
        let none = || None;
        assert_eq!(target_dir_from(root, None, none), root.join("target"));
        assert_eq!(
            target_dir_from(root, Some("/tmp/shared".into()), none),
            PathBuf::from("/tmp/shared")
        );
        assert_eq!(
            target_dir_from(root, Some("out".into()), none),
            root.join("out")
        );
        assert_eq!(
            target_dir_from(root, None, || Some(PathBuf::from("/cfg/target"))),
            PathBuf::from("/cfg/target")
        );
    }
}
