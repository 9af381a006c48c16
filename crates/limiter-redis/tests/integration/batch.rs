//! All-or-nothing batches on a real `redis-server`: a denied batch writes nothing, a call on a
//! key Redis cannot read refuses its batch whole, shadow calls never block, a batch spans stacks of one backend, the local fallback keeps the rule, a
//! proptest checks every answer and every written state against the Rust algorithms run as a
//! simple model, and OS processes racing overlapping batches are counted exactly.

use limiter_testkit::redis_server as common;

use std::collections::HashMap;
use std::sync::Arc;

use limiter_core::{Decision, Limit, ManualClock};
use limiter_redis::{
    BatchError, Kind, OnFailure, Origin, RedisBackend, RedisLayer, RedisLimit, RedisLimiter,
    RedisStack,
};
use limiter_stack::LayerDecision;
use proptest::prelude::*;
use redis::Commands;

/// 2026-11-25 in nanoseconds: injected time, frozen unless a test moves it.
const START: u64 = 1_795_000_000_000_000_000;
const CHILD_URL: &str = "LIMITER_REDIS_BATCH_CHILD_URL";
const CHILD_INDEX: &str = "LIMITER_REDIS_BATCH_CHILD_INDEX";

async fn backend_at(url: &str, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(url)
        .time_from(clock.clone())
        .clock(clock.clone())
        .timeout(std::time::Duration::from_secs(5))
        .expiry_slack(std::time::Duration::from_secs(3_600))
        .connect()
        .await
        .unwrap()
}

fn seats(backend: &RedisBackend, on_failure: OnFailure) -> RedisLimiter {
    RedisLimiter::builder(backend, "seats")
        .limit(Kind::FixedWindow, Limit::per_hour(10))
        .on_failure(on_failure)
        .build()
        .unwrap()
}

fn remaining(d: &limiter_redis::RedisDecision) -> u64 {
    d.decision().expect("a limit answered").remaining()
}

#[tokio::test]
async fn a_denied_batch_takes_nothing_and_its_admitted_calls_report_a_peek() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend_at(&server.url(), &clock).await;
    let limiter = seats(&backend, OnFailure::Closed);

    // 3 + 8 of a's 10 cannot both pass: the batch is refused and nothing is written.
    let batch = limiter
        .check_all(&[("a", 3), ("b", 4), ("a", 8)])
        .await
        .unwrap();
    assert!(!batch.is_admitted());
    let d = batch.decisions();
    assert_eq!(
        d.iter().map(|d| d.is_allowed()).collect::<Vec<_>>(),
        [true, true, false]
    );
    assert!(
        d.iter().all(|d| d.origin() == Some(Origin::Remote)),
        "{d:?}"
    );
    assert_eq!(
        remaining(&d[0]),
        10,
        "a holds all 10 after the refused batch"
    );
    assert_eq!(
        remaining(&d[1]),
        10,
        "b holds all 10 after the refused batch"
    );
    assert_eq!(
        remaining(&d[2]),
        7,
        "the denial counts the batch's earlier 3"
    );
    let mut conn = server.client();
    for key in ["a", "b"] {
        let stored: Option<String> = conn.get(&limiter.redis_keys(key)[0]).unwrap();
        assert_eq!(stored, None, "{key}: a refused batch writes nothing");
    }

    // The same key twice within its limit: both pass, both count.
    let batch = limiter
        .check_all(&[("a", 3), ("b", 4), ("a", 7)])
        .await
        .unwrap();
    assert!(batch.is_admitted());
    let d = batch.decisions();
    assert_eq!(
        (remaining(&d[0]), remaining(&d[1]), remaining(&d[2])),
        (7, 6, 0)
    );
    assert_eq!(remaining(&limiter.check_n("a", 0).await.unwrap()), 0);
    assert_eq!(remaining(&limiter.check_n("b", 0).await.unwrap()), 6);

    // A denied single call reaches the deny cache, but a denial that counted a batch's
    // earlier, unwritten units must not: b alone can still take 6.
    let batch = limiter.check_all(&[("b", 4), ("b", 4)]).await.unwrap();
    assert!(!batch.is_admitted());
    let alone = limiter.check_n("b", 6).await.unwrap();
    assert!(alone.is_allowed(), "{alone:?}");
    assert_eq!(alone.origin(), Some(Origin::Remote));
}

