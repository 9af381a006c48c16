//! The Redis path against its floor: a raw `EVALSHA` of the same script with the same keys and
//! arguments, through the same client and connection, in the same run.
//!
//! - `sequential`: one call at a time: the limiter against the raw script call.
//! - `in_flight_50`: 50 calls multiplexed on one connection at once (throughput per call);
//!   the limiter coalesces them into a few script calls (`max_in_flight`, default 4).
//! - `in_flight_50_latency`: the same 50 at once, each timed to its own answer; an
//!   iteration's time is their median latency.
//! - `stack`: a 3-layer stack (one round trip) against a 1-limit decision.
//! - `deny_cache`: an abusive key answered locally against the round trip it replaces; the
//!   ratio of calls to round trips is printed.
//! - `leased`: a hot key on a leased limiter (`Slack::percent(1)`, the default clock and
//!   store) against an in-process keyed check (`KeyedTokenBucket<String>`) in the same run;
//!   the script calls per decision are printed and written to `target/bench-counts.csv`.
//! - Paired medians, printed: on this noisy 2-core machine the loopback round trip drifts by tens
//!   of microseconds between criterion groups, so the ratios the targets name are also measured
//!   with the two subjects interleaved call by call, 20,000 samples each.
//!
//! Starts its own `redis-server` on a free loopback port (`$REDIS_SERVER` or the `PATH`), and
//! skips every case if there is none.

use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use futures_util::future::join_all;
use limiter_core::Limit;
use limiter_redis::{
    Kind, Lease, OnFailure, RedisBackend, RedisLayer, RedisLimit, RedisLimiter, RedisStack, SCRIPT,
    Slack,
};
use limiter_token_bucket::KeyedTokenBucket;

/// A limit the benchmark never exhausts.
fn roomy() -> Limit {
    Limit::per_second(1_000_000)
}

struct Req(u64);

fn redis_benches(c: &mut Criterion) {
    let Some(server) = limiter_benches::RedisProcess::start() else {
        eprintln!("redis: no redis-server to start; skipping the Redis benchmarks");
        return;
    };
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let backend = rt
        .block_on(
            RedisBackend::builder(&url)
                .timeout(Duration::from_secs(1))
                .connect(),
        )
        .unwrap();
    let one = RedisLimiter::builder(&backend, "bench")
        .limit(Kind::TokenBucket, roomy())
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let stack = RedisStack::builder(&backend, "bench-stack")
        .layer(
            RedisLayer::keyed("user", |r: &Req| Some(r.0.to_string()))
                .limit(Kind::TokenBucket, roomy()),
        )
        .layer(
            RedisLayer::keyed("ip", |r: &Req| Some((r.0 % 7).to_string()))
                // 40k per second, above any rate one connection reaches here, so it never
                // denies (and the call is never answered by the local deny cache). A sliding
                // window on Redis holds at most 8,191 per 1 s window; shorter windows hold more
                // per second.
                .limit(
                    Kind::SlidingWindow,
                    Limit::new(4_000, Duration::from_millis(100)),
                ),
        )
        .layer(RedisLayer::global("all").limit(Kind::FixedWindow, roomy()))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    // The raw floor: the same script through a connection of the same client.
    let raw_conn = rt
        .block_on(
            redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection(),
        )
        .unwrap();
    let script = redis::Script::new(SCRIPT);
    let key = one.redis_keys("k").remove(0);
    // The argument the limiter sends for one call of one limit.
    let argument = RedisLimit::new(Kind::TokenBucket, roomy())
        .unwrap()
        .call_argument(1);
    let raw_call = || {
        let mut conn = raw_conn.clone();
        let mut invocation = script.prepare_invoke();
        invocation.key(key.as_str());
        invocation.arg(argument.as_slice());
        async move {
            invocation
                .invoke_async::<redis::Value>(&mut conn)
                .await
                .unwrap()
        }
    };

    paired(
        &rt,
        "limiter_1_limit / raw_evalsha",
        || one.check("k"),
        || async {
            raw_call().await;
            Ok::<(), limiter_redis::CallError>(())
        },
    );
    paired(
        &rt,
        "stack_3_layers / limiter_1_limit",
        || stack.check(&Req(42)),
        || one.check("k"),
    );

    let mut group = c.benchmark_group("redis/sequential");
    group.throughput(Throughput::Elements(1));
    group.bench_function("raw_evalsha", |b| b.iter(|| rt.block_on(raw_call())));
    group.bench_function("limiter_1_limit", |b| {
        b.iter(|| rt.block_on(one.check("k")).unwrap())
    });
    group.bench_function("stack_3_layers", |b| {
        b.iter(|| rt.block_on(stack.check(&Req(42))).unwrap())
    });
    group.finish();

    let mut group = c.benchmark_group("redis/in_flight_50");
    group.throughput(Throughput::Elements(50));
    group.bench_function("raw_evalsha", |b| {
        b.iter(|| rt.block_on(join_all((0..50).map(|_| raw_call()))))
    });
    group.bench_function("limiter_1_limit", |b| {
        b.iter(|| rt.block_on(join_all((0..50).map(|_| one.check("k")))))
    });
    group.finish();

    // Each iteration: 50 calls at once, each timed from its start to its own answer; the
    // iteration's time is the median of the 50 (so criterion's median is a median latency).
    let mut group = c.benchmark_group("redis/in_flight_50_latency");
    group.bench_function("raw_evalsha", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    median_latency(&rt, || async {
                        raw_call().await;
                    })
                })
                .sum()
        })
    });
    group.bench_function("limiter_1_limit", |b| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    median_latency(&rt, || async {
                        one.check("k").await.unwrap();
                    })
                })
                .sum()
        })
    });
    group.finish();

    // An abusive key: far over a small limit, hammered.
    let abuse_backend = rt.block_on(RedisBackend::builder(&url).connect()).unwrap();
    let abused = RedisLimiter::builder(&abuse_backend, "abuse")
        .limit(Kind::TokenBucket, Limit::per_minute(10))
        .build()
        .unwrap();
    let mut group = c.benchmark_group("redis/deny_cache");
    group.bench_function("abusive_key", |b| {
        b.iter(|| rt.block_on(abused.check("abuser")).unwrap())
    });
    group.finish();
    let stats = abuse_backend.stats();
    println!(
        "redis/deny_cache: {} calls on the abusive key took {} round trips ({}x fewer)",
        stats.deny_cache_hits + stats.round_trips,
        stats.round_trips,
        (stats.deny_cache_hits + stats.round_trips) / stats.round_trips.max(1)
    );
    leased_benches(c, &rt, &url);
    drop(server);
}

