//! Counters by name and result, what requests count: `limiterd_decisions_total{policy,
//! result}`, `limiterd_permit_releases_total{policy, result}` and envoy's
//! `limiterd_envoy_rule_total{key, stat}`. A policy's or a configured descriptor's counts are
//! kept per shard of threads (`shards.rs`), cache-padded, and added up when a scrape or the
//! status page reads them. A `prometheus-client` `Counter` is one atomic word every request on
//! every core adds to, a cache line all cores write, and a `Family` looked up by labels takes a
//! lock and allocates them. Here a request adds to its thread's shard alone (one relaxed add),
//! as the request histogram counts (`latency.rs`). Names a request brings (envoy's detailed
//! keys, up to a bound) are looked up under a read lock, without an allocation, and counted in
//! one shard each: their memory stays small.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

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

/// Envoy's statistics as its reference service names them; a descriptor's first five are
/// shown from zero, the last is counted under the empty key.
pub(super) const ENVOY_STATS: [&str; 6] = [
    "total_hits",
    "within_limit",
    "over_limit",
    "near_limit",
    "shadow_mode",
    "global_shadow_mode",
];

/// Every result shown from zero.
pub(super) const ALL: u32 = u32::MAX;

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

/// One name's counts by result (`N` of them), in one shard or one per shard of threads;
/// clones share them.
#[derive(Clone, Debug)]
pub(super) struct Tallies<const N: usize>(Arc<[CachePadded<Shard<N>>]>);

/// One shard's counts, by result.
#[derive(Debug)]
struct Shard<const N: usize>([AtomicU64; N]);

impl<const N: usize> Tallies<N> {
    /// Counts kept in `shards` shards (1, or [`SHARDS`]: one per shard of threads), rounded
    /// up to a power of two, so a count finds its shard with a mask, not a division.
    fn in_shards(shards: usize) -> Self {
        Self(
            (0..shards.max(1).next_power_of_two())
                .map(|_| CachePadded::new(Shard(std::array::from_fn(|_| AtomicU64::new(0)))))
                .collect(),
        )
    }

