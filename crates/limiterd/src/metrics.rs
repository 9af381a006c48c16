//! The service's metrics, kept and written out by `prometheus-client` (OpenMetrics text, which
//! Prometheus scrapes) for `GET /metrics`: decisions allowed, denied and shadow-denied per
//! policy (labelled by name), invalid requests, backend errors, answers from a failure policy
//! (labelled open, closed or fallback), keys held in memory, and how long each decision request
//! took.
//!
//! A policy registers its counters once, by name ([`Metrics::policy`]), and keeps the handles:
//! counting a decision is one atomic increment, with no lookup.

use std::sync::atomic::AtomicI64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the latency buckets, in seconds (25 µs to 1 s).
const BUCKETS_S: [f64; 12] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 1.0,
];

/// The label every ad-hoc limit's decisions are counted under.
pub const AD_HOC: &str = "(ad hoc)";

type Labels = [(&'static str, String); 2];

/// One policy's decision counters, registered under its name.
#[derive(Clone, Debug)]
pub struct PolicyCounters {
    allowed: Counter,
    denied: Counter,
    shadow_denied: Counter,
    peeked: Counter,
    batch_refused: Counter,
}

/// How one item's answer is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Counted {
    /// Admitted, and its units taken.
    Allowed,
    /// Over the limit; a `shadow` denial (reported, not enforced) is counted apart.
    Denied {
        /// Whether the item was in shadow mode.
        shadow: bool,
    },
    /// Cost 0: it only reported, took nothing.
    Peeked,
    /// Its limits admitted it, but another item of its batch was denied, so it took nothing.
    BatchRefused,
}

impl PolicyCounters {
    /// Counts one item's answer.
    pub(crate) fn count(&self, counted: Counted) {
        let counter = match counted {
            Counted::Allowed => &self.allowed,
            Counted::Denied { shadow: true } => &self.shadow_denied,
            Counted::Denied { shadow: false } => &self.denied,
            Counted::Peeked => &self.peeked,
            Counted::BatchRefused => &self.batch_refused,
        };
        counter.inc();
    }
}

/// Which failure policy answered while the backend was failing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailurePolicy {
    /// Admitted, nothing counted.
    Open,
    /// Refused with 503.
    Closed,
    /// Decided by the local fallback.
    Fallback,
}

impl FailurePolicy {
    fn label(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
            Self::Fallback => "fallback",
        }
    }
}

