//! Coalescing: many single decisions in flight on one backend share a few script calls, and
//! each is decided exactly as if sent alone, in some order: the limit is met exactly, every
//! admitted call saw its own state, callers that stop waiting strand nobody, and a Redis that
//! goes away mid-queue answers every queued caller through the failure policy.
//!
//! Time is injected and frozen, so nothing refills and every count is exact.

use limiter_testkit::redis_server as common;

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use limiter_core::{Limit, ManualClock};
use limiter_redis::{Kind, OnFailure, Origin, RedisBackend, RedisLimiter};

const START: u64 = 1_795_000_000_000_000_000;

async fn backend(url: &str, max_in_flight: usize) -> RedisBackend {
    RedisBackend::builder(url)
        .time_from(ManualClock::starting_at(START))
        .timeout(Duration::from_secs(5))
        .deny_cache(0)
        .max_in_flight(max_in_flight)
        .connect()
        .await
        .unwrap()
}

fn limiter(backend: &RedisBackend, name: &str, per_hour: u64) -> RedisLimiter {
    RedisLimiter::builder(backend, name)
        .limit(Kind::TokenBucket, Limit::per_hour(per_hour))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
}

/// 300 calls at once for 100 units: exactly 100 pass, each admitted call reports a different
/// `remaining` (it saw the state the ones before it left: 99 down to 0), and a handful of
/// script calls carried them all.
async fn exact_under_one_burst(max_in_flight: usize) {
    let server = common::RedisServer::start();
    let backend = backend(&server.url(), max_in_flight).await;
    let bucket = limiter(&backend, "burst", 100);
    let decisions = join_all((0..300).map(|_| bucket.check("k"))).await;
    let mut remaining: Vec<u64> = Vec::new();
    for d in &decisions {
        let d = d.as_ref().unwrap();
        assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
        if d.is_allowed() {
            remaining.push(d.decision().unwrap().remaining());
        }
    }
    remaining.sort_unstable();
    assert_eq!(remaining, (0..100).collect::<Vec<u64>>());
    let stats = backend.stats();
    // A few calls alone (one per slot), the rest in shared calls of up to 32: far fewer
    // script calls than decisions.
    assert!(
        stats.round_trips <= 40,
        "300 decisions took {} script calls",
        stats.round_trips
    );
    assert!(stats.coalesced >= 250, "{stats:?}");
    slots_come_back(&backend).await;
}

#[tokio::test]
async fn a_burst_on_one_thread_is_exact_and_shares_script_calls() {
    exact_under_one_burst(limiter_redis::DEFAULT_MAX_IN_FLIGHT).await;
}

#[tokio::test]
async fn one_call_in_flight_at_a_time_is_exact_too() {
    exact_under_one_burst(1).await;
}

/// 16 callers, each deciding again as soon as it is answered: after the first call, the
/// callers answered together queue together, so script calls fill (about one per round of
/// 16), where a call per free slot would carry two or three.
#[tokio::test]
async fn steady_callers_fill_their_calls() {
    let server = common::RedisServer::start();
    let backend = backend(&server.url(), limiter_redis::DEFAULT_MAX_IN_FLIGHT).await;
    let bucket = limiter(&backend, "steady", 1_000_000);
    let rounds = 50;
    join_all((0..16).map(|caller| {
        let bucket = &bucket;
        async move {
            for i in 0..rounds {
                let d = bucket.check(&format!("{caller}-{i}")).await.unwrap();
                assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
                assert!(d.is_allowed());
            }
        }
    }))
    .await;
    let stats = backend.stats();
    let decisions = 16 * rounds;
    assert!(
        stats.round_trips * 8 <= decisions,
        "{decisions} decisions took {} script calls",
        stats.round_trips
    );
    slots_come_back(&backend).await;
}

