//! Counters by policy and result, what each request counts (`limiterd_decisions_total{policy,
//! result}`, `limiterd_permit_releases_total{policy, result}`): each policy's counts kept per
//! shard of threads (`shards.rs`), cache-padded, and added up when a scrape or the status page
//! reads them. A `prometheus-client` `Counter` is one atomic word every request of its policy
//! on every core adds to, a cache line all cores write (and a `Family` looked up by labels
//! takes a lock and allocates them). Here a request adds to its thread's shard alone (one
//! relaxed add), as the request histogram counts (`latency.rs`).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crossbeam_utils::CachePadded;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use super::{Counted, PolicyTotals};
use crate::shards::{self, SHARDS};

/// Each result a decision is counted under, by its place in a policy's counts.
pub(super) const DECISIONS: [&str; 7] = [
    "allowed",
    "denied",
    "shadow_denied",
    "peeked",
    "batch_refused",
    "recorded",
    "given_back",
];

/// Each result a permit's release is counted under: it was held (and is now released), or it
/// had expired or was released already.
pub(super) const RELEASES: [&str; 2] = ["released", "not_held"];

/// The place of `counted`'s result in [`DECISIONS`].
pub(super) fn place(counted: Counted) -> usize {
    match counted {
        Counted::Allowed => 0,
        Counted::Denied { shadow: false } => 1,
        Counted::Denied { shadow: true } => 2,
        Counted::Peeked => 3,
        Counted::BatchRefused => 4,
        Counted::Recorded => 5,
        Counted::GivenBack => 6,
    }
}

/// One policy's counts by result (`N` of them); clones share them.
#[derive(Clone, Debug)]
pub(super) struct Tallies<const N: usize>(Arc<[CachePadded<Shard<N>>; SHARDS]>);

/// One shard's counts, by result.
#[derive(Debug)]
struct Shard<const N: usize>([AtomicU64; N]);

impl<const N: usize> Default for Tallies<N> {
    fn default() -> Self {
        Self(Arc::new(std::array::from_fn(|_| {
            CachePadded::new(Shard(std::array::from_fn(|_| AtomicU64::new(0))))
        })))
    }
}

impl<const N: usize> Tallies<N> {
    /// Counts one request under the result at `place` (none past the results).
    #[inline]
    pub(super) fn count(&self, place: usize) {
        let shard = &self.0[shards::this_thread()];
        if let Some(count) = shard.0.get(place) {
            // Relaxed: statistics, ordered with nothing; a read adds each word up on its own.
            count.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The requests counted under the result at `place`, every shard's.
    fn total(&self, place: usize) -> u64 {
        self.0
            .iter()
            // Relaxed: see `count`.
            .map(|shard| shard.0[place].load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// Every policy's counts, by name, as the registry writes them out: each result of each
/// policy, or (`hide_unused`) of each policy that counted anything yet; clones share them.
#[derive(Clone, Debug)]
pub(super) struct ByPolicy<const N: usize> {
    results: &'static [&'static str; N],
    hide_unused: bool,
    policies: Arc<Mutex<BTreeMap<String, Tallies<N>>>>,
}

impl<const N: usize> ByPolicy<N> {
    /// Counts under `results`, by policy; `hide_unused`: a policy's series appear at its first
    /// count, not at zero.
    pub(super) fn new(results: &'static [&'static str; N], hide_unused: bool) -> Self {
        Self {
            results,
            hide_unused,
            policies: Arc::default(),
        }
    }

    /// The counts of the policy named `name`; a name registered again shares them.
    pub(super) fn policy(&self, name: &str) -> Tallies<N> {
        let mut policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        policies.entry(name.to_owned()).or_default().clone()
    }
}

impl ByPolicy<7> {
    /// Every policy's decisions so far, by name.
    pub(super) fn totals(&self) -> BTreeMap<String, PolicyTotals> {
        let policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        let totals = |t: &Tallies<7>| PolicyTotals {
            allowed: t.total(place(Counted::Allowed)),
            denied: t.total(place(Counted::Denied { shadow: false })),
            shadow_denied: t.total(place(Counted::Denied { shadow: true })),
            peeked: t.total(place(Counted::Peeked)),
            batch_refused: t.total(place(Counted::BatchRefused)),
            recorded: t.total(place(Counted::Recorded)),
            given_back: t.total(place(Counted::GivenBack)),
        };
        policies
            .iter()
            .map(|(name, tallies)| (name.clone(), totals(tallies)))
            .collect()
    }
}

impl<const N: usize> TypedMetric for ByPolicy<N> {
    const TYPE: MetricType = MetricType::Counter;
}

impl<const N: usize> EncodeMetric for ByPolicy<N> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let policies = self.policies.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, tallies) in policies.iter() {
            let totals: [u64; N] = std::array::from_fn(|place| tallies.total(place));
            if self.hide_unused && totals.iter().all(|&n| n == 0) {
                continue;
            }
            for (result, total) in self.results.iter().zip(totals) {
                let labels = [("policy", name.as_str()), ("result", *result)];
                encoder
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&total, None)?;
            }
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decisions counted on threads of every shard are all in the totals, each under its own
    /// result, and one name registered twice shares its counts.
    #[test]
    fn counts_from_every_shard_add_up_under_their_result() {
        let decisions = ByPolicy::new(&DECISIONS, false);
        let api = decisions.policy("api");
        let threads: Vec<_> = (0..2 * SHARDS)
            .map(|_| {
                let api = api.clone();
                std::thread::spawn(move || {
                    for _ in 0..1_000 {
                        api.count(place(Counted::Allowed));
                    }
                    api.count(place(Counted::Denied { shadow: true }));
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic");
        }
        decisions.policy("api").count(place(Counted::GivenBack));
        let totals = &decisions.totals()["api"];
        assert_eq!(totals.allowed, 2_000 * SHARDS as u64);
        assert_eq!(totals.shadow_denied, 2 * SHARDS as u64);
        assert_eq!(totals.given_back, 1);
        assert_eq!(totals.denied + totals.peeked + totals.recorded, 0);
    }

    /// A policy whose series appear at its first count is left out until then, and then shows
    /// every result; the others show at zero from the start.
    #[test]
    fn hidden_until_used_policies_appear_at_their_first_count() {
        let text = |by_policy: &ByPolicy<2>| {
            let mut registry = prometheus_client::registry::Registry::default();
            registry.register("releases", "help", by_policy.clone());
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, &registry).expect("encodes");
            out
        };
        let releases = ByPolicy::new(&RELEASES, true);
        let exports = releases.policy("exports");
        assert!(!text(&releases).contains("exports"), "{}", text(&releases));
        exports.count(1);
        let shown = text(&releases);
        assert!(
            shown.contains("releases_total{policy=\"exports\",result=\"released\"} 0"),
            "{shown}"
        );
        assert!(
            shown.contains("releases_total{policy=\"exports\",result=\"not_held\"} 1"),
            "{shown}"
        );
        let always = ByPolicy::new(&RELEASES, false);
        let _ = always.policy("api");
        assert!(text(&always).contains("{policy=\"api\",result=\"released\"} 0"));
    }
}
