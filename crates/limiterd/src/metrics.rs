//! Counters and a latency histogram, written as Prometheus text for `GET /metrics`:
//! decisions allowed and denied per policy, invalid requests, backend errors, answers from a
//! failure policy, keys held in memory, and how long each decision request took.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds.
const BUCKETS_US: [u64; 12] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 100_000, 1_000_000,
];

/// Allowed and denied counts of one policy.
#[derive(Debug, Default)]
struct Decisions {
    allowed: AtomicU64,
    denied: AtomicU64,
    shadow_denied: AtomicU64,
}

/// Every counter. All are `Relaxed`: each is a statistic read on its own, never used to
/// order other memory.
#[derive(Debug)]
pub struct Metrics {
    policies: Vec<(String, Decisions)>,
    ad_hoc: Decisions,
    invalid: AtomicU64,
    backend_errors: AtomicU64,
    failure_policy: AtomicU64,
    buckets: [AtomicU64; BUCKETS_US.len()],
    latency_count: AtomicU64,
    latency_sum_us: AtomicU64,
}

impl Metrics {
    /// Counters for `policies` (in the engine's index order).
    pub fn new(policies: impl IntoIterator<Item = String>) -> Self {
        Self {
            policies: policies
                .into_iter()
                .map(|p| (p, Decisions::default()))
                .collect(),
            ad_hoc: Decisions::default(),
            invalid: AtomicU64::new(0),
            backend_errors: AtomicU64::new(0),
            failure_policy: AtomicU64::new(0),
            buckets: Default::default(),
            latency_count: AtomicU64::new(0),
            latency_sum_us: AtomicU64::new(0),
        }
    }

    /// Counts one answer for policy `index` (`None`: an ad-hoc limit); a `shadow` denial
    /// (reported, not enforced) is counted apart.
    pub(crate) fn count(&self, index: Option<usize>, allowed: bool, shadow: bool) {
        let decisions = match index.and_then(|i| self.policies.get(i)) {
            Some((_, d)) => d,
            None => &self.ad_hoc,
        };
        let counter = if allowed {
            &decisions.allowed
        } else if shadow {
            &decisions.shadow_denied
        } else {
            &decisions.denied
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request refused as invalid.
    pub fn invalid(&self) {
        self.invalid.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a backend failure.
    pub(crate) fn backend_error(&self) {
        self.backend_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an answer given by a failure policy (open, closed or the fallback).
    pub(crate) fn fallback(&self) {
        self.failure_policy.fetch_add(1, Ordering::Relaxed);
    }

    /// Records how long one decision request took.
    pub fn observe(&self, took: Duration) {
        let us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
        if let Some(i) = BUCKETS_US.iter().position(|&b| us <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// The Prometheus text exposition, with `keys` held in memory.
    pub fn render(&self, keys: u64) -> String {
        let mut out = String::new();
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        out.push_str("# HELP limiterd_decisions_total Decisions made, by policy and result (shadow_denied: a shadow-mode limit over, not enforced).\n");
        out.push_str("# TYPE limiterd_decisions_total counter\n");
        let all = self
            .policies
            .iter()
            .map(|(name, d)| (name.as_str(), d))
            .chain([("(ad hoc)", &self.ad_hoc)]);
        for (name, d) in all {
            let name = label(name);
            for (result, counter) in [
                ("allowed", &d.allowed),
                ("denied", &d.denied),
                ("shadow_denied", &d.shadow_denied),
            ] {
                let _ = writeln!(
                    out,
                    "limiterd_decisions_total{{policy=\"{name}\",result=\"{result}\"}} {}",
                    load(counter)
                );
            }
        }
        for (name, help, value) in [
            (
                "limiterd_invalid_requests_total",
                "Requests refused as invalid (400).",
                load(&self.invalid),
            ),
            (
                "limiterd_backend_errors_total",
                "Calls the store failed or timed out.",
                load(&self.backend_errors),
            ),
            (
                "limiterd_failure_policy_total",
                "Answers given by a failure policy (open, closed, fallback).",
                load(&self.failure_policy),
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP limiterd_store_keys Keys held in memory (full ones not yet reclaimed included).\n# TYPE limiterd_store_keys gauge\nlimiterd_store_keys {keys}"
        );
        out.push_str(
            "# HELP limiterd_request_duration_seconds Time to answer a decision request.\n",
        );
        out.push_str("# TYPE limiterd_request_duration_seconds histogram\n");
        let mut cumulative = 0;
        for (bound, bucket) in BUCKETS_US.iter().zip(&self.buckets) {
            cumulative += load(bucket);
            let _ = writeln!(
                out,
                "limiterd_request_duration_seconds_bucket{{le=\"{}\"}} {cumulative}",
                seconds(*bound)
            );
        }
        let count = load(&self.latency_count);
        let _ = writeln!(
            out,
            "limiterd_request_duration_seconds_bucket{{le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "limiterd_request_duration_seconds_sum {}\nlimiterd_request_duration_seconds_count {count}",
            seconds(load(&self.latency_sum_us))
        );
        out
    }
}

/// A Prometheus label value: backslash, quote and newline escaped (envoy descriptor keys may
/// hold any of them).
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Microseconds as decimal seconds, exactly (no float).
fn seconds(us: u64) -> String {
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}
