//! `cargo xtask TASK`: dispatches to one module per task. No dependencies, so it builds fast.

mod bench;
mod browser;
mod ci;
mod daemon;
mod functions;
mod fuzz;
mod guides;
mod invariants;
mod loom;
mod run;
mod unkey;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <task> [options]

tasks:
  ci                     fmt --check, clippy -D warnings, tests, rustdoc with broken links denied
  lint                   the same without the tests (.ci/run runs README's test command itself)
  loom                   the loom models of every atomic protocol (release, --cfg limiter_loom)
  fuzz [--seconds N]     every fuzz target for N seconds each (default 60)
  browser                limiterd's status page in headless Chromium (Debian's `chromium`)
  unkey                  unkey's published SDKs (npm, pinned) driving limiterd's v2 API
  bench [--quick] [-- ARGS]  the criterion benchmarks and target/bench-report.md (ratios to governor
                         and the floor, bytes per key, the targets); ARGS go to criterion";

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let task = args.next();
    let rest: Vec<String> = args.collect();
    let result = match task.as_deref() {
        Some("ci") => ci::run(),
        Some("lint") => ci::lint(),
        Some("loom") => loom::run(),
        Some("fuzz") => fuzz::run(&rest),
        Some("bench") => bench::run(&rest),
        Some("browser") => browser::run(),
        Some("unkey") => unkey::run(),
        Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        _ => Err(format!("unknown or missing task\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}
