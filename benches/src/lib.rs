//! Shared setup for the criterion benchmarks in `benches/`: limits and quotas that always admit
//! or always deny, the benchmark group settings, a multi-threaded runner, and a TSC clock.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use governor::Quota;
use limiter_core::Limit;

/// One unit per ns: a token bucket never runs out in a bench loop.
pub fn token_bucket_allow() -> Limit {
    Limit::per_second(1_000_000_000).expect("valid")
}

/// 255 per µs: the most a sliding window of 1 µs supports, far above any loop's rate.
pub fn window_allow() -> Limit {
    Limit::from_nanos(255, 1_000).expect("valid")
}

/// Drained by one call and drained for the rest of the run.
pub fn never_limit() -> Limit {
    Limit::per_hour(1).expect("valid")
}

/// Governor's equivalent of [`token_bucket_allow`].
pub fn allow_quota() -> Quota {
    Quota::per_second(NonZeroU32::new(1_000_000_000).expect("non-zero"))
}

/// Governor's equivalent of [`never_limit`].
pub fn deny_quota() -> Quota {
    Quota::per_hour(NonZeroU32::MIN)
}

/// A group with `elements` calls per iteration and short, fixed times so a run stays brief.
pub fn group<'a>(c: &'a mut Criterion, name: &str, elements: u64) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(elements));
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    group
}

/// Runs `call` on `threads` threads, `iters` times each, and returns the slowest thread's wall
/// time: one criterion iteration is one call on every thread.
pub fn on_threads(threads: usize, iters: u64, call: impl Fn() -> bool + Sync) -> Duration {
    let start = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    let began = Instant::now();
                    for _ in 0..iters {
                        black_box(call());
                    }
                    began.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

/// A clock on the TSC through quanta, the source governor reads by default.
#[derive(Clone, Debug)]
pub struct TscClock {
    clock: quanta::Clock,
    epoch: u64,
}

impl TscClock {
    /// A TSC clock whose epoch is now.
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let epoch = clock.raw();
        Self { clock, epoch }
    }
}

impl Default for TscClock {
    fn default() -> Self {
        Self::new()
    }
}

impl limiter_core::Clock for TscClock {
    fn now(&self) -> u64 {
        self.clock.delta_as_nanos(self.epoch, self.clock.raw())
    }
}
