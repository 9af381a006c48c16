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

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::run::cargo;

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

/// One benchmark's median.
#[derive(Debug, Clone)]
struct Measured {
    group: String,
    function: String,
    /// Nanoseconds per iteration.
    median: f64,
    /// Calls per iteration (2 for the two-thread groups).
    elements: u64,
}

fn files_named(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_named(&path, name, out);
        } else if path.file_name().is_some_and(|n| n == name)
            && path
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|p| p == "new")
        {
            out.push(path);
        }
    }
}

/// What the report reads of one benchmark's criterion files: its group and function (from
/// `benchmark.json`), the median's point estimate (from `estimates.json`, in ns) and the
/// elements per iteration (`throughput.Elements`, 1 when absent).
fn parse_criterion(meta: &str, estimates: &str) -> Option<Measured> {
    let meta: serde_json::Value = serde_json::from_str(meta).ok()?;
    let estimates: serde_json::Value = serde_json::from_str(estimates).ok()?;
    Some(Measured {
        group: meta["group_id"].as_str()?.to_owned(),
        function: meta["function_id"].as_str().unwrap_or_default().to_owned(),
        median: estimates["median"]["point_estimate"].as_f64()?,
        elements: meta["throughput"]["Elements"].as_u64().unwrap_or(1),
    })
}

fn collect(dir: &Path, since: SystemTime) -> Vec<Measured> {
    let mut found = Vec::new();
    files_named(dir, "estimates.json", &mut found);
    let mut out = Vec::new();
    for estimates in found {
        let fresh = std::fs::metadata(&estimates)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= since);
        if !fresh {
            continue;
        }
        let (Ok(est), Ok(meta)) = (
            std::fs::read_to_string(&estimates),
            std::fs::read_to_string(estimates.with_file_name("benchmark.json")),
        ) else {
            continue;
        };
        if let Some(measured) = parse_criterion(&meta, &est) {
            out.push(measured);
        }
    }
    out.sort_by(|a, b| (&a.group, &a.function).cmp(&(&b.group, &b.function)));
    out
}

/// What the benchmarks write beside criterion's results, read from the first pass.
#[derive(Default)]
struct Readings {
    /// `name -> resident bytes per key` (`target/bench-bytes-per-key.csv`).
    memory: BTreeMap<String, f64>,
    /// `name -> a count per decision`, such as script calls (`target/bench-counts.csv`).
    counts: BTreeMap<String, f64>,
    /// Per pass of the `redis_server` bench: `subject -> µs of Redis CPU per decision`
    /// (`target/bench-redis-server.csv`).
    server: Vec<BTreeMap<String, f64>>,
}

/// The `redis_server` bench's passes (`subject,pass,µs` lines), if written during this run.
fn server_passes(csv: &Path, since: SystemTime) -> Vec<BTreeMap<String, f64>> {
    let fresh = std::fs::metadata(csv)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since);
    let mut passes: BTreeMap<usize, BTreeMap<String, f64>> = BTreeMap::new();
    if !fresh {
        return Vec::new();
    }
    for line in std::fs::read_to_string(csv).unwrap_or_default().lines() {
        let mut fields = line.split(',');
        if let (Some(subject), Some(Ok(pass)), Some(Ok(usec))) = (
            fields.next(),
            fields.next().map(str::parse::<usize>),
            fields.next().map(str::parse::<f64>),
        ) {
            passes
                .entry(pass)
                .or_default()
                .insert(subject.to_owned(), usec);
        }
    }
    passes.into_values().collect()
}

/// `name -> value` (the value is the line's `column`th comma-separated field after the
/// name's), the last line for each name written during this run.
fn csv_values(csv: &Path, since: SystemTime, column: usize) -> BTreeMap<String, f64> {
    let fresh = std::fs::metadata(csv)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since);
    let mut out = BTreeMap::new();
    if !fresh {
        return out;
    }
    let text = std::fs::read_to_string(csv).unwrap_or_default();
    for line in text.lines() {
        let mut parts = line.split(',');
        if let (Some(name), Some(value)) = (parts.next(), parts.nth(column - 1))
            && let Ok(value) = value.parse::<f64>()
        {
            out.insert(name.to_owned(), value);
        }
    }
    out
}

/// The subject a group's others are compared with, and its floor.
fn peer_of(group: &[&Measured]) -> Option<&'static str> {
    ["governor", "governor_1", "raw_evalsha"]
        .into_iter()
        .find(|p| group.iter().any(|m| m.function == *p))
}

fn find<'a>(results: &'a [Measured], group: &str, function: &str) -> Option<&'a Measured> {
    results
        .iter()
        .find(|m| m.group == group && m.function == function)
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    format!("{cpus} CPUs ({model}), {}", rustc.trim())
}

