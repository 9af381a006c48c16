//! `cargo xtask bench [-- ARGS]`: the criterion benchmarks, with ARGS passed to criterion.

use crate::run::cargo;

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let mut command = vec!["bench", "--package", "limiter-benches"];
    let passthrough: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--")
        .collect();
    if !passthrough.is_empty() {
        command.push("--");
        command.extend(passthrough);
    }
    cargo(&command, &[])
}
