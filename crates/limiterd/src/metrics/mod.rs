//! The service's metrics, kept and written out by `prometheus-client` (OpenMetrics text, which
//! Prometheus scrapes) for `GET /metrics`: decisions allowed, denied and shadow-denied per
//! policy (labelled by name), invalid requests, backend errors, answers from a failure policy
//! (labelled open, closed or fallback), keys held in memory, how long each decision request
//! took (`latency.rs`: a histogram kept without a lock, so requests on every core share no
//! mutex), and the store's health (`store.rs`: ready, reachable, each Redis master).
//!
//! A policy registers its counters once, by name ([`Metrics::policy`]), and keeps the handles:
//! counting a decision is one atomic increment, with no lookup, into counts of the calling
//! thread's shard (`by_name.rs`), so cores do not share the line; envoy's rule statistics too.
//!
//! For the status page, the metrics also keep every policy's totals ([`Metrics::totals`]) and
//! the identifiers denied most ([`TopDenied`]: a fixed-size Space-Saving sketch, so its memory
//! is bounded whatever the traffic), and a denial is logged at most once a second, a store
//! failure a policy answered at most once every ten seconds (each with the number not logged
//! since: `limiter_core::Paced`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use limiter_core::Paced;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

mod by_name;
mod denials;
mod latency;
mod store;
use by_name::{ALL, ByName, DECISIONS, ENVOY_STATS, RELEASES, Tallies};
use denials::Denials;
pub use denials::{HeavyHitter, TOP_DENIED, TopDenied};
use latency::Latency;
use store::StoreGauges;
pub use store::{MasterReading, StoreReading};

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the latency buckets, in seconds (25 µs to 1 s).
const BUCKETS_S: [f64; 12] = [
    0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1, 1.0,
];

/// The most distinct descriptor keys envoy's statistics are kept for (configured ones included;
/// past it a key a request brings is counted under `(other)`).
pub const MAX_ENVOY_KEYS: usize = 10_000;

/// The label every ad-hoc limit's decisions are counted under.
pub const AD_HOC: &str = "(ad hoc)";

/// One policy's decision counters, registered under its name.
#[derive(Clone, Debug)]
pub struct PolicyCounters {
    name: Arc<str>,
    denials: Arc<Denials>,
    /// Its decisions by result, counted per shard of threads (`by_name.rs`).
    decisions: Tallies<7>,
    /// Its permit releases by result; its series appear at its first release.
    releases: Tallies<2>,
}

/// One configured envoy descriptor path's statistics ([`Metrics::envoy_rule`]).
#[derive(Clone, Debug)]
pub struct RuleCounters(Tallies<6>);

/// The first five of envoy's statistics, which a configured descriptor shows from zero.
const RULE_STATS_FROM_ZERO: u32 = 0b1_1111;

/// The place of envoy's statistic `stat` in its counts (`None`: not one of its names).
fn envoy_place(stat: &str) -> Option<usize> {
    ENVOY_STATS.iter().position(|s| *s == stat)
}

impl RuleCounters {
    /// Adds `n` to `stat` (`total_hits`, `within_limit`, `over_limit`, `near_limit` or
    /// `shadow_mode`; another name counts nothing).
    pub fn add(&self, stat: &str, n: u64) {
        if let Some(place) = envoy_place(stat) {
            self.0.add(place, n);
        }
    }
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
    /// Usage that already happened, recorded whatever the limits held (within them or not).
    Recorded,
    /// Units given back without a grant (envoy's `is_negative_hits`).
    GivenBack,
}

impl PolicyCounters {
    /// Counts one item's answer for `identifier` (a denial also goes to the top-denied sketch
    /// and, sampled, to the log).
    pub(crate) fn count(&self, counted: Counted, identifier: &str) {
        if counted == (Counted::Denied { shadow: false }) {
            self.denials.record(&self.name, identifier);
        }
        self.decisions.add(by_name::place(counted), 1);
    }

