//! Direct (unkeyed) limiters: every algorithm beside governor, a `Mutex` token bucket and the
//! floor (clock, atomic load, compare-exchange) in the same groups, so one run gives the
//! ratios. Single thread allow and deny, 2 threads on one limiter, the algorithm alone on a
//! caller-supplied `now`, the same on governor's TSC clock source and on the coarse clock, and
//! the clocks alone.

use std::hint::black_box;
use std::time::Duration;

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use governor::RateLimiter;
use governor::clock::FakeRelativeClock;
use limiter_benches::{
    Floor, MutexBucket, TscClock, allow_quota, deny_quota, group, never_limit, on_threads,
    token_bucket_allow, window_allow,
};
use limiter_core::{
    Algorithm, Clock, CoarseClock, DirectLimiter, Limit, ManualClock, MonotonicClock,
};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_token_bucket::Gcra;

type Check = Box<dyn Fn() -> bool + Sync>;

fn checker<A: Algorithm + 'static, C: Clock + 'static>(limit: Limit, clock: C) -> Check {
    let limiter = DirectLimiter::<A, C>::with_clock(limit, clock).expect("valid");
    Box::new(move || limiter.check().expect("valid").is_allowed())
}

/// Our three algorithms, each with a limit that admits every call of a bench loop.
fn admitting<C: Clock + Clone + 'static>(clock: &C) -> [(&'static str, Check); 3] {
    [
        (
            "token_bucket",
            checker::<Gcra, C>(token_bucket_allow(), clock.clone()),
        ),
        (
            "sliding_window",
            checker::<SlidingCounter, C>(window_allow(), clock.clone()),
        ),
        (
            "fixed_window",
            checker::<FixedCounter, C>(window_allow(), clock.clone()),
        ),
    ]
}

/// Our three algorithms on `clock`, drained so every call is denied.
fn denying<C: Clock + Clone + 'static>(clock: &C) -> [(&'static str, Check); 3] {
    let drained = |check: Check| {
        let _ = check();
        check
    };
    [
        (
            "token_bucket",
            drained(checker::<Gcra, _>(never_limit(), clock.clone())),
        ),
        (
            "sliding_window",
            drained(checker::<SlidingCounter, _>(never_limit(), clock.clone())),
        ),
        (
            "fixed_window",
            drained(checker::<FixedCounter, _>(never_limit(), clock.clone())),
        ),
    ]
}

/// The allow groups, one thread and two threads on one limiter, for our algorithms on `clock`
/// beside governor on its default clock. `suffix` names the clock in the group names.
fn allow_groups<C: Clock + Clone + 'static>(c: &mut Criterion, suffix: &str, clock: &C) {
    let mut g = group(c, &format!("direct_allow_1_thread{suffix}"), 1);
    for (name, check) in admitting(clock) {
        g.bench_function(name, |b| b.iter(|| black_box(check())));
    }
    let theirs = RateLimiter::direct(allow_quota());
    g.bench_function("governor", |b| b.iter(|| black_box(theirs.check().is_ok())));
    let mutex = MutexBucket::new(clock.clone(), 1_000_000_000, 1_000_000_000);
    g.bench_function("mutex_token_bucket", |b| {
        b.iter(|| black_box(mutex.check()))
    });
    let floor = Floor::new(clock.clone());
    g.bench_function("floor", |b| b.iter(|| black_box(floor.check())));
    g.finish();

    let mut g = group(c, &format!("direct_allow_2_threads{suffix}"), 2);
    for (name, check) in admitting(clock) {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| on_threads(2, iters, &check))
        });
    }
    let theirs = RateLimiter::direct(allow_quota());
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| on_threads(2, iters, || theirs.check().is_ok()))
    });
    let mutex = MutexBucket::new(clock.clone(), 1_000_000_000, 1_000_000_000);
    g.bench_function("mutex_token_bucket", |b| {
        b.iter_custom(|iters| on_threads(2, iters, || mutex.check()))
    });
    let floor = Floor::new(clock.clone());
    g.bench_function("floor", |b| {
        b.iter_custom(|iters| on_threads(2, iters, || floor.check()))
    });
    g.finish();
}

fn allow(c: &mut Criterion) {
    allow_groups(c, "", &MonotonicClock::new());
}