#[tokio::test]
async fn a_batch_spans_stacks_shadow_calls_never_block_and_bad_calls_are_refused_whole() {
    struct Req {
        user: &'static str,
    }
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend_at(&server.url(), &clock).await;
    let build = |name: &str, count: u64| {
        RedisStack::builder(&backend, name)
            .layer(
                RedisLayer::keyed("user", |r: &Req| Some(r.user.to_owned()))
                    .limit(Kind::TokenBucket, Limit::per_hour(count)),
            )
            .layer(RedisLayer::global("all").limit(Kind::SlidingWindow, Limit::per_hour(100)))
            .on_failure(OnFailure::Closed)
            .build()
            .unwrap()
    };
    let logins = build("logins", 5);
    let trial = build("trial", 1);
    let ada = Req { user: "ada" };

    // The shadow call is over its limit, yet the batch is admitted and the enforced call counts.
    let mut batch = backend.batch();
    batch.add(&logins, &ada, 2).add_shadow(&trial, &ada, 1);
    batch.add_shadow(&trial, &ada, 1);
    assert_eq!(batch.len(), 3);
    let decided = batch.decide().await.unwrap();
    assert!(decided.is_admitted());
    let d = decided.decisions();
    assert!(
        d[0].is_allowed() && d[1].is_allowed() && d[2].is_denied(),
        "{d:?}"
    );
    assert_eq!(remaining(&logins.check_n(&ada, 0).await.unwrap()), 3);
    assert_eq!(remaining(&trial.check_n(&ada, 0).await.unwrap()), 0);

    // An enforced denial on one stack leaves the other untouched.
    let mut batch = backend.batch();
    batch.add(&logins, &ada, 1).add(&trial, &ada, 1);
    let decided = batch.decide().await.unwrap();
    assert!(!decided.is_admitted());
    assert_eq!(remaining(&logins.check_n(&ada, 0).await.unwrap()), 3);

    // A call no limit can decide refuses the whole batch before anything is sent.
    let trips = backend.stats().round_trips;
    let mut batch = backend.batch();
    batch.add(&logins, &ada, 1).add(&trial, &ada, 2);
    let err = batch.decide().await.unwrap_err();
    assert!(matches!(err, BatchError::Call { index: 1, .. }), "{err}");
    assert!(err.to_string().contains("call 1"), "{err}");
    assert_eq!(backend.stats().round_trips, trips, "nothing was sent");
    // The stack that refuses it says so alike, with nothing sent.
    let BatchError::Call { source, .. } = err else {
        unreachable!()
    };
    assert_eq!(trial.check_cost(&ada, 2), Err(source));
    assert_eq!(trial.check_cost(&ada, 1), Ok(()));
    assert_eq!(backend.stats().round_trips, trips, "nothing was sent");

    // A stack of another backend cannot join: one batch is one script call.
    let other = backend_at(&server.url(), &clock).await;
    let elsewhere = RedisStack::builder(&other, "elsewhere")
        .layer(RedisLayer::global("all").limit(Kind::FixedWindow, Limit::per_hour(9)))
        .build()
        .unwrap();
    let mut batch = backend.batch();
    batch.add(&logins, &ada, 1).add(&elsewhere, &ada, 1);
    let err = batch.decide().await.unwrap_err();
    assert!(
        matches!(&err, BatchError::OtherBackend { index: 1, stack } if stack == "elsewhere"),
        "{err}"
    );
    assert_eq!(remaining(&logins.check_n(&ada, 0).await.unwrap()), 3);

    // An empty batch is admitted without a round trip.
    let trips = backend.stats().round_trips;
    let empty = backend.batch::<Req>().decide().await.unwrap();
    assert!(empty.is_admitted() && empty.decisions().is_empty());
    assert_eq!(backend.stats().round_trips, trips);
}

#[tokio::test]
async fn the_fallback_keeps_a_batch_all_or_nothing_while_redis_is_down() {
    let mut server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = RedisBackend::builder(server.url())
        .clock(clock.clone())
        .timeout(std::time::Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let limiter = seats(&backend, OnFailure::Fallback);
    server.kill();

    let batch = limiter.check_all(&[("a", 3), ("a", 8)]).await.unwrap();
    assert!(!batch.is_admitted());
    let d = batch.decisions();
    assert!(
        d.iter().all(|d| d.origin() == Some(Origin::Fallback)),
        "{d:?}"
    );
    assert_eq!(remaining(&d[0]), 10, "the refund reports a's full 10");
    assert!(d[1].is_denied());
    // Nothing is held locally: all 10 are still there, and then no more.
    let batch = limiter.check_all(&[("a", 4), ("a", 6)]).await.unwrap();
    assert!(batch.is_admitted(), "{batch:?}");
    let batch = limiter.check_all(&[("a", 1)]).await.unwrap();
    assert!(!batch.is_admitted());

    // Fail-closed refuses the batch; fail-open admits it; neither counts anything.
    let closed = seats(&backend, OnFailure::Closed);
    let batch = closed.check_all(&[("x", 1)]).await.unwrap();
    assert!(!batch.is_admitted());
    assert!(batch.decisions()[0].failed_closed());
    let open = seats(&backend, OnFailure::Open);
    let batch = open.check_all(&[("x", 1), ("y", 1)]).await.unwrap();
    assert!(batch.is_admitted());
    assert!(batch.decisions()[1].failed_open());
}

/// A call whose key Redis cannot read (an operator overwrote it) fails closed, and its
/// batch with it: the other calls' units are not taken, and the bad key is left as found.
#[tokio::test]
async fn a_call_on_a_key_redis_cannot_read_refuses_its_batch_whole() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend_at(&server.url(), &clock).await;
    let limiter = seats(&backend, OnFailure::Closed);
    let mut conn = server.client();
    let bad_key = limiter.redis_keys("bad").remove(0);
    let _: () = conn.set(&bad_key, "not a state").unwrap();

    for calls in [vec![("a", 3), ("bad", 1)], vec![("bad", 1), ("a", 3)]] {
        let batch = limiter.check_all(&calls).await.unwrap();
        assert!(!batch.is_admitted(), "{batch:?}");
        assert!(
            batch.decisions().iter().any(|d| d.failed_closed()),
            "{batch:?}"
        );
    }
    assert_eq!(remaining(&limiter.check_n("a", 0).await.unwrap()), 10);
    let stored: Option<String> = conn.get(&limiter.redis_keys("a")[0]).unwrap();
    assert_eq!(stored, None, "a refused batch writes nothing");
    let kept: String = conn.get(&bad_key).unwrap();
    assert_eq!(kept, "not a state", "nothing overwritten");
}