fn time(ns: f64) -> String {
    if ns >= 1_000_000.0 {
        format!("{:.2} ms", ns / 1_000_000.0)
    } else if ns >= 1_000.0 {
        format!("{:.2} µs", ns / 1_000.0)
    } else {
        format!("{ns:.1} ns")
    }
}

fn rate(per_second: f64) -> String {
    if per_second >= 1e6 {
        format!("{:.1} M/s", per_second / 1e6)
    } else if per_second >= 1e3 {
        format!("{:.1} k/s", per_second / 1e3)
    } else {
        format!("{per_second:.0} /s")
    }
}

/// A target: its statement, the measured ratio (or value) in one pass, and whether a value
/// holds.
struct Target {
    what: &'static str,
    measured: Measure,
    holds: fn(f64) -> bool,
    unit: &'static str,
}

/// Where a target's value comes from.
enum Measure {
    /// Each criterion pass (with what the benches wrote beside it).
    Pass(fn(&[Measured], &Readings) -> Option<f64>),
    /// Each pass of the `redis_server` bench (µs of Redis CPU per decision, by subject).
    Server(fn(&BTreeMap<String, f64>) -> Option<f64>),
}

impl Target {
    /// The target's value in every pass that measured it.
    fn values(&self, passes: &[Vec<Measured>], readings: &Readings) -> Vec<f64> {
        match self.measured {
            Measure::Pass(f) => passes.iter().filter_map(|p| f(p, readings)).collect(),
            Measure::Server(f) => readings.server.iter().filter_map(f).collect(),
        }
    }
}

/// limiterd's throughput for `subject` over its HTTP floor's (`GET /healthz`), one pass.
fn throughput_ratio(results: &[Measured], subject: &str) -> Option<f64> {
    Some(find(results, "limiterd", "floor")?.median / find(results, "limiterd", subject)?.median)
}

/// Redis CPU per decision of `ours` over `floor`'s, in one `redis_server` pass.
fn server_ratio(pass: &BTreeMap<String, f64>, ours: &str, floor: &str) -> Option<f64> {
    Some(pass.get(ours)? / pass.get(floor)?)
}

fn ratio(results: &[Measured], group: &str, ours: &str, theirs: &str) -> Option<f64> {
    Some(find(results, group, ours)?.median / find(results, group, theirs)?.median)
}

