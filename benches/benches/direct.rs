//! Direct (unkeyed) limiters: every algorithm beside its peers (governor, and the `ratelimit`
//! crate's lock-free token bucket, each on its own default clock), a `Mutex` token bucket and
//! the floor (clock, atomic load, compare-exchange) in the same groups, so one run gives the
//! ratios. The unsuffixed groups run ours on the clock a user gets by naming none
//! (`DefaultClock`); `_os_clock` and `_coarse_clock` groups show the other clocks. Also: the
//! algorithm alone on a caller-supplied `now`, and the clocks alone. Every subject is called
//! through static dispatch, as a user calls it.

use std::hint::black_box;
use std::time::Duration;

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use governor::RateLimiter;
use governor::clock::FakeRelativeClock;
use limiter_benches::{
    Floor, MutexBucket, allow_quota, deny_quota, group, never_limit, on_threads,
    token_bucket_allow, window_allow,
};
use limiter_core::{
    Algorithm, Clock, CoarseClock, DefaultClock, DirectLimiter, Limit, ManualClock, MonotonicClock,
};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_token_bucket::Gcra;

/// The `ratelimit` crate's bucket: `rate` tokens a `period`, `burst` at most, full.
fn ratelimit_bucket(rate: u64, period: Duration, burst: u64) -> ratelimit::Ratelimiter {
    ratelimit::Ratelimiter::builder(rate)
        .period(period)
        .max_tokens(burst)
        .initial_available(burst)
        .build()
        .expect("valid")
}

/// One of our limiters, on one thread and on two.
fn ours<A: Algorithm, C: Clock>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    limiter: &DirectLimiter<A, C>,
    threads: usize,
) {
    let check = || limiter.check().expect("valid").is_allowed();
    if threads == 1 {
        g.bench_function(name, |b| b.iter(|| black_box(check())));
    } else {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| on_threads(threads, iters, check))
        });
    }
}

/// `call` as a subject of `g`, on one thread or on `threads`.
fn subject(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    threads: usize,
    call: impl Fn() -> bool + Sync,
) {
    if threads == 1 {
        g.bench_function(name, |b| b.iter(|| black_box(call())));
    } else {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| on_threads(threads, iters, &call))
        });
    }
}

/// Our three algorithms on `clock` (admitting every call) beside the peers, on `threads`.
fn allow_group<C: Clock + Clone>(c: &mut Criterion, name: &str, clock: &C, threads: usize) {
    let mut g = group(c, name, threads as u64);
    let limiter = |limit| DirectLimiter::<Gcra, C>::with_clock(limit, clock.clone());
    ours(
        &mut g,
        "token_bucket",
        &limiter(token_bucket_allow()).expect("valid"),
        threads,
    );
    let sliding = DirectLimiter::<SlidingCounter, C>::with_clock(window_allow(), clock.clone());
    ours(&mut g, "sliding_window", &sliding.expect("valid"), threads);
    let fixed = DirectLimiter::<FixedCounter, C>::with_clock(window_allow(), clock.clone());
    ours(&mut g, "fixed_window", &fixed.expect("valid"), threads);
    let governor = RateLimiter::direct(allow_quota());
    subject(&mut g, "governor", threads, || governor.check().is_ok());
    let bucket = ratelimit_bucket(1_000_000_000, Duration::from_secs(1), 1_000_000_000);
    subject(&mut g, "ratelimit", threads, || bucket.try_wait().is_ok());
    let mutex = MutexBucket::new(clock.clone(), 1_000_000_000, 1_000_000_000);
    subject(&mut g, "mutex_token_bucket", threads, || mutex.check());
    let floor = Floor::new(clock.clone());
    subject(&mut g, "floor", threads, || floor.check());
    g.finish();
}

/// Our three algorithms on `clock`, drained so every call is denied, beside the peers.
fn deny_group<C: Clock + Clone>(c: &mut Criterion, name: &str, clock: &C, threads: usize) {
    let mut g = group(c, name, threads as u64);
    let tb = DirectLimiter::<Gcra, C>::with_clock(never_limit(), clock.clone()).expect("valid");
    let sw = DirectLimiter::<SlidingCounter, C>::with_clock(never_limit(), clock.clone())
        .expect("valid");
    let fw =
        DirectLimiter::<FixedCounter, C>::with_clock(never_limit(), clock.clone()).expect("valid");
    let _ = (tb.check(), sw.check(), fw.check());
    ours(&mut g, "token_bucket", &tb, threads);
    ours(&mut g, "sliding_window", &sw, threads);
    ours(&mut g, "fixed_window", &fw, threads);
    let governor = RateLimiter::direct(deny_quota());
    let _ = governor.check();
    subject(&mut g, "governor", threads, || governor.check().is_ok());
    // One an hour, taken: the `ratelimit` bucket's refill never reaches a whole token.
    let bucket = ratelimit_bucket(1, Duration::from_secs(3_600), 1);
    let _ = bucket.try_wait();
    subject(&mut g, "ratelimit", threads, || bucket.try_wait().is_ok());
    let mutex = MutexBucket::new(clock.clone(), 1, 1);
    let _ = mutex.check();
    subject(&mut g, "mutex_token_bucket", threads, || mutex.check());
    let floor = Floor::new(clock.clone());
    subject(&mut g, "floor", threads, || floor.read_only());
    g.finish();
}

/// On the clock a user gets: the targets' groups.
fn default_clock(c: &mut Criterion) {
    let clock = DefaultClock::new();
    allow_group(c, "direct_allow_1_thread", &clock, 1);
    allow_group(c, "direct_allow_2_threads", &clock, 2);
    deny_group(c, "direct_deny_1_thread", &clock, 1);
    deny_group(c, "direct_deny_2_threads", &clock, 2);
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

/// On the OS clock (`MonotonicClock`, `Instant`) and on the coarse clock (refreshed every
/// millisecond by its thread); and the clocks alone.
fn other_clocks(c: &mut Criterion) {
    let os = MonotonicClock::new();
    allow_group(c, "direct_allow_1_thread_os_clock", &os, 1);
    allow_group(c, "direct_allow_2_threads_os_clock", &os, 2);
    let coarse = CoarseClock::refreshed_every(Duration::from_millis(1)).expect("a thread");
    allow_group(c, "direct_allow_1_thread_coarse_clock", &coarse, 1);
    allow_group(c, "direct_allow_2_threads_coarse_clock", &coarse, 2);
    deny_group(c, "direct_deny_2_threads_coarse_clock", &coarse, 2);
    let mut g = group(c, "clock_read", 1);
    let default = DefaultClock::new();
    g.bench_function("default_clock", |b| b.iter(|| black_box(default.now())));
    g.bench_function("monotonic_clock_instant", |b| {
        b.iter(|| black_box(os.now()))
    });
    g.bench_function("coarse_clock", |b| b.iter(|| black_box(coarse.now())));
    g.finish();
}

criterion_group!(benches, default_clock, algorithm_only, other_clocks);
criterion_main!(benches);