// ---- A model: the Rust algorithms on a map of states, all or nothing. ----

/// What the model answers for a batch: the verdict and per call, per limit, the decision in
/// microseconds.
type ModelAnswer = (bool, Vec<Vec<Decision>>);

/// Decides `calls` (key index, cost, enforced) on `states` at `now_us`, all or nothing.
fn model(
    specs: &[RedisLimit],
    states: &mut HashMap<(usize, usize), u64>,
    calls: &[(usize, u64, bool)],
    now_us: u64,
) -> ModelAnswer {
    let mut working = states.clone();
    let mut admitted = true;
    let mut answers: Vec<Vec<Decision>> = Vec::new();
    for &(key, cost, enforced) in calls {
        let steps: Vec<_> = specs
            .iter()
            .enumerate()
            .map(|(l, spec)| {
                let state = working.get(&(key, l)).copied().unwrap_or(0);
                spec.decide(state, cost, now_us).unwrap()
            })
            .collect();
        let allowed = steps.iter().all(|s| s.decision.is_allowed());
        if allowed {
            for (l, step) in steps.iter().enumerate() {
                if let Some(next) = step.next {
                    working.insert((key, l), next);
                }
            }
        }
        admitted &= allowed || !enforced;
        answers.push(steps.iter().map(|s| s.decision).collect());
    }
    if admitted {
        *states = working;
    } else {
        // Admitted calls report a peek on the states as they were.
        for ((key, _, _), answer) in calls.iter().zip(&mut answers) {
            if answer.iter().all(|d: &Decision| d.is_allowed()) {
                *answer = specs
                    .iter()
                    .enumerate()
                    .map(|(l, spec)| {
                        let state = states.get(&(*key, l)).copied().unwrap_or(0);
                        spec.decide(state, 0, now_us).unwrap().decision
                    })
                    .collect();
            }
        }
    }
    (admitted, answers)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn batches_on_redis_match_the_model(
        bucket in 1_u64..12,
        window in 1_u64..12,
        rounds in prop::collection::vec(
            (
                0_u64..400_000,
                prop::collection::vec((0_usize..3, 0_u64..6, prop::bool::weighted(0.8)), 1..6),
            ),
            1..10,
        ),
    ) {
        let server = common::RedisServer::start();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let clock = ManualClock::starting_at(START);
        let backend = runtime.block_on(backend_at(&server.url(), &clock));
        let limits = [
            (Kind::TokenBucket, Limit::per_second(bucket)),
            (Kind::SlidingWindow, Limit::per_second(window)),
        ];
        let mut builder = RedisLimiter::builder(&backend, "model").on_failure(OnFailure::Closed);
        for (kind, limit) in limits {
            builder = builder.limit(kind, limit);
        }
        let limiter = builder.build().unwrap();
        let specs: Vec<RedisLimit> =
            limits.iter().map(|(k, l)| RedisLimit::new(*k, *l).unwrap()).collect();
        let burst = specs.iter().map(RedisLimit::burst).min().unwrap();
        let keys = ["k0", "k1", "k2"];
        let mut states = HashMap::new();
        let mut now_us = START / 1_000;
        for (step_us, calls) in rounds {
            now_us += step_us;
            clock.set(now_us * 1_000);
            let calls: Vec<(usize, u64, bool)> =
                calls.into_iter().map(|(k, c, e)| (k, c.min(burst), e)).collect();
            let (want_admitted, want) = model(&specs, &mut states, &calls, now_us);
            let mut batch = backend.batch();
            let requests: Vec<String> = calls.iter().map(|(k, _, _)| keys[*k].to_owned()).collect();
            let stack = limiter_stack_of(&limiter);
            for ((_, cost, enforced), request) in calls.iter().zip(&requests) {
                if *enforced {
                    batch.add(stack, request, *cost);
                } else {
                    batch.add_shadow(stack, request, *cost);
                }
            }
            let got = runtime.block_on(batch.decide()).unwrap();
            prop_assert_eq!(got.is_admitted(), want_admitted, "{:?}", calls);
            for (i, (decision, want)) in got.decisions().iter().zip(&want).enumerate() {
                prop_assert_eq!(decision.origin(), Some(Origin::Remote));
                // The layer's answer combines its two limits by the stack's own rule.
                let layers: Vec<LayerDecision> = decision.layers().iter().copied().collect();
                let want: Vec<Decision> = want.iter().copied().map(common::micros_as_nanos).collect();
                let want = LayerDecision::from_limits(0, 0, &want);
                prop_assert_eq!(layers, want.into_iter().collect::<Vec<_>>(), "call {} of {:?}", i, calls);
            }
            // Every state Redis holds is the model's, to the bit.
            let mut conn = server.client();
            for (k, key) in keys.iter().enumerate() {
                for (l, name) in limiter.redis_keys(key).iter().enumerate() {
                    let stored = common::stored_state(&mut conn, name)
                        .map(|raw| specs[l].twin_state(&raw).expect("a state this limit wrote"));
                    prop_assert_eq!(stored, states.get(&(k, l)).copied(), "{} limit {}", key, l);
                }
            }
        }
    }
}