/// The targets, every one on what a user gets by naming nothing: the default clock, store and
/// features.
fn targets() -> Vec<Target> {
    vec![
        Target {
            what: "Direct allow, 1 thread: token bucket time ≤ 1.0× governor's",
            measured: Measure::Pass(|r, _| {
                ratio(r, "direct_allow_1_thread", "token_bucket", "governor")
            }),
            holds: |r| r <= 1.0,
            unit: "×",
        },
        Target {
            what: "Direct allow, 1 thread: token bucket time ≤ 1.05× the floor in the same group (clock, load, compare-exchange)",
            measured: Measure::Pass(|r, _| {
                ratio(r, "direct_allow_1_thread", "token_bucket", "floor")
            }),
            holds: |r| r <= 1.05,
            unit: "×",
        },
        Target {
            what: "Direct allow, 2 threads: token bucket throughput ≥ 1.3× governor's",
            measured: Measure::Pass(|r, _| {
                ratio(r, "direct_allow_2_threads", "governor", "token_bucket")
            }),
            holds: |r| r >= 1.3,
            unit: "×",
        },
        Target {
            what: "Direct deny, 2 threads: token bucket throughput ≥ 1.0× governor's",
            measured: Measure::Pass(|r, _| {
                ratio(r, "direct_deny_2_threads", "governor", "token_bucket")
            }),
            holds: |r| r >= 1.0,
            unit: "×",
        },
        Target {
            what: "Direct allow, 1 thread: token bucket time ≤ 1.0× the `ratelimit` crate's",
            measured: Measure::Pass(|r, _| {
                ratio(r, "direct_allow_1_thread", "token_bucket", "ratelimit")
            }),
            holds: |r| r <= 1.0,
            unit: "×",
        },
        Target {
            what: "Keyed, 1M keys warm: default store time at the floor (≤ 1.1× one map lookup and a compare-exchange in the same group; the lookup's cache misses are the cost, for governor too)",
            measured: Measure::Pass(|r, _| {
                ratio(r, "keyed_1M_keys_warm", "token_bucket_sharded", "floor")
            }),
            holds: |r| r <= 1.1,
            unit: "×",
        },
        Target {
            what: "Keyed, hot key: default store time ≤ 1.0× governor's",
            measured: Measure::Pass(|r, _| {
                ratio(r, "keyed_hot_key", "token_bucket_sharded", "governor")
            }),
            holds: |r| r <= 1.0,
            unit: "×",
        },
        Target {
            what: "Concurrency, hot key: a permit's acquire and release ≤ 2.0× one keyed check",
            measured: Measure::Pass(|r, _| {
                ratio(
                    r,
                    "keyed_hot_key",
                    "concurrency_acquire_release",
                    "token_bucket_sharded",
                )
            }),
            holds: |r| r <= 2.0,
            unit: "×",
        },
        Target {
            what: "Concurrency in a stack: a rate layer and a permit ≤ 1.0× two rate layers",
            measured: Measure::Pass(|r, _| ratio(r, "stack", "stack_1_and_permit", "stack_2")),
            holds: |r| r <= 1.0,
            unit: "×",
        },
        Target {
            what: "Memory: token bucket in the default store ≤ 36 B/key at 1M keys",
            measured: Measure::Pass(|_, x| x.memory.get("keyed_token_bucket_sharded").copied()),
            holds: |b| b <= 36.0,
            unit: " B",
        },
        Target {
            what: "Stack of 3 layers, two on one key and a global one: time ≤ 1.5× one keyed check",
            measured: Measure::Pass(|r, _| ratio(r, "stack", "stack_3_one_key", "one_check")),
            holds: |r| r <= 1.5,
            unit: "×",
        },
        Target {
            what: "Stack of 3 layers on different keys (two keys and a global one): time ≤ 2.0× one keyed check",
            measured: Measure::Pass(|r, _| ratio(r, "stack", "stack_3", "one_check")),
            holds: |r| r <= 2.0,
            unit: "×",
        },
        Target {
            what: "HTTP layer on an axum router, headers off: overhead ≤ 1.0× tower_governor's",
            measured: Measure::Pass(|r, _| {
                let over = |f: &str| over_router(r, f);
                Some(over("ours_no_headers")? / over("tower_governor")?)
            }),
            holds: |r| r <= 1.0,
            unit: "×",
        },
        Target {
            what: "HTTP layer: IETF headers add ≤ 100 ns to the layer without headers",
            measured: Measure::Pass(|r, _| {
                let median = |f: &str| Some(find(r, "tower_axum", f)?.median);
                Some(median("ours_ietf_headers")? - median("ours_no_headers")?)
            }),
            holds: |ns| ns <= 100.0,
            unit: " ns",
        },
        Target {
            what: "Redis, 50 in flight on one connection: throughput ≥ 3× the raw per-decision `EVALSHA`",
            measured: Measure::Pass(|r, _| {
                ratio(r, "redis/in_flight_50", "raw_evalsha", "limiter_1_limit")
            }),
            holds: |r| r >= 3.0,
            unit: "×",
        },
        Target {
            what: "Redis, 50 in flight: median latency ≤ 1.2× the raw `EVALSHA`'s",
            measured: Measure::Pass(|r, _| {
                ratio(
                    r,
                    "redis/in_flight_50_latency",
                    "limiter_1_limit",
                    "raw_evalsha",
                )
            }),
            holds: |r| r <= 1.2,
            unit: "×",
        },
        Target {
            what: "Redis, sequential: decision latency ≤ 1.05× the raw `EVALSHA`'s",
            measured: Measure::Pass(|r, _| {
                ratio(r, "redis/sequential", "limiter_1_limit", "raw_evalsha")
            }),
            holds: |r| r <= 1.05,
            unit: "×",
        },
        Target {
            what: "Redis, leased (slack 1% of the limit): a hot key's decision ≤ 2× an in-process keyed check",
            measured: Measure::Pass(|r, _| {
                ratio(r, "redis/leased", "leased_hot_key", "in_process_keyed")
            }),
            holds: |r| r <= 2.0,
            unit: "×",
        },
        Target {
            what: "Redis, leased (slack 10,000 units, 0.001% of the limit): a hot key's decision ≤ 2× an in-process keyed check",
            measured: Measure::Pass(|r, _| {
                ratio(
                    r,
                    "redis/leased",
                    "leased_hot_key_slack_10k",
                    "in_process_keyed",
                )
            }),
            holds: |r| r <= 2.0,
            unit: "×",
        },
        Target {
            what: "Redis, leased (slack 10,000 units): ≤ 1 script call per 100 hot-key decisions (decisions per call)",
            measured: Measure::Pass(|_, x| {
                x.counts
                    .get("leased_hot_key_slack_10k_calls_per_decision")
                    .map(|calls| 1.0 / calls)
            }),
            holds: |n| n >= 100.0,
            unit: "",
        },
        Target {
            what: "Redis, sequential: a 3-layer stack ≤ 1.2× one decision",
            measured: Measure::Pass(|r, _| {
                ratio(r, "redis/sequential", "stack_3_layers", "limiter_1_limit")
            }),
            holds: |r| r <= 1.2,
            unit: "×",
        },
        Target {
            what: "Redis CPU per decision (commandstats), one limit, token bucket: ≤ 1.5× a `GET` + `SET PX` script's",
            measured: Measure::Server(|p| {
                server_ratio(p, "one_limit_token_bucket", "floor_get_set_px")
            }),
            holds: |r| r <= 1.5,
            unit: "×",
        },
        Target {
            what: "Redis CPU per decision, one limit, fixed window: ≤ 1.5× a `GET` + `SET PX` script's",
            measured: Measure::Server(|p| {
                server_ratio(p, "one_limit_fixed_window", "floor_get_set_px")
            }),
            holds: |r| r <= 1.5,
            unit: "×",
        },
        Target {
            what: "Redis CPU per decision, one limit, sliding window: ≤ 1.5× a `GET` + `SET PX` script's",
            measured: Measure::Server(|p| {
                server_ratio(p, "one_limit_sliding_window", "floor_get_set_px")
            }),
            holds: |r| r <= 1.5,
            unit: "×",
        },
        Target {
            what: "Redis CPU per decision, a policy of three limits: ≤ 3× a `GET` + `SET PX` script's",
            measured: Measure::Server(|p| server_ratio(p, "stack_3_limits", "floor_get_set_px")),
            holds: |r| r <= 3.0,
            unit: "×",
        },
        Target {
            what: "Redis CPU per decision, 16 callers coalesced: ≤ 0.5× a `GET` + `SET PX` script's",
            measured: Measure::Server(|p| server_ratio(p, "coalesced_16", "floor_get_set_px")),
            holds: |r| r <= 0.5,
            unit: "×",
        },
        Target {
            what: "limiterd `POST /v1/ratelimit`, a configured policy over 100,000 identifiers: ≥ 0.85× `GET /healthz`'s throughput",
            measured: Measure::Pass(|r, _| throughput_ratio(r, "http_policy_rotating")),
            holds: |r| r >= 0.85,
            unit: "×",
        },
        Target {
            what: "limiterd `POST /v1/ratelimit`, an ad-hoc limit over 100,000 identifiers: ≥ 0.85× `GET /healthz`'s throughput",
            measured: Measure::Pass(|r, _| throughput_ratio(r, "http_adhoc_rotating")),
            holds: |r| r >= 0.85,
            unit: "×",
        },
        Target {
            what: "Redis CPU per decision, a three-master cluster coalesced per master (16 callers on each): ≤ 1.1× one server's (16 callers)",
            measured: Measure::Server(|p| server_ratio(p, "cluster_coalesced_16", "coalesced_16")),
            holds: |r| r <= 1.1,
            unit: "×",
        },
        Target {
            what: "Redis CPU per decision, a denial: ≤ 1.0× an admitted one-limit decision's",
            measured: Measure::Server(|p| {
                server_ratio(p, "denied_1_limit", "one_limit_token_bucket")
            }),
            holds: |r| r <= 1.0,
            unit: "×",
        },
    ]
}

