//! `cargo xtask fuzz [--seconds N]`: every fuzz target for N seconds each, on stable with no
//! sanitizer, after replaying the committed crashers. The targets are built here with the flags
//! `cargo fuzz build -s none` gives (libFuzzer's coverage instrumentation, `--cfg fuzzing`,
//! debug assertions), so neither CI nor a newcomer installs cargo-fuzz (compiling it was three
//! of the fuzz step's five minutes on a 2-core VM); `cargo fuzz run` in `fuzz/` works as well.

use std::path::Path;
use std::process::Command;

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

/// The instrumentation `cargo fuzz build -s none` asks of rustc: libFuzzer's coverage counters
/// and comparison hooks, `cfg(fuzzing)`, and debug assertions (a broken invariant is a crash).
/// One codegen unit, which cargo-fuzz also asks for a faster fuzzer, is left out: a smoke of
/// seconds gains less from it than the build loses.
const RUSTFLAGS: &str = "-Cpasses=sancov-module \
     -Cllvm-args=-sanitizer-coverage-level=4 \
     -Cllvm-args=-sanitizer-coverage-inline-8bit-counters \
     -Cllvm-args=-sanitizer-coverage-pc-table \
     -Cllvm-args=-sanitizer-coverage-trace-compares \
     --cfg fuzzing -Cdebug-assertions";

/// What cargo-fuzz adds on Linux: the deepest stack seen, as a feature.
const LINUX_RUSTFLAGS: &str = " -Cllvm-args=-sanitizer-coverage-stack-depth";

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let seconds = parse_seconds(args)?;
    // Saved crashers are replayed by a plain test first, so a regression fails fast: every
    // crate's `fuzz_regressions`, built as `cargo test --workspace` builds them (the same
    // features, so after the tests nothing is rebuilt).
    cargo(&["test", "--workspace", "--test", "fuzz_regressions"], &[])?;
    let fuzz_dir = root().join("fuzz");
    // Built for the host named as a target, so the flags reach the targets' code but not
    // build scripts or procedural macros (as cargo-fuzz builds); every target in one cargo run.
    let host = host_triple()?;
    let mut flags = RUSTFLAGS.to_owned();
    if host.contains("-linux-") {
        flags.push_str(LINUX_RUSTFLAGS);
    }
    cargo_in(
        &fuzz_dir,
        &["build", "--release", "--target", &host, "--bins"],
        &[("RUSTFLAGS", &flags)],
    )?;
    let binaries = fuzz_dir.join("target").join(&host).join("release");
    for target in TARGETS {
        fuzz_one(&fuzz_dir, &binaries.join(target), target, seconds)?;
    }
    Ok(())
}

/// The seconds each target runs: `--seconds N`, else 60.
fn parse_seconds(args: &[String]) -> Result<u64, String> {
    match args {
        [] => Ok(60),
        [flag, n] if flag == "--seconds" => n
            .parse::<u64>()
            .map_err(|_| format!("--seconds takes a whole number, not {n:?}")),
        _ => Err(format!(
            "usage: cargo xtask fuzz [--seconds N], not {args:?}"
        )),
    }
}

/// The host's target triple, as rustc reports it.
fn host_triple() -> Result<String, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = Command::new(&rustc)
        .arg("-vV")
        .output()
        .map_err(|e| format!("could not run `{rustc} -vV`: {e}"))?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .map(str::to_owned)
        .ok_or_else(|| format!("`{rustc} -vV` named no host triple"))
}

/// Runs the fuzzer `binary` for `seconds` on `target`'s corpus (`fuzz/corpus/TARGET`, which it
/// grows), a crash written to `fuzz/artifacts/TARGET/`: where `cargo fuzz run` keeps them.
fn fuzz_one(fuzz_dir: &Path, binary: &Path, target: &str, seconds: u64) -> Result<(), String> {
    let corpus = fuzz_dir.join("corpus").join(target);
    let artifacts = fuzz_dir.join("artifacts").join(target);
    for dir in [&corpus, &artifacts] {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("could not create {}: {e}", dir.display()))?;
    }
    let mut artifact_prefix = std::ffi::OsString::from("-artifact_prefix=");
    artifact_prefix.push(artifacts);
    artifact_prefix.push("/");
    eprintln!(
        "xtask: $ {} -max_total_time={seconds} fuzz/corpus/{target}",
        binary.display()
    );
    let status = Command::new(binary)
        .arg(artifact_prefix)
        .arg(format!("-max_total_time={seconds}"))
        .arg(&corpus)
        .current_dir(fuzz_dir)
        .status()
        .map_err(|e| format!("could not start {}: {e}", binary.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!(
            "fuzz target {target} failed ({status}); the input is in fuzz/artifacts/{target}/"
        ))
    }
}
