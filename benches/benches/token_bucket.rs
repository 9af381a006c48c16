//! The token bucket against governor, in the same groups so one run gives the ratio.
//!
//! Groups: direct allow and deny on one thread; 2 threads on one bucket (aggregate); keyed with
//! one hot key and with 1M distinct warm keys; and the algorithm alone on a manual clock.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{
    BenchmarkGroup, Criterion, Throughput, criterion_group, criterion_main, measurement::WallTime,
};
use governor::clock::FakeRelativeClock;
use governor::{Quota, RateLimiter};
use limiter_core::{Limit, ManualClock};
use limiter_token_bucket::{KeyedTokenBucket, TokenBucket};

/// Fast enough that a bench loop never runs out: one unit per ns.
const ALWAYS: u32 = 1_000_000_000;
const KEYS: u64 = 1_000_000;

fn always_limit() -> Limit {
    Limit::per_second(u64::from(ALWAYS)).expect("valid")
}

fn always_quota() -> Quota {
    Quota::per_second(NonZeroU32::new(ALWAYS).expect("non-zero"))
}

/// A limit that is drained by one call and stays drained for the whole run.
fn never_limit() -> Limit {
    Limit::per_hour(1).expect("valid")
}

fn never_quota() -> Quota {
    Quota::per_hour(NonZeroU32::MIN)
}

fn group<'a>(c: &'a mut Criterion, name: &str, elements: u64) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(elements));
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    group
}

fn direct_one_thread(c: &mut Criterion) {
    let mut g = group(c, "direct_allow_1_thread", 1);
    let ours = TokenBucket::new(always_limit()).expect("valid");
    g.bench_function("limiter", |b| {
        b.iter(|| black_box(ours.check().expect("valid").is_allowed()))
    });
    let theirs = RateLimiter::direct(always_quota());
    g.bench_function("governor", |b| b.iter(|| black_box(theirs.check().is_ok())));
    g.finish();

    let mut g = group(c, "direct_deny_1_thread", 1);
    let ours = TokenBucket::new(never_limit()).expect("valid");
    let _ = ours.check();
    g.bench_function("limiter", |b| {
        b.iter(|| black_box(ours.check().expect("valid").is_allowed()))
    });
    let theirs = RateLimiter::direct(never_quota());
    let _ = theirs.check();
    g.bench_function("governor", |b| b.iter(|| black_box(theirs.check().is_ok())));
    g.finish();
}