/// What a decision costs Redis, from the `redis_server` bench: each subject's µs of server CPU
/// per decision (the median over its passes), against the `GET` + `SET PX` script, and the
/// decisions one Redis core serves at that cost.
fn server_context(readings: &Readings) -> Vec<(String, f64, f64, f64)> {
    let mut subjects: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for pass in &readings.server {
        for (subject, usec) in pass {
            subjects.entry(subject).or_default().push(*usec);
        }
    }
    let floor = subjects
        .get("floor_get_set_px")
        .and_then(|v| spread(v.clone()))
        .map(|(median, ..)| median);
    subjects
        .into_iter()
        // Wall-clock rows are not CPU: the WAIT line reports them.
        .filter(|(subject, _)| !subject.starts_with("wall_"))
        .filter_map(|(subject, values)| {
            let (median, ..) = spread(values)?;
            let ratio = floor.map_or(f64::NAN, |f| median / f);
            Some((subject.to_owned(), median, ratio, 1e6 / median))
        })
        .collect()
}

/// The wall-clock µs of one decision after another without and with waiting for a replica
/// (medians over the `redis_server` passes).
fn wait_cost(readings: &Readings) -> Option<(f64, f64)> {
    let median = |subject: &str| {
        spread(
            readings
                .server
                .iter()
                .filter_map(|p| p.get(subject).copied())
                .collect(),
        )
        .map(|(m, ..)| m)
    };
    Some((median("wall_one_limit")?, median("wall_wait_1_replica")?))
}