/// A limit no single thread exhausts while it is measured (1e9 per second, 1e9 burst).
fn hot() -> Limit {
    Limit::per_second(1_000_000_000)
}

/// A hot key on a leased limiter beside an in-process keyed check, and the script calls each
/// leased decision cost: with a slack of 1% of the limit (what docs/redis.md suggests) and with a
/// slack of 10,000 units (0.001% here), whose renewals come a hundred times as often.
fn leased_benches(c: &mut Criterion, rt: &tokio::runtime::Runtime, url: &str) {
    let leased = |name: &str, slack: Slack| {
        let backend = rt
            .block_on(
                RedisBackend::builder(url)
                    .timeout(Duration::from_secs(1))
                    .connect(),
            )
            .unwrap();
        let _guard = rt.enter();
        RedisLimiter::builder(&backend, name)
            .limit(Kind::TokenBucket, hot())
            .on_failure(OnFailure::Closed)
            .build()
            .unwrap()
            .leased(Lease::new(slack))
            .unwrap()
    };
    let subjects = [
        ("leased_hot_key", leased("bench-leased", Slack::percent(1))),
        (
            "leased_hot_key_slack_10k",
            leased("bench-leased-10k", Slack::units(10_000)),
        ),
    ];
    let keyed: KeyedTokenBucket<String> = KeyedTokenBucket::new(hot()).unwrap();
    let decisions = [std::cell::Cell::new(0u64), std::cell::Cell::new(0u64)];
    let mut group = c.benchmark_group("redis/leased");
    group.throughput(Throughput::Elements(1));
    group.bench_function("in_process_keyed", |b| {
        b.iter(|| keyed.check_key("k").unwrap().is_allowed())
    });
    for ((name, limiter), decided) in subjects.iter().zip(&decisions) {
        group.bench_function(*name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        let d = limiter.check("k").await.unwrap();
                        assert!(d.is_allowed());
                    }
                    decided.set(decided.get() + iters);
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
    let counts = limiter_benches::target_dir().join("bench-counts.csv");
    let mut lines = String::new();
    for ((name, limiter), decided) in subjects.iter().zip(&decisions) {
        let calls = limiter.stack().stack().backend().stats().round_trips;
        let per_decision = calls as f64 / decided.get().max(1) as f64;
        println!(
            "redis/leased/{name}: {} decisions took {calls} script calls ({per_decision:.2e} per decision)",
            decided.get()
        );
        lines.push_str(&format!("{name}_calls_per_decision,{per_decision}\n"));
    }
    let _ = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(counts)
        .and_then(|mut f| std::io::Write::write_all(&mut f, lines.as_bytes()));
}

/// 50 calls of `call` at once; the median of their latencies, each from the start to its own
/// answer.
fn median_latency<F, Fut>(rt: &tokio::runtime::Runtime, call: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let started = Instant::now();
    let mut done: Vec<Duration> = rt.block_on(join_all((0..50).map(|_| {
        let call = call();
        async move {
            call.await;
            started.elapsed()
        }
    })));
    done.sort();
    done[done.len() / 2]
}

/// Median latency of `subject` over `baseline`, interleaved call by call.
fn paired<A, B, FA, FB, TA, TB, E>(
    rt: &tokio::runtime::Runtime,
    name: &str,
    subject: FA,
    baseline: FB,
) where
    FA: Fn() -> A,
    FB: Fn() -> B,
    A: std::future::Future<Output = Result<TA, E>>,
    B: std::future::Future<Output = Result<TB, E>>,
    E: std::fmt::Debug,
{
    const SAMPLES: usize = 20_000;
    let (mut a, mut b) = (Vec::with_capacity(SAMPLES), Vec::with_capacity(SAMPLES));
    for _ in 0..SAMPLES {
        let started = Instant::now();
        rt.block_on(subject()).unwrap();
        a.push(started.elapsed());
        let started = Instant::now();
        rt.block_on(baseline()).unwrap();
        b.push(started.elapsed());
    }
    a.sort();
    b.sort();
    let (ma, mb) = (a[SAMPLES / 2], b[SAMPLES / 2]);
    println!(
        "redis/paired {name}: {ma:?} / {mb:?} = {:.3}x (medians, interleaved)",
        ma.as_secs_f64() / mb.as_secs_f64()
    );
}

criterion_group!(benches, redis_benches);
criterion_main!(benches);