/// Runs `call` on `threads` threads, `iters` times each, and returns the wall time of the
/// slowest: one criterion iteration is one call on every thread.
fn on_threads(threads: usize, iters: u64, call: impl Fn() -> bool + Sync) -> Duration {
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

fn direct_two_threads(c: &mut Criterion) {
    for (name, ours, theirs) in [
        ("direct_allow_2_threads", always_limit(), always_quota()),
        ("direct_deny_2_threads", never_limit(), never_quota()),
    ] {
        let mut g = group(c, name, 2);
        let ours = TokenBucket::new(ours).expect("valid");
        let _ = ours.check();
        g.bench_function("limiter", |b| {
            b.iter_custom(|iters| {
                on_threads(2, iters, || ours.check().expect("valid").is_allowed())
            })
        });
        let theirs = RateLimiter::direct(theirs);
        let _ = theirs.check();
        g.bench_function("governor", |b| {
            b.iter_custom(|iters| on_threads(2, iters, || theirs.check().is_ok()))
        });
        g.finish();
    }
}

fn keyed(c: &mut Criterion) {
    let mut g = group(c, "keyed_hot_key", 1);
    let ours = KeyedTokenBucket::<u64>::new(always_limit()).expect("valid");
    g.bench_function("limiter", |b| {
        b.iter(|| black_box(ours.check_key(&7).expect("valid").is_allowed()))
    });
    let theirs = RateLimiter::dashmap(always_quota());
    g.bench_function("governor", |b| {
        b.iter(|| black_box(theirs.check_key(&7u64).is_ok()))
    });
    g.finish();

    let mut g = group(c, "keyed_1M_keys_warm", 1);
    let ours = KeyedTokenBucket::<u64>::new(always_limit()).expect("valid");
    let theirs = RateLimiter::dashmap(always_quota());
    for key in 0..KEYS {
        let _ = ours.check_key(&key);
        let _ = theirs.check_key(&key);
    }
    // A multiplicative step visits every key in an order the hardware prefetcher cannot follow.
    let mut key = 0u64;
    let mut next = move || {
        key = (key + 611_953) % KEYS;
        key
    };
    g.bench_function("limiter", |b| {
        b.iter(|| black_box(ours.check_key(&next()).expect("valid").is_allowed()))
    });
    g.bench_function("governor", |b| {
        b.iter(|| black_box(theirs.check_key(&next()).is_ok()))
    });
    g.finish();
}

/// The algorithm and its compare-and-swap alone, against governor on its fake clock (one
/// atomic load): the caller passes `now`, and one more ns per call keeps every call admitted.
fn algorithm_only(c: &mut Criterion) {
    let mut g = group(c, "algorithm_allow_no_clock", 1);
    let ours = TokenBucket::with_clock(always_limit(), ManualClock::new()).expect("valid");
    let mut now = 0u64;
    g.bench_function("limiter", |b| {
        b.iter(|| {
            now += 1;
            black_box(ours.check_at(1, now).expect("valid").is_allowed())
        })
    });
    let clock = FakeRelativeClock::default();
    let theirs = RateLimiter::direct_with_clock(always_quota(), clock.clone());
    g.bench_function("governor", |b| {
        b.iter(|| {
            clock.advance(Duration::from_nanos(1));
            black_box(theirs.check().is_ok())
        })
    });
    g.finish();
}

/// Our limiter on the same TSC clock source governor uses (quanta), so the ratio compares the
/// limiters rather than `Instant::now` against `rdtsc`.
#[derive(Clone, Debug)]
struct TscClock {
    clock: quanta::Clock,
    epoch: quanta::Instant,
}

impl TscClock {
    fn new() -> Self {
        let clock = quanta::Clock::new();
        let epoch = clock.now();
        Self { clock, epoch }
    }
}

impl limiter_core::Clock for TscClock {
    fn now(&self) -> u64 {
        u64::try_from(self.clock.now().duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }
}

fn same_clock(c: &mut Criterion) {
    let mut g = group(c, "direct_allow_1_thread_tsc_clock", 1);
    let ours = TokenBucket::with_clock(always_limit(), TscClock::new()).expect("valid");
    g.bench_function("limiter", |b| {
        b.iter(|| black_box(ours.check().expect("valid").is_allowed()))
    });
    let theirs = RateLimiter::direct(always_quota());
    g.bench_function("governor", |b| b.iter(|| black_box(theirs.check().is_ok())));
    g.finish();

    let mut g = group(c, "direct_allow_2_threads_tsc_clock", 2);
    let ours = TokenBucket::with_clock(always_limit(), TscClock::new()).expect("valid");
    g.bench_function("limiter", |b| {
        b.iter_custom(|iters| on_threads(2, iters, || ours.check().expect("valid").is_allowed()))
    });
    let theirs = RateLimiter::direct(always_quota());
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| on_threads(2, iters, || theirs.check().is_ok()))
    });
    g.finish();

    let mut g = group(c, "clock_read", 1);
    let std_clock = limiter_core::MonotonicClock::new();
    let tsc = TscClock::new();
    g.bench_function("monotonic_clock_instant", |b| {
        b.iter(|| black_box(limiter_core::Clock::now(&std_clock)))
    });
    g.bench_function("tsc_clock_quanta", |b| {
        b.iter(|| black_box(limiter_core::Clock::now(&tsc)))
    });
    g.finish();
}

criterion_group!(
    benches,
    direct_one_thread,
    direct_two_threads,
    keyed,
    algorithm_only,
    same_clock
);
criterion_main!(benches);
