//! Redis killed in the middle of load and restarted, for each failure policy; a Redis too slow
//! to answer; and the circuit breaker. Every call must come back (no panic, no hang past the
//! timeout), be answered by the configured policy while Redis is out, and go back to Redis
//! once it is up again.

use limiter_testkit::redis_server as common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use limiter_core::{Limit, ManualClock};
use limiter_redis::{
    BackendError, BreakerConfig, Kind, OnFailure, Origin, RedisBackend, RedisDecision, RedisLimiter,
};
use limiter_stack::Outcome;

const TIMEOUT: Duration = Duration::from_millis(100);
/// Far longer than any call may take: a call slower than this is a hang.
const HANG: Duration = Duration::from_secs(3);

async fn call(limiter: &RedisLimiter, key: &str) -> RedisDecision {
    tokio::time::timeout(HANG, limiter.check(key))
        .await
        .expect("a call hung past its timeout")
        .expect("the call is valid")
}

fn from_policy(policy: OnFailure, d: &RedisDecision) -> bool {
    match policy {
        OnFailure::Open => d.failed_open() && d.is_allowed(),
        OnFailure::Closed => d.failed_closed() && d.is_denied(),
        OnFailure::Fallback => {
            d.origin() == Some(Origin::Fallback)
                && d.backend_error().is_some()
                && d.decision().is_some()
        }
    }
}