/// What a layer adds to the bare axum router, in ns (the `tower_axum` group).
fn over_router(results: &[Measured], layered: &str) -> Option<f64> {
    Some(
        find(results, "tower_axum", layered)?.median
            - find(results, "tower_axum", "bare_router")?.median,
    )
}

/// A target's values over the passes that measured it: (median, min, max, passes).
fn spread(mut values: Vec<f64>) -> Option<(f64, f64, f64, usize)> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    let median = if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    };
    Some((median, values[0], values[n - 1], n))
}

/// What explains the stack target: how much of one check and of a 3-layer transaction is
/// synchronisation alone (a clock reading, shard read locks taken and released, uncontended
/// compare-exchanges, each measured on its own in the same group; parts measured alone
/// overlap less than in a call, so their sum can exceed the call), what the target leaves
/// beyond the transaction's measured floor and what the stack spends there, and what the same
/// three checks cost without a transaction. Each row is a label, its value (absent when a row
/// it needs was not measured) and its unit.
fn stack_context(results: &[Measured]) -> Vec<(&'static str, Option<f64>, &'static str)> {
    let median = |f: &str| Some(find(results, "stack", f)?.median);
    let ratio = |ours: &str, theirs: &str| Some(median(ours)? / median(theirs)?);
    // A clock reading, `locks` shard read locks and `exchanges` compare-exchanges.
    let sync = |locks: f64, exchanges: f64| {
        Some(median("clock")? + locks * median("read_lock")? + exchanges * median("cas")?)
    };
    let one_check = median("one_check");
    let transaction_sync = sync(2.0, 3.0);
    vec![
        (
            "One check / its synchronisation alone (clock, 1 shard read lock, 1 compare-exchange)",
            one_check.zip(sync(1.0, 1.0)).map(|(one, sync)| one / sync),
            "×",
        ),
        (
            "Floor of a 3-layer transaction locking each entry (clock, 2 locked lookups, 3 entry locks) / one check",
            ratio("floor", "one_check"),
            "×",
        ),
        (
            "The floor's synchronisation alone (clock, 2 shard read locks, 3 compare-exchanges) / one check",
            transaction_sync
                .zip(one_check)
                .map(|(sync, one)| sync / one),
            "×",
        ),
        (
            "Left at the target beyond the floor, for deciding three limits and the answer (2.0 × one check − the floor)",
            one_check
                .zip(median("floor"))
                .map(|(one, floor)| 2.0 * one - floor),
            " ns",
        ),
        (
            "What a stack of 3 spends beyond the floor (stack of 3 − the floor)",
            median("stack_3")
                .zip(median("floor"))
                .map(|(stack, floor)| stack - floor),
            " ns",
        ),
        (
            "The floor deciding every limit (static dispatch), answers as they come / one check",
            ratio("floor_deciding", "one_check"),
            "×",
        ),
        ("Stack of 3 / the floor", ratio("stack_3", "floor"), "×"),
        (
            "A sketch of the stack's lean path typed at compile time (each entry locked; keyers and limits as type parameters; answers as they come) / one check",
            ratio("typed_sketch", "one_check"),
            "×",
        ),
        (
            "Stack of 3 / the typed sketch (run-time layers and the answer, less what the commit lock saves)",
            ratio("stack_3", "typed_sketch"),
            "×",
        ),
        (
            "Stack of 3 / our three limiters checked in sequence, no transaction",
            ratio("stack_3", "ours_3_in_sequence"),
            "×",
        ),
        (
            "Stack of 3 / a stack of 1",
            ratio("stack_3", "stack_1"),
            "×",
        ),
        (
            "One check with its whole answer read / one check (the target's subject reads only the admission, and an inlined check computes only that)",
            ratio("one_check_answer", "one_check"),
            "×",
        ),
        (
            "Stack of 3 on one key (one lookup) / one check with its whole answer read",
            ratio("stack_3_one_key", "one_check_answer"),
            "×",
        ),
        (
            "Stack of 3 on one key / a stack of 1",
            ratio("stack_3_one_key", "stack_1"),
            "×",
        ),
    ]
}

