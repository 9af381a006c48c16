//! `cargo xtask fuzz [--seconds N]`: every fuzz target for N seconds each, on stable
//! (`cargo fuzz run -s none`, no sanitizer), after replaying the committed crashers.

use crate::run::{cargo, cargo_in, root};

/// Fuzz targets in `fuzz/fuzz_targets`.
const TARGETS: &[&str] = &[
    "token_bucket",
    "sliding_window",
    "fixed_window",
    "http_middleware",
    "limiterd_request",
    "limiterd_config",
    "envoy_rules",
    "input_json",
];

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let seconds = match args {
        [] => 60,
        [flag, n] if flag == "--seconds" => n
            .parse::<u64>()
            .map_err(|_| format!("--seconds takes a whole number, not {n:?}"))?,
        _ => {
            return Err(format!(
                "usage: cargo xtask fuzz [--seconds N], not {args:?}"
            ));
        }
    };
    if std::process::Command::new("cargo-fuzz")
        .arg("--version")
        .output()
        .is_err()
    {
        return Err("cargo-fuzz is not installed; run `cargo install cargo-fuzz --locked`".into());
    }
    // Saved crashers are replayed by a plain test first, so a regression fails fast: every
    // crate's `fuzz_regressions`, built as `cargo test --workspace` builds them (the same
    // features, so after the tests nothing is rebuilt).
    cargo(&["test", "--workspace", "--test", "fuzz_regressions"], &[])?;
    let fuzz_dir = root().join("fuzz");
    // Every target built in one cargo run (their own crates compiled and linked side by side),
    // then each run finds its binary built: one `cargo fuzz run` at a time built them one
    // after another.
    cargo_in(&fuzz_dir, &["fuzz", "build", "-s", "none"], &[])?;
    let max_time = format!("-max_total_time={seconds}");
    for target in TARGETS {
        cargo_in(
            &fuzz_dir,
            &["fuzz", "run", "-s", "none", target, "--", &max_time],
            &[],
        )?;
    }
    Ok(())
}