async fn kill_and_restart_under_load(policy: OnFailure) {
    let mut server = common::RedisServer::start();
    // The breaker runs on a manual clock; decisions use Redis TIME.
    let clock = ManualClock::new();
    let backend = RedisBackend::builder(server.url())
        .clock(clock.clone())
        .timeout(TIMEOUT)
        .breaker(BreakerConfig {
            failures_to_open: 3,
            open_for: Duration::from_secs(1),
        })
        .connect()
        .await
        .unwrap();
    let limiter = Arc::new(
        RedisLimiter::builder(&backend, "outage")
            .limit(Kind::TokenBucket, Limit::per_hour(1_000_000))
            .on_failure(policy)
            .build()
            .unwrap(),
    );
    assert_eq!(call(&limiter, "warm").await.origin(), Some(Origin::Remote));

    // Load: 8 tasks calling without pause until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let (limiter, stop) = (Arc::clone(&limiter), Arc::clone(&stop));
            tokio::spawn(async move {
                let (mut redis, mut policy_answers) = (0_u64, 0_u64);
                while !stop.load(Ordering::Relaxed) {
                    let d = call(&limiter, &format!("load-{t}")).await;
                    match d.origin() {
                        Some(Origin::Remote) => redis += 1,
                        _ if from_policy(policy, &d) => policy_answers += 1,
                        _ => panic!("unexpected answer during the outage: {d:?}"),
                    }
                    // An open breaker answers without awaiting anything: let the test run.
                    tokio::task::yield_now().await;
                }
                (redis, policy_answers)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    server.kill();

    // Down: answers come from the policy, each within the timeout.
    for _ in 0..5 {
        let started = Instant::now();
        let d = call(&limiter, "probe").await;
        assert!(from_policy(policy, &d), "{policy:?}: {d:?}");
        assert!(
            d.backend_error().is_some_and(BackendError::is_outage),
            "{d:?}"
        );
        assert!(started.elapsed() < HANG);
    }
    // The breaker is open: calls no longer reach for Redis.
    let stats = backend.stats();
    assert!(stats.breaker_open, "{stats:?}");
    let trips = stats.round_trips;
    for _ in 0..20 {
        let d = call(&limiter, "probe").await;
        assert!(
            matches!(d.backend_error(), Some(BackendError::CircuitOpen { .. })),
            "{d:?}"
        );
    }
    assert_eq!(
        backend.stats().round_trips,
        trips,
        "an open breaker sends nothing"
    );

    // Up again: once the breaker's second has passed, a probe finds Redis and calls go back.
    server.restart();
    let mut recovered = false;
    for _ in 0..100 {
        clock.advance(Duration::from_secs(1));
        if call(&limiter, "probe").await.origin() == Some(Origin::Remote) {
            recovered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // let the connection come back
    }
    assert!(recovered, "{policy:?}: never went back to Redis");
    assert!(!backend.stats().breaker_open);
    tokio::time::sleep(Duration::from_millis(100)).await;
    stop.store(true, Ordering::Relaxed);
    let (mut redis, mut policy_answers) = (0, 0);
    for task in tasks {
        let (r, p) = task.await.expect("no task panicked");
        redis += r;
        policy_answers += p;
    }
    assert!(
        redis > 0 && policy_answers > 0,
        "redis {redis}, policy {policy_answers}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_survives_a_kill_and_recovers() {
    kill_and_restart_under_load(OnFailure::Open).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_closed_survives_a_kill_and_recovers() {
    kill_and_restart_under_load(OnFailure::Closed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fallback_survives_a_kill_and_recovers() {
    kill_and_restart_under_load(OnFailure::Fallback).await;
}

#[tokio::test]
async fn the_fallback_enforces_the_same_limits_locally() {
    let mut server = common::RedisServer::start();
    let clock = ManualClock::new();
    let backend = RedisBackend::builder(server.url())
        .clock(clock.clone())
        .timeout(TIMEOUT)
        .connect()
        .await
        .unwrap();
    let limiter = RedisLimiter::builder(&backend, "local")
        .limit(Kind::FixedWindow, Limit::per_hour(5))
        .build()
        .unwrap();
    let remote = call(&limiter, "k").await;
    assert_eq!(remote.origin(), Some(Origin::Remote));
    assert!(
        matches!(
            Outcome::from(remote),
            Outcome::Decided { failure: None, .. }
        ),
        "Redis decided: no failure"
    );
    server.kill();
    let mut admitted = 0;
    for _ in 0..10 {
        let d = call(&limiter, "k").await;
        assert_eq!(d.origin(), Some(Origin::Fallback), "{d:?}");
        // Through the seam, the fallback's answer says what sent it there.
        let why = d.backend_error().expect("a fallback's failure").to_string();
        let Outcome::Decided {
            failure: Some(failure),
            ..
        } = Outcome::from(d.clone())
        else {
            panic!("a fallback's answer carries its failure: {d:?}");
        };
        assert_eq!(failure.to_string(), why);
        admitted += u32::from(d.is_allowed());
        if d.is_denied() {
            assert!(d.decision().unwrap().retry_after() > Duration::ZERO);
        }
    }
    assert_eq!(
        admitted, 5,
        "the local stack holds the same 5 per hour on its own"
    );
}

/// Three nodes of one fleet, each its own backend and fallback: told the fleet's size, they
/// admit at most the limit between them while Redis is out (by default each would admit the
/// whole limit), and go back to the shared count when it returns.
#[tokio::test]
async fn a_fleet_falling_back_admits_at_most_the_limit_between_its_nodes() {
    let mut server = common::RedisServer::start();
    let clock = ManualClock::new();
    let node = |fleet: u64| {
        let (url, clock) = (server.url(), clock.clone());
        async move {
            let backend = RedisBackend::builder(url)
                .clock(clock)
                .timeout(TIMEOUT)
                .connect()
                .await
                .unwrap();
            RedisLimiter::builder(&backend, "fleet")
                .limit(Kind::FixedWindow, Limit::per_hour(30))
                .limit(Kind::TokenBucket, Limit::per_hour(60).with_burst(30))
                .fleet_size(fleet)
                .build()
                .unwrap()
        }
    };
    let nodes = [node(3).await, node(3).await, node(3).await];
    let alone = node(1).await;
    for n in &nodes {
        assert_eq!(call(n, "k").await.origin(), Some(Origin::Remote));
    }
    server.kill();
    let mut admitted = 0;
    for _ in 0..20 {
        for n in &nodes {
            let d = call(n, "other").await;
            assert_eq!(d.origin(), Some(Origin::Fallback), "{d:?}");
            admitted += u32::from(d.is_allowed());
        }
    }
    assert_eq!(admitted, 30, "three nodes share the 30 while Redis is out");
    let mut single = 0;
    for _ in 0..40 {
        single += u32::from(call(&alone, "other").await.is_allowed());
    }
    assert_eq!(
        single, 30,
        "a node told nothing of its fleet enforces the whole limit"
    );

    // Redis back: the nodes count on it again, from its state.
    server.restart();
    clock.advance(Duration::from_secs(60));
    let mut back = false;
    for _ in 0..50 {
        if call(&nodes[0], "k").await.origin() == Some(Origin::Remote) {
            back = true;
            break;
        }
        clock.advance(Duration::from_secs(1));
    }
    assert!(back, "the nodes went back to Redis");
}

#[test]
fn a_fleet_size_that_leaves_a_node_nothing_is_refused_when_built() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let backend = runtime
        .block_on(
            RedisBackend::builder(format!("redis://127.0.0.1:{}", common::free_port())).connect(),
        )
        .unwrap();
    for (fleet, wanted) in [(0, "no node"), (11, "at most 10")] {
        let error = RedisLimiter::builder(&backend, "tiny")
            .limit(Kind::FixedWindow, Limit::per_minute(10))
            .fleet_size(fleet)
            .build()
            .unwrap_err();
        assert!(
            matches!(error, limiter_redis::BuildError::FleetSize { .. }),
            "{error}"
        );
        assert!(error.to_string().contains(wanted), "{error}");
    }
}

#[tokio::test]
async fn a_slow_redis_costs_one_timeout_not_a_hang() {
    let server =
        common::RedisServer::start_with(vec!["--enable-debug-command".into(), "yes".into()]);
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_millis(50))
        .connect()
        .await
        .unwrap();
    let limiter = RedisLimiter::builder(&backend, "slow")
        .limit(Kind::SlidingWindow, Limit::per_second(10))
        .on_failure(OnFailure::Open)
        .build()
        .unwrap();
    assert_eq!(call(&limiter, "k").await.origin(), Some(Origin::Remote));
    // Block the server for a second from another connection.
    let url = server.url();
    let blocker = std::thread::spawn(move || {
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: redis::RedisResult<()> = redis::cmd("DEBUG").arg("SLEEP").arg("1").query(&mut conn);
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let d = call(&limiter, "k").await;
    let took = started.elapsed();
    assert!(d.failed_open(), "{d:?}");
    assert_eq!(
        d.backend_error(),
        Some(&BackendError::Timeout {
            after: Duration::from_millis(50)
        })
    );
    assert!(
        took < Duration::from_millis(900),
        "waited {took:?}, past the timeout"
    );
    blocker.join().unwrap();
    let mut back = false;
    for _ in 0..50 {
        if call(&limiter, "k").await.origin() == Some(Origin::Remote) {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(back, "answers came back from Redis once it was responsive");
}

#[tokio::test]
async fn a_backend_can_start_while_redis_is_down() {
    let port = common::free_port();
    let backend = RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(TIMEOUT)
        .connect()
        .await
        .expect("a single server is connected lazily");
    let limiter = RedisLimiter::builder(&backend, "early")
        .limit(Kind::TokenBucket, Limit::per_second(1))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let d = call(&limiter, "k").await;
    assert!(d.failed_closed(), "{d:?}");
    assert!(
        d.decision().is_none(),
        "fail closed consults no limit: {d:?}"
    );
}
