//! `cargo xtask bench [--quick] [--reps N] [-- ARGS]`: the criterion benchmarks (ARGS go to
//! criterion, e.g. a name filter), then `target/bench-report.md`: for every group measured in
//! this run, each subject's median and throughput with its ratio to the peer (governor, or the
//! raw `EVALSHA` for Redis) and to the floor measured in the same group; the resident bytes per
//! key; and the performance targets, each met or missed.
//!
//! The machines this runs on are noisy, so the groups the targets read are measured `N` times
//! (3 by default), interleaved: one pass of everything, then `N - 1` passes of those groups
//! alone. Each target's ratio is reported as the median over the passes with its spread
//! (min–max), and a target is met only when the whole spread is within it.
//!
//! The `redis_server` bench (its own passes, 3 by default) adds what a decision costs Redis:
//! µs of server CPU per decision from `INFO commandstats`, beside the floors measured in the
//! same run (a bare `INCR`, a `GET` + `SET PX` script, envoy's `INCRBY` + `EXPIRE`); its
//! targets are ratios to the `GET` + `SET PX` script, with their spread over those passes.
//!
//! `--quick` measures every group briefly (the run takes a few minutes once built; the
//! medians are noisier).
//!
//! The run and its passes are here; what criterion and the benches wrote is read in
//! `results.rs`, the targets in `targets.rs`, the report written in `report.rs`.

mod report;
mod results;
mod targets;

use std::time::SystemTime;

use crate::run::cargo;
use report::render;
use results::{Readings, collect, csv_values, server_passes};

/// The groups the targets read, as a criterion filter: the passes after the first repeat these.
const TARGET_GROUPS: &str = "^(direct_allow_1_thread|direct_allow_2_threads|direct_deny_2_threads|keyed_hot_key|keyed_1M_keys_warm|stack|tower_axum|redis/sequential|redis/in_flight_50|redis/in_flight_50_latency|redis/leased)/";

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut reps = 3usize;
    let mut passthrough: Vec<&str> = Vec::new();
    let mut rest = args.iter().map(String::as_str);
    while let Some(arg) = rest.next() {
        match arg {
            "--quick" | "--" => {}
            "--reps" => {
                reps = rest
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|&n| n >= 1)
                    .ok_or("--reps takes a number of passes, 1 or more (e.g. --reps 3)")?;
            }
            other => passthrough.push(other),
        }
    }
    let target = crate::run::target_dir();
    let mut passes = Vec::new();
    let mut readings = Readings::default();
    for pass in 0..reps {
        // The first pass measures everything asked for; the others the targets' groups.
        let filter: Vec<&str> = if pass == 0 {
            passthrough.clone()
        } else {
            vec![TARGET_GROUPS]
        };
        let started = SystemTime::now();
        bench_pass(&filter, quick)?;
        let results = collect(&target.join("criterion"), started);
        if pass == 0 {
            if results.is_empty() {
                return Err(format!(
                    "no criterion results from this run under {}",
                    target.join("criterion").display()
                ));
            }
            readings = Readings {
                memory: csv_values(&target.join("bench-bytes-per-key.csv"), started, 2),
                counts: csv_values(&target.join("bench-counts.csv"), started, 1),
                server: server_passes(&target.join("bench-redis-server.csv"), started),
            };
        }
        passes.push(results);
    }
    let report = render(&passes, &readings, quick);
    let path = target.join("bench-report.md");
    std::fs::write(&path, report).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}

/// One `cargo bench` pass with `criterion_args` (a filter, say).
fn bench_pass(criterion_args: &[&str], quick: bool) -> Result<(), String> {
    let mut command = vec!["bench", "--package", "limiter-benches"];
    let mut criterion_args = criterion_args.to_vec();
    if quick {
        // Groups that set no times of their own (the Redis ones) take these.
        criterion_args.extend(["--warm-up-time", "0.1", "--measurement-time", "0.3"]);
    }
    if !criterion_args.is_empty() {
        command.push("--");
        command.extend(criterion_args);
    }
    // The benches write what they count beside criterion's results, in this target directory.
    let target = crate::run::target_dir();
    let target = target.to_string_lossy();
    let mut env = vec![("LIMITER_BENCH_TARGET", target.as_ref())];
    if quick {
        env.push(("LIMITER_BENCH_QUICK", "1"));
    }
    cargo(&command, &env)
}