/// Every metric, in one registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    decisions: Family<Labels, Counter>,
    invalid: Counter,
    backend_errors: Counter,
    store_full: Counter,
    failure_policy: Family<[(&'static str, &'static str); 1], Counter>,
    store_keys: Gauge<i64, AtomicI64>,
    duration: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Every metric at zero; policies add their counters with [`policy`](Self::policy).
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let decisions = Family::<Labels, Counter>::default();
        registry.register(
            "limiterd_decisions",
            "Decisions made, by policy and result (allowed: units taken; denied; shadow_denied: a shadow-mode limit over, not enforced; peeked: cost 0, nothing taken; batch_refused: admitted by its limits but its batch was denied, nothing taken)",
            decisions.clone(),
        );
        let invalid = Counter::default();
        registry.register(
            "limiterd_invalid_requests",
            "Requests refused as invalid (400)",
            invalid.clone(),
        );
        let backend_errors = Counter::default();
        registry.register(
            "limiterd_backend_errors",
            "Calls the store failed or timed out",
            backend_errors.clone(),
        );
        let store_full = Counter::default();
        registry.register(
            "limiterd_store_full",
            "Requests refused with a 503 `store_full`: a bounded in-memory store held `max_keys` keys still refilling",
            store_full.clone(),
        );
        let failure_policy = Family::default();
        registry.register(
            "limiterd_failure_policy",
            "Answers given by a failure policy while the store failed, by policy (open, closed, fallback)",
            failure_policy.clone(),
        );
        let store_keys = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "limiterd_store_keys",
            "Keys held in memory (full ones not yet reclaimed included)",
            store_keys.clone(),
        );
        let duration = Histogram::new(BUCKETS_S);
        registry.register(
            "limiterd_request_duration_seconds",
            "Time to answer a decision request",
            duration.clone(),
        );
        let metrics = Self {
            registry,
            decisions,
            invalid,
            backend_errors,
            store_full,
            failure_policy,
            store_keys,
            duration,
        };
        for policy in [
            FailurePolicy::Open,
            FailurePolicy::Closed,
            FailurePolicy::Fallback,
        ] {
            let _ = metrics
                .failure_policy
                .get_or_create(&[("policy", policy.label())]);
        }
        metrics
    }

    /// The counters of the policy named `name`, shown at zero from now on. Registering a name
    /// twice shares its counters.
    pub fn policy(&self, name: &str) -> PolicyCounters {
        let counter = |result: &'static str| {
            self.decisions
                .get_or_create(&[("policy", name.to_owned()), ("result", result.to_owned())])
                .clone()
        };
        PolicyCounters {
            allowed: counter("allowed"),
            denied: counter("denied"),
            shadow_denied: counter("shadow_denied"),
            peeked: counter("peeked"),
            batch_refused: counter("batch_refused"),
        }
    }

    /// Counts a request refused as invalid.
    pub fn invalid(&self) {
        self.invalid.inc();
    }

    /// Counts a backend failure.
    /// A request refused because a bounded store was full.
    pub(crate) fn store_full(&self) {
        self.store_full.inc();
    }

    pub(crate) fn backend_error(&self) {
        self.backend_errors.inc();
    }

    /// Counts an answer given by a failure policy.
    pub(crate) fn failure_policy(&self, policy: FailurePolicy) {
        self.failure_policy
            .get_or_create(&[("policy", policy.label())])
            .inc();
    }

    /// Records how long one decision request took.
    pub fn observe(&self, took: Duration) {
        self.duration.observe(took.as_secs_f64());
    }

    /// The text exposition, with `keys` held in memory.
    pub fn render(&self, keys: u64) -> String {
        self.store_keys.set(i64::try_from(keys).unwrap_or(i64::MAX));
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_policy_name_and_failure_policy_with_escaped_labels() {
        let metrics = Metrics::new();
        let api = metrics.policy("api");
        api.count(Counted::Allowed);
        api.count(Counted::Allowed);
        api.count(Counted::Denied { shadow: false });
        api.count(Counted::Denied { shadow: true });
        api.count(Counted::Peeked);
        api.count(Counted::BatchRefused);
        // A second registration shares the counters.
        metrics.policy("api").count(Counted::Allowed);
        metrics
            .policy("envoy:a\"b\\c\nd")
            .count(Counted::Denied { shadow: false });
        metrics.store_full();
        metrics.failure_policy(FailurePolicy::Closed);
        metrics.invalid();
        metrics.observe(Duration::from_micros(30));
        let text = metrics.render(7);
        for line in [
            "limiterd_decisions_total{policy=\"api\",result=\"allowed\"} 3",
            "limiterd_decisions_total{policy=\"api\",result=\"denied\"} 1",
            "limiterd_decisions_total{policy=\"api\",result=\"shadow_denied\"} 1",
            "limiterd_decisions_total{policy=\"api\",result=\"peeked\"} 1",
            "limiterd_decisions_total{policy=\"api\",result=\"batch_refused\"} 1",
            "limiterd_store_full_total 1",
            "limiterd_decisions_total{policy=\"envoy:a\\\"b\\\\c\\nd\",result=\"denied\"} 1",
            "limiterd_failure_policy_total{policy=\"closed\"} 1",
            "limiterd_failure_policy_total{policy=\"open\"} 0",
            "limiterd_failure_policy_total{policy=\"fallback\"} 0",
            "limiterd_invalid_requests_total 1",
            "limiterd_backend_errors_total 0",
            "limiterd_store_keys 7",
            "limiterd_request_duration_seconds_count 1",
            "limiterd_request_duration_seconds_bucket{le=\"0.00005\"} 1",
            "limiterd_request_duration_seconds_bucket{le=\"0.000025\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from\n{text}"
            );
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
