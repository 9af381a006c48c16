//! The performance targets `cargo xtask bench` reports, each met or missed, and how a value is
//! read from a pass.

use std::collections::BTreeMap;

use super::results::{Measured, Readings, find};

/// A target: its statement, the measured ratio (or value) in one pass, and whether a value
/// holds.
pub(super) struct Target {
    pub(super) what: &'static str,
    pub(super) measured: Measure,
    pub(super) holds: fn(f64) -> bool,
    pub(super) unit: &'static str,
}

/// Where a target's value comes from.
pub(super) enum Measure {
    /// Each criterion pass (with what the benches wrote beside it).
    Pass(fn(&[Measured], &Readings) -> Option<f64>),
    /// Each pass of the `redis_server` bench (µs of Redis CPU per decision, by subject).
    Server(fn(&BTreeMap<String, f64>) -> Option<f64>),
}

impl Target {
    /// The target's value in every pass that measured it.
    pub(super) fn values(&self, passes: &[Vec<Measured>], readings: &Readings) -> Vec<f64> {
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
pub(super) fn targets() -> Vec<Target> {
    [checks(), composed(), redis_calls(), redis_cpu(), service()]
        .into_iter()
        .flatten()
        .collect()
}

/// One check in one process: direct and keyed, a permit, memory.
fn checks() -> Vec<Target> {
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
            what: "Memory: token bucket in the default store ≤ 36 B/key at 1M keys",
            measured: Measure::Pass(|_, x| x.memory.get("keyed_token_bucket_sharded").copied()),
            holds: |b| b <= 36.0,
            unit: " B",
        },
    ]
}

/// What is composed of checks: a permit beside a stack, stacks, the HTTP layer.
fn composed() -> Vec<Target> {
    vec![
        Target {
            what: "Concurrency in a stack: a rate layer and a permit ≤ 1.0× two rate layers",
            measured: Measure::Pass(|r, _| ratio(r, "stack", "stack_1_and_permit", "stack_2")),
            holds: |r| r <= 1.0,
            unit: "×",
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
    ]
}

/// A Redis backend's calls, as its caller times them: in flight, one after another, leased.
fn redis_calls() -> Vec<Target> {
    vec![
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
    ]
}

/// What a decision costs Redis (the `redis_server` bench's passes).
fn redis_cpu() -> Vec<Target> {
    vec![
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

/// limiterd over loopback, against its own HTTP floor.
fn service() -> Vec<Target> {
    vec![
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
    ]
}

/// What a layer adds to the bare axum router, in ns (the `tower_axum` group).
fn over_router(results: &[Measured], layered: &str) -> Option<f64> {
    Some(
        find(results, "tower_axum", layered)?.median
            - find(results, "tower_axum", "bare_router")?.median,
    )
}

/// A target's values over the passes that measured it: (median, min, max, passes).
pub(super) fn spread(mut values: Vec<f64>) -> Option<(f64, f64, f64, usize)> {
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