    /// Counts one release of a permit: `held` if it was still held (and is now released), else
    /// it had expired or was released already.
    pub(crate) fn count_release(&self, held: bool) {
        // `RELEASES`' places.
        self.releases.add(if held { 0 } else { 1 }, 1);
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

/// A policy's totals so far, for the status page.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PolicyTotals {
    /// Admitted, units taken.
    pub allowed: u64,
    /// Denied (shadow denials apart).
    pub denied: u64,
    /// Shadow-mode denials, not enforced.
    pub shadow_denied: u64,
    /// Cost-0 reports.
    pub peeked: u64,
    /// Admitted by their limits, refused with their batch.
    pub batch_refused: u64,
    /// Usage recorded (never refused; it may have left a debt).
    pub recorded: u64,
    /// Units given back without a grant.
    pub given_back: u64,
}

/// Every metric, in one registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    denials: Arc<Denials>,
    reloads: Family<[(&'static str, &'static str); 1], Counter>,
    decisions: ByName<7>,
    envoy: ByName<6>,
    invalid: Counter,
    backend_errors: Counter,
    /// Paces the log lines of what happens at every request while it lasts.
    logged: LogPacing,
    store_full: Counter,
    failure_policy: Family<[(&'static str, &'static str); 1], Counter>,
    store_keys: Gauge<i64, AtomicI64>,
    permits_held: Family<[(&'static str, String); 1], Gauge<i64, AtomicI64>>,
    releases: ByName<2>,
    store: StoreGauges,
    duration: Latency,
}

/// How often each log line of something that lasts (an outage, a full store) is said.
#[derive(Debug)]
struct LogPacing {
    /// A store failure a policy answered: every ten seconds, with its error.
    store_failed: Paced,
    /// A full store's refusals: every ten seconds.
    store_full: Paced,
    /// A gauge the store could not read at a scrape: once a minute.
    gauge_unread: Paced,
}

impl Default for LogPacing {
    fn default() -> Self {
        Self {
            store_failed: Paced::new(Duration::from_secs(10)),
            store_full: Paced::new(Duration::from_secs(10)),
            gauge_unread: Paced::new(Duration::from_secs(60)),
        }
    }
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
        let decisions = ByName::new(["policy", "result"], &DECISIONS);
        registry.register(
            "limiterd_decisions",
            "Decisions made, by policy and result (allowed: units taken; denied; shadow_denied: a shadow-mode limit over, not enforced; peeked: cost 0, nothing taken; batch_refused: admitted by its limits but its batch was denied, nothing taken; recorded: usage that already happened, recorded whatever the limits held; given_back: units given back without a grant, envoy's is_negative_hits)",
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
        let failure_policy = failure_policies(&mut registry);
        let store_keys = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "limiterd_store_keys",
            "Keys held in memory (full ones not yet reclaimed included)",
            store_keys.clone(),
        );
        let permits_held = Family::default();
        registry.register(
            "limiterd_permits_held",
            "Permits held now (not released, not expired), by policy with a concurrency limit: in this process's memory, or on Redis the fleet's (every process's), read at each scrape",
            permits_held.clone(),
        );
        let releases = ByName::new(["policy", "result"], &RELEASES);
        registry.register(
            "limiterd_permit_releases",
            "Permit releases by policy and result (released: it was held; not_held: it had expired or was released already), on any store: with the decisions allowed, what a fleet's permits do",
            releases.clone(),
        );
        let store = StoreGauges::register(&mut registry);
        let duration = Latency::new(&BUCKETS_S);
        registry.register(
            "limiterd_request_duration_seconds",
            "Time to answer a decision request",
            duration.clone(),
        );
        let reloads = reload_results(&mut registry);
        let envoy = ByName::new(["key", "stat"], &ENVOY_STATS);
        registry.register(
            "limiterd_envoy_rule",
            "Envoy descriptor statistics as the reference service names them, by key (`domain.key_value...`; one per value where `value_to_metric` or `detailed_metric` asks, up to 10000 keys, then `(other)`) and stat (total_hits, within_limit, over_limit, near_limit, shadow_mode; global_shadow_mode under an empty key)",
            envoy.clone(),
        );
        Self {
            registry,
            envoy,
            denials: Arc::new(Denials::new()),
            reloads,
            decisions,
            invalid,
            backend_errors,
            logged: LogPacing::default(),
            store_full,
            failure_policy,
            store_keys,
            permits_held,
            releases,
            store,
            duration,
        }
    }

    /// Sets the permits each policy holds now (read at each scrape: in memory, or the fleet's
    /// on Redis); a policy whose count could not be read (Redis does not answer, or its index
    /// is a key of another type) is left out of this scrape, not reported at its last reading,
    /// and the error is counted as a store call failed and logged (at most once a minute).
    pub fn set_permits_held(&self, held: &[(&str, Result<u64, String>)]) {
        for (policy, n) in held {
            let labels = [("policy", (*policy).to_owned())];
            match n {
                Ok(n) => {
                    self.permits_held
                        .get_or_create(&labels)
                        .set(i64::try_from(*n).unwrap_or(i64::MAX));
                }
                Err(error) => {
                    self.permits_held.remove(&labels);
                    self.backend_errors.inc();
                    if let Some(unlogged) = self.logged.gauge_unread.due() {
                        tracing::warn!(
                            policy,
                            %error,
                            unlogged,
                            "the permits a policy holds could not be read: limiterd_permits_held leaves it out (one such line a minute)"
                        );
                    }
                }
            }
        }
    }

    /// The counters of the policy named `name`, shown at zero from now on. Registering a name
    /// twice shares its counters.
    pub fn policy(&self, name: &str) -> PolicyCounters {
        PolicyCounters {
            name: name.into(),
            denials: Arc::clone(&self.denials),
            decisions: self.decisions.register(name, ALL),
            releases: self.releases.register(name, 0),
        }
    }

    /// Every policy's totals so far, by name (policies a reload removed included).
    pub fn totals(&self) -> BTreeMap<String, PolicyTotals> {
        self.decisions.totals()
    }

    /// The identifiers denied most, most first.
    pub fn top_denied(&self) -> Vec<HeavyHitter> {
        self.denials.top()
    }

    /// Counts a reload: `"applied"`, `"unchanged"` or `"refused"`.
    pub fn reload(&self, result: &'static str) {
        self.reloads.get_or_create(&[("result", result)]).inc();
    }

    /// The statistics of the configured envoy descriptor path `key`, registered once (shown at
    /// zero from now on), so counting them takes no lookup.
    pub fn envoy_rule(&self, key: &str) -> RuleCounters {
        RuleCounters(self.envoy.register(key, RULE_STATS_FROM_ZERO))
    }

    /// Adds `n` to envoy's statistic `stat` for the descriptor key `key` (a bounded number of
    /// distinct keys: past [`MAX_ENVOY_KEYS`] new ones count under `(other)`; a name not one
    /// of envoy's statistics counts nothing). A key seen before is counted without a lock
    /// held alone or an allocation.
    pub fn envoy_stat(&self, key: &str, stat: &'static str, n: u64) {
        if n == 0 {
            return;
        }
        if let Some(place) = envoy_place(stat) {
            self.envoy
                .add_by_name(key, place, n, MAX_ENVOY_KEYS, "(other)");
        }
    }

    /// Counts a request refused as invalid.
    pub fn invalid(&self) {
        self.invalid.inc();
    }

    /// A request refused because a bounded store was full (`error` names the policy's
    /// store): counted, and logged at most once every ten seconds with the number not logged
    /// since (a flood of new identifiers is what fills a store).
    pub(crate) fn store_full(&self, error: &dyn std::fmt::Display) {
        self.store_full.inc();
        if let Some(unlogged) = self.logged.store_full.due() {
            tracing::warn!(
                %error,
                unlogged,
                "a policy's key store is full: new identifiers are refused (one such line every 10 s)"
            );
        }
    }

    /// A store call failed with `error` (an outage, or a key holding what limiterd did not
    /// write, named in it) and the failure policy answered: counted, and logged at most once
    /// every ten seconds with the number not logged since.
    pub(crate) fn store_failed(&self, error: &dyn std::fmt::Display) {
        self.backend_errors.inc();
        if let Some(unlogged) = self.logged.store_failed.due() {
            tracing::warn!(
                %error,
                unlogged,
                "a store call failed and the policy's on_failure answered (one such line every 10 s)"
            );
        }
    }

    /// Counts an answer given by a failure policy.
    pub(crate) fn failure_policy(&self, policy: FailurePolicy) {
        self.failure_policy
            .get_or_create(&[("policy", policy.label())])
            .inc();
    }

    /// Sets the store's health gauges from the last probe (read at each scrape).
    pub fn set_store(&self, reading: &StoreReading<'_>) {
        self.store.set(reading);
    }

    /// Records how long one decision request took.
    pub fn observe(&self, took: Duration) {
        self.duration.observe(took);
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

/// Answers given by a failure policy, by policy, each shown from zero.
fn failure_policies(registry: &mut Registry) -> Family<[(&'static str, &'static str); 1], Counter> {
    let failure_policy = Family::default();
    registry.register(
        "limiterd_failure_policy",
        "Answers given by a failure policy while the store failed, by policy (open, closed, fallback)",
        failure_policy.clone(),
    );
    // Every failure policy's answers are shown from zero.
    for policy in [
        FailurePolicy::Open,
        FailurePolicy::Closed,
        FailurePolicy::Fallback,
    ] {
        let _ = failure_policy.get_or_create(&[("policy", policy.label())]);
    }
    failure_policy
}

/// Configuration reloads, by result, each shown from zero.
fn reload_results(registry: &mut Registry) -> Family<[(&'static str, &'static str); 1], Counter> {
    let reloads = Family::default();
    registry.register(
        "limiterd_config_reloads",
        "Configuration reloads, by result (applied; unchanged: the files said what was served; refused: the old configuration kept serving)",
        reloads.clone(),
    );
    for result in ["applied", "unchanged", "refused"] {
        let _ = reloads.get_or_create(&[("result", result)]);
    }
    reloads
}

#[cfg(test)]
mod tests;
