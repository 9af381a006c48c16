//! Running commands from the workspace root, echoing them, and failing with a clear message.

use std::path::PathBuf;
use std::process::Command;

/// The workspace root (xtask lives one level below it).
pub(crate) fn root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
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

/// `cargo ARGS` at the workspace root.
pub(crate) fn cargo(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    cargo_in(&root(), args, env)
}