/// limiterd over loopback, from the `limiterd` group: each way of asking for a decision
/// against the HTTP floor (`GET /healthz` on the same kind of connection), and envoy's gRPC
/// decisions per second on one connection.
fn service_context(results: &[Measured]) -> Vec<(&'static str, Option<f64>, &'static str)> {
    let median = |f: &str| Some(find(results, "limiterd", f)?.median);
    let ratio = |ours: &str| Some(median(ours)? / median("floor")?);
    vec![
        (
            "gRPC `ShouldRateLimit` (one descriptor) / the HTTP floor",
            ratio("grpc_should_rate_limit"),
            "×",
        ),
        (
            "`POST /json` (the same request as JSON) / the HTTP floor",
            ratio("json_decision"),
            "×",
        ),
        (
            "`POST /v1/ratelimit` / the HTTP floor",
            ratio("http_decision"),
            "×",
        ),
        (
            "gRPC `ShouldRateLimit` decisions per second, one connection, one at a time",
            median("grpc_should_rate_limit").map(|ns| 1e9 / ns),
            " /s",
        ),
        (
            "The HTTP floor: `GET /healthz` per second, one connection, one at a time",
            median("floor").map(|ns| 1e9 / ns),
            " /s",
        ),
    ]
}

fn render(passes: &[Vec<Measured>], readings: &Readings, quick: bool) -> String {
    let memory = &readings.memory;
    let results: &[Measured] = passes.first().map_or(&[], Vec::as_slice);
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmark report\n");
    let _ = writeln!(
        out,
        "`cargo xtask bench{}` on {}. {}\n",
        if quick { " --quick" } else { "" },
        machine(),
        if quick {
            "Quick mode: short samples, noisier medians."
        } else {
            "Full mode."
        }
    );
    let _ = writeln!(
        out,
        "Medians per iteration. An iteration is one call, except in the `2_threads` groups, \
         where it is one call on each of two threads (the slower thread's time), so throughput \
         there is the aggregate. Ratios divide this subject's time by the peer's or the floor's \
         from the same group and run: below 1 is faster. The peer is governor (or the raw \
         `EVALSHA` for Redis); the floor is the least any implementation must do (a clock \
         reading, an atomic load and a compare-exchange; a map lookup first when keyed; for the \
         3-layer stack, a clock reading, two lookups under shard read locks and three entry \
         locks, each released after a write: the floor of a commit that locks each entry, where \
         a stack with a global layer takes that layer's lock alone).\n"
    );
    let _ = writeln!(
        out,
        "## Targets\n\nOn the defaults a user gets (default clock, store and features). Each \
         ratio is the median over the passes that measured it, with its spread (min–max); a \
         target is met only when the whole spread is within it.\n\n\
         | target | median | spread | passes | met |\n| --- | --- | --- | --- | --- |"
    );
    for t in targets() {
        let line = match spread(t.values(passes, readings)) {
            Some((median, low, high, n)) => {
                let met = if (t.holds)(low) && (t.holds)(high) {
                    "yes"
                } else {
                    "**no**"
                };
                format!(
                    "| {} | {median:.2}{u} | {low:.2}–{high:.2}{u} | {n} | {met} |",
                    t.what,
                    u = t.unit
                )
            }
            None => format!("| {} | not measured in this run | — | 0 | — |", t.what),
        };
        let _ = writeln!(out, "{line}");
    }
    let context: Vec<_> = stack_context(results)
        .into_iter()
        .filter_map(|(what, value, unit)| Some((what, value?, unit)))
        .collect();
    if !context.is_empty() {
        out.push_str("\nWhat bounds the stack target:\n\n| quantity | measured |\n| --- | --- |\n");
        for (what, value, unit) in context {
            let _ = writeln!(out, "| {what} | {value:.2}{unit} |");
        }
    }
    let server = server_context(readings);
    if !server.is_empty() {
        out.push_str(
            "\nWhat a decision costs Redis (`redis_server`: µs of server CPU per decision from \
             `INFO commandstats`, median over its passes; 2,000 keys; the floors beside ours):\n\n\
             | subject | µs per decision | × `GET` + `SET PX` | decisions/s per Redis core |\n\
             | --- | --- | --- | --- |\n",
        );
        for (subject, usec, ratio, per_core) in server {
            let _ = writeln!(
                out,
                "| {subject} | {usec:.2} | {ratio:.2} | {} |",
                rate(per_core)
            );
        }
        if let Some((plain, waiting)) = wait_cost(readings) {
            let _ = writeln!(
                out,
                "\nWaiting for one replica (`wait_for_replicas`, one decision after another): \
                 {waiting:.1} µs a decision against {plain:.1} without, +{:.1} µs of wall-clock \
                 time (`wait_1_replica` above is its Redis CPU).",
                waiting - plain
            );
        }
    }
    let service: Vec<_> = service_context(results)
        .into_iter()
        .filter_map(|(what, value, unit)| Some((what, value?, unit)))
        .collect();
    if !service.is_empty() {
        out.push_str(
            "\nlimiterd over loopback sockets (one connection, one request at a time; the \
             floor is `GET /healthz`):\n\n| quantity | measured |\n| --- | --- |\n",
        );
        for (what, value, unit) in service {
            let _ = writeln!(out, "| {what} | {value:.2}{unit} |");
        }
    }
    let mut groups: BTreeMap<&str, Vec<&Measured>> = BTreeMap::new();
    for m in results {
        groups.entry(m.group.as_str()).or_default().push(m);
    }
    for (name, members) in &groups {
        let peer = peer_of(members);
        let median_of = |f: &str| members.iter().find(|m| m.function == f).map(|m| m.median);
        let peer_median = peer.and_then(median_of);
        let floor_median = median_of("floor");
        let _ = writeln!(
            out,
            "\n## {name}\n\n| subject | median | throughput | × {} | × floor |\n| --- | --- | --- | --- | --- |",
            peer.unwrap_or("peer")
        );
        for m in members {
            let per_second = m.elements as f64 / m.median * 1e9;
            let vs =
                |other: Option<f64>| other.map_or("—".into(), |o| format!("{:.2}", m.median / o));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                m.function,
                time(m.median),
                rate(per_second),
                vs(peer_median),
                vs(floor_median)
            );
        }
    }
    if !memory.is_empty() {
        out.push_str("\n## Resident bytes per key at 1M keys\n\n| subject | B/key | × governor |\n| --- | --- | --- |\n");
        let governor = memory.get("keyed_governor").copied();
        for (name, per_key) in memory {
            let vs = governor.map_or("—".into(), |g| format!("{:.2}", per_key / g));
            let _ = writeln!(out, "| {name} | {per_key:.1} | {vs} |");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_rows_compare_with_the_http_floor() {
        let measured = |function: &str, median: f64| Measured {
            group: "limiterd".into(),
            function: function.into(),
            median,
            elements: 1,
        };
        let results = vec![
            measured("floor", 20_000.0),
            measured("grpc_should_rate_limit", 50_000.0),
        ];
        let report = render(&[results], &Readings::default(), true);
        assert!(
            report.contains("| gRPC `ShouldRateLimit` (one descriptor) / the HTTP floor | 2.50× |"),
            "{report}"
        );
        assert!(
            report.contains("one connection, one at a time | 20000.00 /s |"),
            "{report}"
        );
        // Rows whose subject was not measured are left out.
        assert!(!report.contains("`POST /json`"), "{report}");
    }

    #[test]
    fn server_targets_take_their_spread_from_the_redis_server_passes() {
        let pass = |bucket: f64| {
            [
                ("floor_get_set_px", 4.0),
                ("one_limit_token_bucket", bucket),
                ("coalesced_16", 1.0),
            ]
            .into_iter()
            .map(|(s, v)| (s.to_owned(), v))
            .collect()
        };
        let readings = Readings {
            server: vec![pass(5.0), pass(6.4), pass(5.6)],
            ..Readings::default()
        };
        let report = render(&[], &readings, false);
        // 5.6 / 4 is the median; 6.4 / 4 = 1.6 is past 1.5 in one pass: not met.
        assert!(
            report.contains("token bucket: ≤ 1.5× a `GET` + `SET PX` script's | 1.40× | 1.25–1.60× | 3 | **no** |"),
            "{report}"
        );
        assert!(
            report.contains("16 callers coalesced: ≤ 0.5× a `GET` + `SET PX` script's | 0.25× | 0.25–0.25× | 3 | yes |"),
            "{report}"
        );
        assert!(
            report.contains("| one_limit_token_bucket | 5.60 | 1.40 | 178.6 k/s |"),
            "{report}"
        );
        assert!(
            report.contains(
                "a policy of three limits: ≤ 3× a `GET` + `SET PX` script's | not measured"
            )
        );
    }

    #[test]
    fn reads_criterion_json_and_renders_ratios() {
        let meta = r#"{"group_id":"direct_allow_1_thread","function_id":"token_bucket","value_str":null,"throughput":{"Elements":2},"full_id":"x"}"#;
        let est = r#"{"mean":{"point_estimate":99.0},"median":{"confidence_interval":{"lower_bound":1.0},"point_estimate":12.5,"standard_error":0.1}}"#;
        let parsed = parse_criterion(meta, est).expect("criterion's files");
        assert_eq!(parsed.group, "direct_allow_1_thread");
        assert_eq!(parsed.function, "token_bucket");
        assert_eq!((parsed.median, parsed.elements), (12.5, 2));
        // No throughput: one element; a missing median: not measured.
        let plain = parse_criterion(r#"{"group_id":"g","function_id":"f"}"#, est).unwrap();
        assert_eq!(plain.elements, 1);
        assert!(parse_criterion(meta, r#"{"mean":{"point_estimate":1.0}}"#).is_none());

        let measured = |group: &str, function: &str, median: f64| Measured {
            group: group.into(),
            function: function.into(),
            median,
            elements: 1,
        };
        let m = |f: &str, median: f64| measured("direct_allow_1_thread", f, median);
        let results = [
            m("floor", 10.0),
            m("governor", 40.0),
            m("token_bucket", 30.0),
        ];
        let report = render(&[results.to_vec()], &Readings::default(), true);
        assert!(
            report.contains("| token_bucket | 30.0 ns | 33.3 M/s | 0.75 | 3.00 |"),
            "{report}"
        );
        assert!(
            report.contains(
                "| Direct allow, 1 thread: token bucket time ≤ 1.0× governor's | 0.75× | 0.75–0.75× | 1 | yes |"
            ),
            "{report}"
        );
        assert!(report.contains(
            "Stack of 3 layers on different keys (two keys and a global one): time ≤ 2.0× one keyed check | not measured"
        ));
        assert!(
            report.contains(
                "| Direct allow, 1 thread: token bucket time ≤ 1.05× the floor in the same group (clock, load, compare-exchange) | 3.00× | 3.00–3.00× | 1 | **no** |"
            ),
            "{report}"
        );
        assert!(!report.contains("What bounds the stack target"), "{report}");
        assert_eq!(rate(5_236.0), "5.2 k/s");

        let s = |f: &str, median: f64| measured("stack", f, median);
        let stacked = [
            s("one_check", 60.0),
            s("floor", 90.0),
            s("stack_1", 100.0),
            s("stack_3", 180.0),
        ];
        let report = render(&[stacked.to_vec()], &Readings::default(), false);
        assert!(
            report.contains(
                "| Stack of 3 layers on different keys (two keys and a global one): time ≤ 2.0× one keyed check | 3.00× | 3.00–3.00× | 1 | **no** |"
            ),
            "{report}"
        );
        // Over three passes: the median of 0.9, 1.1 and 0.95, and not met, as one pass is out.
        let passes: Vec<Vec<Measured>> = [36.0, 44.0, 38.0]
            .into_iter()
            .map(|ours| vec![m("governor", 40.0), m("token_bucket", ours)])
            .collect();
        let repeated = render(&passes, &Readings::default(), false);
        assert!(
            repeated.contains("governor's | 0.95× | 0.90–1.10× | 3 | **no** |"),
            "{repeated}"
        );
        assert!(report.contains("/ one check | 1.50× |"), "{report}");
        assert!(
            report.contains("| Stack of 3 / the floor | 2.00× |"),
            "{report}"
        );
        assert!(
            report.contains("| Stack of 3 / a stack of 1 | 1.80× |"),
            "{report}"
        );
        // Not measured in this run: left out rather than shown empty.
        assert!(!report.contains("in sequence, no transaction"), "{report}");
        assert!(!report.contains("synchronisation"), "{report}");

        // 2 × 60 − 90 = 30 ns left at the target beyond the floor; the stack spends 180 − 90.
        assert!(report.contains("− the floor) | 30.00 ns |"), "{report}");
        assert!(
            report.contains("(stack of 3 − the floor) | 90.00 ns |"),
            "{report}"
        );

        // With the parts measured: 20 + 10 + 5 = 35 ns of one check's 60 is synchronisation,
        // and 20 + 2 × 10 + 3 × 5 = 55 ns of a transaction's.
        let parts = [s("clock", 20.0), s("read_lock", 10.0), s("cas", 5.0)];
        let report = render(
            &[[&stacked[..], &parts[..]].concat()],
            &Readings::default(),
            false,
        );
        assert!(report.contains("1 compare-exchange) | 1.71× |"), "{report}");
        assert!(
            report.contains("3 compare-exchanges) / one check | 0.92× |"),
            "{report}"
        );
        assert!(!report.contains("floor deciding"), "{report}");

        // With the deciding floor and the typed sketch measured: 72 / 60, 75 / 60, 180 / 75.
        let deciding = [s("floor_deciding", 72.0), s("typed_sketch", 75.0)];
        let report = render(
            &[[&stacked[..], &deciding[..]].concat()],
            &Readings::default(),
            false,
        );
        assert!(
            report.contains("as they come / one check | 1.20× |"),
            "{report}"
        );
        assert!(
            report.contains("answers as they come) / one check | 1.25× |"),
            "{report}"
        );
        assert!(
            report.contains(
                "(run-time layers and the answer, less what the commit lock saves) | 2.40× |"
            ),
            "{report}"
        );
    }
}