/// Tasks on two worker threads, many keys, costs of 1 to 3: every key admits exactly its limit
/// in units, as the same calls sent one by one would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_keys_from_many_tasks_are_counted_exactly() {
    let server = common::RedisServer::start();
    let backend = backend(&server.url(), 2).await;
    let bucket = Arc::new(limiter(&backend, "tasks", 60));
    let handles: Vec<_> = (0..16_u64)
        .map(|t| {
            let bucket = Arc::clone(&bucket);
            tokio::spawn(async move {
                let mut taken = [0_u64; 4];
                for n in 0..60_u64 {
                    let key = (n + t) % 4;
                    let cost = 1 + (n * 7 + t) % 3;
                    let d = bucket.check_n(&format!("k{key}"), cost).await.unwrap();
                    assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
                    if d.is_allowed() {
                        taken[key as usize] += cost;
                    }
                }
                taken
            })
        })
        .collect();
    let mut totals = [0_u64; 4];
    for handle in handles {
        for (total, taken) in totals.iter_mut().zip(handle.await.unwrap()) {
            *total += taken;
        }
    }
    // 960 calls of 1 to 3 units on four keys of 60: each key ends within a unit or two of full
    // (a call of 2 or 3 is denied with 1 or 2 left) and never past it.
    for (key, total) in totals.iter().enumerate() {
        assert!((58..=60).contains(total), "k{key} admitted {total} units");
        let peek = bucket.check_n(&format!("k{key}"), 0).await.unwrap();
        assert_eq!(peek.decision().unwrap().remaining(), 60 - total);
    }
    let stats = backend.stats();
    assert!(stats.round_trips < 960, "{stats:?}");
}

/// Callers that stop waiting (their tasks aborted while queued or in flight) strand nobody:
/// the others are answered, the call slots all come back, and later calls go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_stop_waiting_strand_nobody() {
    let server = common::RedisServer::start();
    let backend = backend(&server.url(), 1).await;
    let bucket = Arc::new(limiter(&backend, "abort", 1_000_000));
    let handles: Vec<_> = (0..200)
        .map(|_| {
            let bucket = Arc::clone(&bucket);
            tokio::spawn(async move { bucket.check("k").await })
        })
        .collect();
    for handle in handles.iter().step_by(3) {
        handle.abort();
    }
    let mut answered = 0;
    for (i, handle) in handles.into_iter().enumerate() {
        match handle.await {
            Ok(d) => {
                assert_eq!(d.unwrap().origin(), Some(Origin::Remote));
                answered += 1;
            }
            Err(e) => assert!(e.is_cancelled() && i % 3 == 0, "task {i}: {e}"),
        }
    }
    assert!(answered >= 133, "{answered}");
    let after = bucket.check("k").await.unwrap();
    assert_eq!(after.origin(), Some(Origin::Remote));
    slots_come_back(&backend).await;
}

/// No call slot leaks: once the last sending task has answered its callers and ended, none is
/// held. (It answers before it ends, so a caller may briefly see its slot still held.)
async fn slots_come_back(backend: &RedisBackend) {
    for _ in 0..100 {
        if backend.stats().in_flight == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(backend.stats().in_flight, 0);
}

/// Redis goes away with calls queued: each queued caller gets the failure policy's answer
/// (none hangs), and once Redis is back, calls are decided there again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_answers_every_queued_caller() {
    let mut server = common::RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .time_from(ManualClock::starting_at(START))
        .timeout(Duration::from_millis(300))
        .deny_cache(0)
        .connect()
        .await
        .unwrap();
    let bucket = limiter(&backend, "outage", 1_000);
    assert_eq!(
        bucket.check("k").await.unwrap().origin(),
        Some(Origin::Remote)
    );
    server.kill();
    let decisions = join_all((0..100).map(|_| bucket.check("k"))).await;
    for d in decisions {
        let d = d.unwrap();
        assert!(d.failed_closed(), "{d:?}");
    }
    slots_come_back(&backend).await;
    server.restart();
    let mut back = None;
    for _ in 0..200 {
        let d = bucket.check("k").await.unwrap();
        if d.origin() == Some(Origin::Remote) {
            back = Some(d);
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(back.is_some(), "calls reach Redis again once it is back");
}

/// Coalescing off: one script call per decision, the same answers.
#[tokio::test]
async fn coalescing_off_sends_one_call_per_decision() {
    let server = common::RedisServer::start();
    let backend = backend(&server.url(), 0).await;
    let bucket = limiter(&backend, "off", 10);
    let decisions = join_all((0..30).map(|_| bucket.check("k"))).await;
    let admitted = decisions
        .iter()
        .filter(|d| d.as_ref().unwrap().is_allowed())
        .count();
    assert_eq!(admitted, 10);
    let stats = backend.stats();
    assert_eq!((stats.round_trips, stats.coalesced), (30, 0));
}
