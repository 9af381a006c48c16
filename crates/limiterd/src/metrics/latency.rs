//! How long each decision request took, as a Prometheus histogram kept without a lock and
//! without a shared cache line: `prometheus-client`'s `Histogram` takes one mutex per
//! observation, which every request on every core would share. Here each thread counts into
//! its shard's counts (`shards.rs`), cache-padded (its bucket's count, and the sum in whole
//! nanoseconds, exact: two relaxed atomic adds), and a scrape adds the shards up. Two threads
//! observing at once into one set of counters took 150-200 ns an observation, into a shard
//! each 21 ns (a scratch benchmark on the 2-core VM; the mutex 25 ns alone, 160 shared). The
//! count a scrape shows is the sum of its buckets, so the two always agree; the sum may lag
//! them by the observations in flight.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_utils::CachePadded;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::{MetricType, TypedMetric};

use crate::shards::{self, SHARDS};

/// The most buckets a histogram has (its `+Inf` one included).
const MAX_BUCKETS: usize = 16;

/// A histogram of durations over fixed buckets; clones share it.
#[derive(Clone, Debug)]
pub(super) struct Latency {
    inner: Arc<Buckets>,
}

#[derive(Debug)]
struct Buckets {
    /// Upper bounds in seconds, as the exposition prints them.
    bounds_s: &'static [f64],
    /// The same in nanoseconds, as observations are compared.
    bounds_nanos: [u64; MAX_BUCKETS],
    shards: [CachePadded<Shard>; SHARDS],
}

/// One shard's counts: per bound, the observations at most it and above the one before, then
/// the rest (`+Inf`); and their sum in nanoseconds.
#[derive(Debug, Default)]
struct Shard {
    counts: [AtomicU64; MAX_BUCKETS],
    sum_nanos: AtomicU64,
}

impl Latency {
    /// A histogram over `bounds_s`, ascending seconds (at most 15: the rest are dropped).
    pub(super) fn new(bounds_s: &'static [f64]) -> Self {
        let bounds_s = &bounds_s[..bounds_s.len().min(MAX_BUCKETS - 1)];
        let mut bounds_nanos = [u64::MAX; MAX_BUCKETS];
        for (nanos, s) in bounds_nanos.iter_mut().zip(bounds_s) {
            // Float to integer saturates: a bound past u64 nanoseconds is u64::MAX.
            *nanos = (s * 1e9).round() as u64;
        }
        Self {
            inner: Arc::new(Buckets {
                bounds_s,
                bounds_nanos,
                shards: Default::default(),
            }),
        }
    }

    /// Counts one request that took `took`.
    #[inline]
    pub(super) fn observe(&self, took: Duration) {
        let b = &*self.inner;
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let bucket = b.bounds_s.len().min(
            b.bounds_nanos
                .iter()
                .position(|&bound| nanos <= bound)
                .unwrap_or(MAX_BUCKETS - 1),
        );
        let shard = &b.shards[shards::this_thread()];
        // Relaxed: statistics, ordered with nothing; a scrape reads each word on its own.
        shard.counts[bucket].fetch_add(1, Ordering::Relaxed);
        // Relaxed: as above. Wraps only after 584 years of summed request time.
        shard.sum_nanos.fetch_add(nanos, Ordering::Relaxed);
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let b = &*self.inner;
        let total = |read: &dyn Fn(&Shard) -> &AtomicU64| -> u64 {
            b.shards
                .iter()
                // Relaxed: see `observe`.
                .map(|shard| read(shard).load(Ordering::Relaxed))
                .fold(0, u64::wrapping_add)
        };
        let buckets: Vec<(f64, u64)> = b
            .bounds_s
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .enumerate()
            .map(|(i, bound)| (bound, total(&|shard| &shard.counts[i])))
            .collect();
        let count = buckets.iter().map(|&(_, n)| n).fold(0, u64::wrapping_add);
        let sum = total(&|shard| &shard.sum_nanos) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}