fn deny(c: &mut Criterion) {
    let clock = MonotonicClock::new();
    let mut g = group(c, "direct_deny_1_thread", 1);
    for (name, check) in denying(&clock) {
        g.bench_function(name, |b| b.iter(|| black_box(check())));
    }
    let theirs = RateLimiter::direct(deny_quota());
    let _ = theirs.check();
    g.bench_function("governor", |b| b.iter(|| black_box(theirs.check().is_ok())));
    let mutex = drained_mutex(clock);
    g.bench_function("mutex_token_bucket", |b| {
        b.iter(|| black_box(mutex.check()))
    });
    let floor = Floor::new(clock);
    g.bench_function("floor", |b| b.iter(|| black_box(floor.read_only())));
    g.finish();

    deny_2_threads(c, "", &clock);
}

/// Two threads denied by one limiter, ours on `clock` beside governor on its default clock.
/// `suffix` names the clock in the group's name.
fn deny_2_threads<C: Clock + Clone + 'static>(c: &mut Criterion, suffix: &str, clock: &C) {
    let mut g = group(c, &format!("direct_deny_2_threads{suffix}"), 2);
    for (name, check) in denying(clock) {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| on_threads(2, iters, &check))
        });
    }
    let theirs = RateLimiter::direct(deny_quota());
    let _ = theirs.check();
    g.bench_function("governor", |b| {
        b.iter_custom(|iters| on_threads(2, iters, || theirs.check().is_ok()))
    });
    let mutex = drained_mutex(clock.clone());
    g.bench_function("mutex_token_bucket", |b| {
        b.iter_custom(|iters| on_threads(2, iters, || mutex.check()))
    });
    let floor = Floor::new(clock.clone());
    g.bench_function("floor", |b| {
        b.iter_custom(|iters| on_threads(2, iters, || floor.read_only()))
    });
    g.finish();
}

/// One per hour, taken: denies for the rest of the run.
fn drained_mutex<C: Clock>(clock: C) -> MutexBucket<C> {
    let mutex = MutexBucket::new(clock, 1, 1);
    let _ = mutex.check();
    mutex
}

fn bench_no_clock<A: Algorithm>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    limit: Limit,
    step: u64,
) {
    let limiter =
        DirectLimiter::<A, ManualClock>::with_clock(limit, ManualClock::new()).expect("valid");
    let mut now = 0u64;
    g.bench_function(name, |b| {
        b.iter(|| {
            now += step;
            black_box(limiter.check_at(1, now).expect("valid").is_allowed())
        })
    });
}

/// The algorithm and its compare-and-swap alone: `now` comes from the loop, not a clock.
/// Governor runs on its fake clock (one atomic add and load per call).
fn algorithm_only(c: &mut Criterion) {
    let mut g = group(c, "algorithm_allow_no_clock", 1);
    // One ns per call for the 1-per-ns bucket; 4 ns per call keeps 255-per-µs windows open.
    bench_no_clock::<Gcra>(&mut g, "token_bucket", token_bucket_allow(), 1);
    bench_no_clock::<SlidingCounter>(&mut g, "sliding_window", window_allow(), 4);
    bench_no_clock::<FixedCounter>(&mut g, "fixed_window", window_allow(), 4);
    let clock = FakeRelativeClock::default();
    let theirs = RateLimiter::direct_with_clock(allow_quota(), clock.clone());
    g.bench_function("governor", |b| {
        b.iter(|| {
            clock.advance(Duration::from_nanos(1));
            black_box(theirs.check().is_ok())
        })
    });
    g.finish();
}

/// On the TSC clock source governor uses by default (quanta), so the ratio compares limiters
/// rather than `Instant::now` against `rdtsc`; on the coarse clock (refreshed every
/// millisecond by its thread, also denying on two threads); and the clocks alone.
fn same_clock(c: &mut Criterion) {
    allow_groups(c, "_tsc_clock", &TscClock::new());
    let coarse = CoarseClock::refreshed_every(Duration::from_millis(1)).expect("a thread");
    allow_groups(c, "_coarse_clock", &coarse);
    deny_2_threads(c, "_coarse_clock", &coarse);
    let mut g = group(c, "clock_read", 1);
    let (monotonic, tsc) = (MonotonicClock::new(), TscClock::new());
    g.bench_function("monotonic_clock_instant", |b| {
        b.iter(|| black_box(monotonic.now()))
    });
    g.bench_function("tsc_clock_quanta", |b| b.iter(|| black_box(tsc.now())));
    g.bench_function("coarse_clock", |b| b.iter(|| black_box(coarse.now())));
    g.finish();
}

criterion_group!(benches, allow, deny, algorithm_only, same_clock);
criterion_main!(benches);