    /// Adds `n` under the result at `place` (nothing past the results).
    #[inline]
    pub(super) fn add(&self, place: usize, n: u64) {
        // The length is a power of two (`in_shards`): the mask keeps the index in it.
        let shard = &self.0[shards::this_thread() & (self.0.len() - 1)];
        if let Some(count) = shard.0.get(place) {
            // Relaxed: statistics, ordered with nothing; a read adds each word up on its own.
            count.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// What was counted under the result at `place`, every shard's.
    fn total(&self, place: usize) -> u64 {
        self.0
            .iter()
            // Relaxed: see `add`.
            .map(|shard| shard.0[place].load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }
}

/// A name's counts, and which of its results are shown from zero (a bit each, by place; the
/// others appear once counted).
#[derive(Debug)]
struct Named<const N: usize> {
    tallies: Tallies<N>,
    from_zero: u32,
}

/// Counts by name and result, as the registry writes them out under the labels `labels`;
/// clones share them.
#[derive(Clone, Debug)]
pub(super) struct ByName<const N: usize> {
    labels: [&'static str; 2],
    results: &'static [&'static str; N],
    names: Arc<RwLock<BTreeMap<String, Named<N>>>>,
}

impl<const N: usize> ByName<N> {
    /// Counts under `results`, labelled `labels` (the name's label, then the result's).
    pub(super) fn new(labels: [&'static str; 2], results: &'static [&'static str; N]) -> Self {
        Self {
            labels,
            results,
            names: Arc::default(),
        }
    }

    /// The counts of `name`, one per shard of threads, its results in `from_zero` (a bit
    /// each) shown from zero on; a name registered again shares them.
    pub(super) fn register(&self, name: &str, from_zero: u32) -> Tallies<N> {
        let mut names = self.names.write().unwrap_or_else(PoisonError::into_inner);
        let named = names.entry(name.to_owned()).or_insert_with(|| Named {
            tallies: Tallies::in_shards(SHARDS),
            from_zero: 0,
        });
        named.from_zero |= from_zero;
        named.tallies.clone()
    }

    /// Adds `n` under `place` for `name` as a request brings it: counted where it is known;
    /// else, while fewer than `most` names are, registered (one shard, no result from zero);
    /// else under `other`. An allocation only for a name not seen yet.
    pub(super) fn add_by_name(&self, name: &str, place: usize, n: u64, most: usize, other: &str) {
        {
            let names = self.names.read().unwrap_or_else(PoisonError::into_inner);
            if let Some(named) = names.get(name) {
                named.tallies.add(place, n);
                return;
            }
        }
        let mut names = self.names.write().unwrap_or_else(PoisonError::into_inner);
        let name = if names.contains_key(name) || names.len() < most {
            name
        } else {
            other
        };
        let named = names.entry(name.to_owned()).or_insert_with(|| Named {
            tallies: Tallies::in_shards(1),
            from_zero: 0,
        });
        named.tallies.add(place, n);
    }
}

impl ByName<7> {
    /// Every policy's decisions so far, by name.
    pub(super) fn totals(&self) -> BTreeMap<String, PolicyTotals> {
        let names = self.names.read().unwrap_or_else(PoisonError::into_inner);
        let totals = |t: &Tallies<7>| PolicyTotals {
            allowed: t.total(place(Counted::Allowed)),
            denied: t.total(place(Counted::Denied { shadow: false })),
            shadow_denied: t.total(place(Counted::Denied { shadow: true })),
            peeked: t.total(place(Counted::Peeked)),
            batch_refused: t.total(place(Counted::BatchRefused)),
            recorded: t.total(place(Counted::Recorded)),
            given_back: t.total(place(Counted::GivenBack)),
        };
        names
            .iter()
            .map(|(name, named)| (name.clone(), totals(&named.tallies)))
            .collect()
    }
}

impl<const N: usize> TypedMetric for ByName<N> {
    const TYPE: MetricType = MetricType::Counter;
}

impl<const N: usize> EncodeMetric for ByName<N> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let names = self.names.read().unwrap_or_else(PoisonError::into_inner);
        let [name_label, result_label] = self.labels;
        for (name, named) in names.iter() {
            for (place, result) in self.results.iter().enumerate() {
                let total = named.tallies.total(place);
                let from_zero = u32::try_from(place)
                    .ok()
                    .and_then(|place| 1_u32.checked_shl(place))
                    .is_some_and(|bit| named.from_zero & bit != 0);
                if total == 0 && !from_zero {
                    continue;
                }
                let labels = [(name_label, name.as_str()), (result_label, *result)];
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

    fn text<const N: usize>(by_name: &ByName<N>) -> String {
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register("counted", "help", by_name.clone());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encodes");
        out
    }

    /// Decisions counted on threads of every shard are all in the totals, each under its own
    /// result, and one name registered twice shares its counts.
    #[test]
    fn counts_from_every_shard_add_up_under_their_result() {
        let decisions = ByName::new(["policy", "result"], &DECISIONS);
        let api = decisions.register("api", ALL);
        let threads: Vec<_> = (0..2 * SHARDS)
            .map(|_| {
                let api = api.clone();
                std::thread::spawn(move || {
                    for _ in 0..1_000 {
                        api.add(place(Counted::Allowed), 1);
                    }
                    api.add(place(Counted::Denied { shadow: true }), 1);
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no panic");
        }
        decisions
            .register("api", ALL)
            .add(place(Counted::GivenBack), 1);
        let totals = &decisions.totals()["api"];
        assert_eq!(totals.allowed, 2_000 * SHARDS as u64);
        assert_eq!(totals.shadow_denied, 2 * SHARDS as u64);
        assert_eq!(totals.given_back, 1);
        assert_eq!(totals.denied + totals.peeked + totals.recorded, 0);
        let shown = text(&decisions);
        assert!(
            shown.contains("counted_total{policy=\"api\",result=\"peeked\"} 0"),
            "{shown}"
        );
    }

    /// A result not shown from zero appears once counted, alone; one shown from zero is there
    /// from the name's registration.
    #[test]
    fn a_result_shown_from_zero_is_there_at_once_the_others_once_counted() {
        let releases = ByName::new(["policy", "result"], &RELEASES);
        let exports = releases.register("exports", 0);
        assert!(!text(&releases).contains("exports"), "{}", text(&releases));
        exports.add(1, 1);
        let shown = text(&releases);
        assert!(
            shown.contains("counted_total{policy=\"exports\",result=\"not_held\"} 1"),
            "{shown}"
        );
        assert!(!shown.contains("released"), "{shown}");
        let _ = releases.register("api", 0b01);
        assert!(text(&releases).contains("{policy=\"api\",result=\"released\"} 0"));
    }

    /// Names a request brings are counted up to the bound, then under the other name; a name
    /// registered (a configured rule) and brought by requests shares its counts.
    #[test]
    fn names_requests_bring_are_bounded_and_share_a_registered_name() {
        let rules = ByName::new(["key", "stat"], &ENVOY_STATS);
        let configured = rules.register("web.user", 0b1_1111);
        rules.add_by_name("web.user", 0, 2, 2, "(other)");
        rules.add_by_name("web.user_u", 0, 1, 2, "(other)");
        rules.add_by_name("web.user_v", 0, 5, 2, "(other)");
        rules.add_by_name("web.user_w", 2, 1, 2, "(other)");
        configured.add(0, 1);
        let shown = text(&rules);
        for line in [
            "counted_total{key=\"web.user\",stat=\"total_hits\"} 3",
            "counted_total{key=\"web.user\",stat=\"near_limit\"} 0",
            "counted_total{key=\"web.user_u\",stat=\"total_hits\"} 1",
            "counted_total{key=\"(other)\",stat=\"total_hits\"} 5",
            "counted_total{key=\"(other)\",stat=\"over_limit\"} 1",
        ] {
            assert!(shown.contains(line), "{line} in\n{shown}");
        }
        assert!(!shown.contains("web.user_v"), "{shown}");
        assert!(
            !shown.contains("global_shadow_mode"),
            "not shown from zero: {shown}"
        );
        assert!(
            !shown.contains("{key=\"web.user_u\",stat=\"within_limit\"}"),
            "{shown}"
        );
    }
}