/// The stack behind a limiter, for batches that mix enforced and shadow calls.
fn limiter_stack_of(limiter: &RedisLimiter) -> &RedisStack<String> {
    limiter.stack()
}

// ---- OS processes racing overlapping batches. ----

/// Each batch takes a unit of the shared key and of two users' keys (its own and the next
/// process's): a batch is admitted only while the shared key has room.
async fn race(url: &str, index: usize) -> u64 {
    let clock = ManualClock::starting_at(START);
    let backend = backend_at(url, &clock).await;
    let limiter = Arc::new(race_limiter(&backend));
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let own = format!("user-{index}");
                let next = format!("user-{}", (index + 1) % 3);
                let mut admitted = 0;
                for _ in 0..50 {
                    let batch = limiter
                        .check_all(&[(own.as_str(), 1), ("shared", 1), (next.as_str(), 1)])
                        .await
                        .unwrap();
                    assert!(
                        batch
                            .decisions()
                            .iter()
                            .all(|d| d.origin() == Some(Origin::Remote))
                    );
                    admitted += u64::from(batch.is_admitted());
                }
                admitted
            })
        })
        .collect();
    let mut total = 0;
    for task in tasks {
        total += task.await.unwrap();
    }
    total
}

fn race_limiter(backend: &RedisBackend) -> RedisLimiter {
    RedisLimiter::builder(backend, "race")
        .limit(Kind::FixedWindow, Limit::per_hour(100))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
}

/// The entry point of the child processes `processes_racing_overlapping_batches_count_exactly`
/// starts; run normally, it has nothing to do.
#[tokio::test]
async fn batch_child_process_entry_point() {
    let (Ok(url), Ok(index)) = (std::env::var(CHILD_URL), std::env::var(CHILD_INDEX)) else {
        return;
    };
    let admitted = race(&url, index.parse().unwrap()).await;
    println!("admitted={admitted}");
}

#[test]
fn processes_racing_overlapping_batches_count_exactly() {
    let server = common::RedisServer::start();
    let children: Vec<_> = (0..3)
        .map(|index| {
            limiter_testkit::child_test(module_path!(), "batch_child_process_entry_point")
                .env(CHILD_URL, server.url())
                .env(CHILD_INDEX, index.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a child test process")
        })
        .collect();
    let mut total = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        total += stdout
            .lines()
            .find_map(|l| l.split_once("admitted=").map(|(_, n)| n))
            .and_then(|n| n.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no count in the child's output: {stdout}"));
    }
    // 600 batches race for the shared key's 100: exactly 100 pass.
    assert_eq!(total, 100);
    // Each admitted batch charged two users; a denied one charged nobody.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let charged: u64 = runtime.block_on(async {
        let clock = ManualClock::starting_at(START);
        let backend = backend_at(&server.url(), &clock).await;
        let limiter = race_limiter(&backend);
        let mut charged = 0;
        for user in ["user-0", "user-1", "user-2"] {
            charged += 100 - remaining(&limiter.check_n(user, 0).await.unwrap());
        }
        charged
    });
    assert_eq!(charged, 200);
}
