//! What a Redis stack promises, checked on a real `redis-server`: all or nothing, a denial
//! writes nothing, peeks write nothing, keys expire when full again, several limits per key,
//! batches in one round trip, the deny cache, and clear errors for bad input and bad state.

use limiter_testkit::redis_server as common;

use std::time::Duration;

use limiter_core::{Limit, ManualClock};
use limiter_redis::{
    BackendError, BuildError, CallError, Kind, OnFailure, Origin, RedisBackend, RedisLayer,
    RedisLimit, RedisLimiter, RedisStack,
};
use redis::Commands;

const SECOND: u64 = 1_000_000_000;
/// A fixed instant (Nov 2026) in ns since the Unix epoch: the injected clocks start here.
const START: u64 = 1_795_000_000 * SECOND;

/// A backend deciding at `clock`'s time, its breaker and deny cache on the same clock.
async fn backend(
    server: &common::RedisServer,
    clock: &ManualClock,
    deny_cache: usize,
) -> RedisBackend {
    RedisBackend::builder(server.url())
        .time_from(clock.clone())
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .deny_cache(deny_cache)
        .connect()
        .await
        .unwrap()
}

struct Request {
    user: &'static str,
}

/// 5 a second per user, 8 a minute for all.
fn user_and_all(backend: &RedisBackend, name: &str) -> RedisStack<Request> {
    RedisStack::builder(backend, name)
        .layer(
            RedisLayer::keyed("user", |r: &Request| Some(r.user.to_owned()))
                .limit(Kind::TokenBucket, Limit::per_second(5)),
        )
        .layer(RedisLayer::global("all").limit(Kind::FixedWindow, Limit::per_minute(8)))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
}

fn get(server: &common::RedisServer, key: &str) -> Option<Vec<u8>> {
    server.client().get(key).unwrap()
}

#[tokio::test]
async fn a_denied_call_writes_nothing_and_names_the_binding_layer() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let stack = user_and_all(&backend, "deny-writes-nothing");
    let ada = Request { user: "ada" };
    let bob = Request { user: "bob" };
    let [ada_key, global_key] = <[String; 2]>::try_from(stack.redis_keys(&ada)).unwrap();

    for remaining in (0..5).rev() {
        let d = stack.check(&ada).await.unwrap();
        assert!(d.is_allowed(), "{d:?}");
        assert_eq!(d.origin(), Some(Origin::Remote));
        assert_eq!(d.decision().unwrap().remaining(), remaining);
    }
    let global_before = get(&server, &global_key);
    let d = stack.check(&ada).await.unwrap();
    assert!(d.is_denied());
    let binding = *d.stack().binding().unwrap();
    assert_eq!(binding.layer, 0, "the user layer binds: {d:?}");
    assert_eq!(binding.decision.retry_after(), Duration::from_millis(200));
    assert_eq!(
        get(&server, &global_key),
        global_before,
        "a denial by one layer writes no other"
    );

    for _ in 0..3 {
        assert!(stack.check(&bob).await.unwrap().is_allowed());
    }
    let [bob_key, _] = <[String; 2]>::try_from(stack.redis_keys(&bob)).unwrap();
    let bob_before = get(&server, &bob_key);
    let d = stack.check(&bob).await.unwrap();
    assert!(d.is_denied());
    assert_eq!(
        d.stack().binding().unwrap().layer,
        1,
        "the global layer binds: {d:?}"
    );
    assert_eq!(
        get(&server, &bob_key),
        bob_before,
        "bob's own bucket is untouched by the denial"
    );
    assert_ne!(ada_key, bob_key);
}

#[tokio::test]
async fn a_peek_reports_every_layer_and_creates_nothing() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let limiter = RedisLimiter::builder(&backend, "peek")
        .limit(Kind::SlidingWindow, Limit::per_second(4))
        .build()
        .unwrap();
    let d = limiter.check_n("nobody", 0).await.unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.decision().unwrap().remaining(), 4);
    let exists: bool = server
        .client()
        .exists(&limiter.redis_keys("nobody")[0])
        .unwrap();
    assert!(!exists, "a peek must not create a key");
}

#[tokio::test]
async fn keys_expire_when_their_state_is_full_again() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let limiter = RedisLimiter::builder(&backend, "expiry")
        .limit(Kind::TokenBucket, Limit::per_second(10))
        .limit(Kind::FixedWindow, Limit::per_minute(100))
        .build()
        .unwrap();
    let d = limiter.check_n("k", 3).await.unwrap();
    let keys = limiter.redis_keys("k");
    let mut conn = server.client();
    let bucket_ttl: i64 = conn.pttl(&keys[0]).unwrap();
    let window_ttl: i64 = conn.pttl(&keys[1]).unwrap();
    // 3 tokens of 100 ms refill in 300 ms; the window ends at the next whole minute.
    assert!(
        (250..=300).contains(&bucket_ttl),
        "bucket ttl {bucket_ttl} ms"
    );
    let window_left = 60_000 - (START / 1_000_000) % 60_000;
    assert!(
        window_ttl > 0 && window_ttl as u64 <= window_left,
        "window ttl {window_ttl} ms"
    );
    assert_eq!(
        d.decision().unwrap().reset_after(),
        Duration::from_millis(window_left)
    );
}

#[tokio::test]
async fn several_limits_on_one_key_bind_in_turn() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let limiter = RedisLimiter::builder(&backend, "two-limits")
        .limit(Kind::TokenBucket, Limit::per_second(10))
        .limit(Kind::SlidingWindow, Limit::per_minute(15))
        .build()
        .unwrap();
    let mut admitted = 0;
    for _ in 0..12 {
        admitted += u32::from(limiter.check("k").await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 10, "the bucket's burst binds first");
    let d = limiter.check("k").await.unwrap();
    assert_eq!(d.stack().binding().unwrap().limit_index, 0);
    clock.advance(Duration::from_secs(1));
    admitted = 0;
    for _ in 0..10 {
        admitted += u32::from(limiter.check("k").await.unwrap().is_allowed());
    }
    assert_eq!(admitted, 5, "then the 15 per minute window");
    let d = limiter.check("k").await.unwrap();
    assert!(d.is_denied());
    assert_eq!(d.stack().binding().unwrap().limit_index, 1, "{d:?}");
}

#[tokio::test]
async fn a_batch_is_one_round_trip_decided_in_order() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let limiter = RedisLimiter::builder(&backend, "batch")
        .limit(Kind::FixedWindow, Limit::per_second(2))
        .build()
        .unwrap();
    let before = backend.stats().round_trips;
    let results = limiter
        .check_many(&[("a", 1), ("a", 1), ("a", 1), ("b", 2), ("a", 0), ("c", 3)])
        .await;
    assert_eq!(backend.stats().round_trips, before + 1);
    let allowed: Vec<Option<bool>> = results
        .iter()
        .map(|r| r.as_ref().ok().map(|d| d.is_allowed()))
        .collect();
    assert_eq!(
        allowed,
        [
            Some(true),
            Some(true),
            Some(false),
            Some(true),
            Some(true),
            None
        ],
        "{results:?}"
    );
    assert_eq!(
        results[4].as_ref().unwrap().decision().unwrap().remaining(),
        0
    );
    assert!(matches!(
        results[5],
        Err(CallError::Decision {
            source: limiter_core::DecisionError::CostExceedsBurst { cost: 3, burst: 2 },
            ..
        })
    ));
}

#[tokio::test]
async fn the_deny_cache_spares_redis_and_never_denies_what_redis_admits() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let cached = backend(&server, &clock, 1_000).await;
    let plain = backend(&server, &clock, 0).await;
    let build = |backend: &RedisBackend| {
        RedisLimiter::builder(backend, "abuse")
            .limit(Kind::TokenBucket, Limit::per_second(10))
            .limit(Kind::SlidingWindow, Limit::per_minute(200))
            .build()
            .unwrap()
    };
    let (with_cache, without_cache) = (build(&cached), build(&plain));
    // An abusive client: 100 calls every 10 ms for 5 s, far over 10 per second.
    let mut calls = 0_u64;
    let mut cache_answers = 0;
    for tick in 0..500_u64 {
        for i in 0..100 {
            calls += 1;
            let cost = 1 + (tick + i) % 3;
            let d = with_cache.check_n("abuser", cost).await.unwrap();
            if d.origin() == Some(Origin::DenyCache) {
                cache_answers += 1;
                // Redis itself must deny the same cost at the same instant.
                let truth = without_cache.check_n("abuser", cost).await.unwrap();
                assert!(
                    truth.is_denied(),
                    "the cache denied what Redis admits: {truth:?}"
                );
            }
        }
        clock.advance(Duration::from_millis(10));
    }
    let trips = cached.stats().round_trips;
    assert!(cache_answers > 0);
    assert_eq!(cached.stats().deny_cache_hits, cache_answers);
    assert!(
        calls >= 10 * trips,
        "{calls} calls took {trips} round trips: less than 10x fewer"
    );
}

#[tokio::test]
async fn bad_state_in_redis_is_a_clear_error_and_is_left_alone() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let limiter = RedisLimiter::builder(&backend, "corrupt")
        .limit(Kind::TokenBucket, Limit::per_second(3))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let mut conn = server.client();
    let junk_key = limiter.redis_keys("junk").remove(0);
    let hash_key = limiter.redis_keys("hash").remove(0);
    let _: () = conn.set(&junk_key, "not a number").unwrap();
    let _: () = conn.hset(&hash_key, "field", "1").unwrap();
    // 64 bytes, the size of a state: NaNs, and whole numbers naming no algorithm.
    let nan_key = limiter.redis_keys("nan").remove(0);
    let _: () = conn.set(&nan_key, vec![0xff_u8; 64]).unwrap();
    let unknown_key = limiter.redis_keys("unknown").remove(0);
    let unknown: Vec<u8> = [1.0_f64, 0.0, 0.0, 9.0, 1.0, 1.0, 1.0, 0.0]
        .iter()
        .flat_map(|v| v.to_be_bytes())
        .collect();
    let _: () = conn.set(&unknown_key, unknown).unwrap();

    for key in ["junk", "hash", "nan", "unknown"] {
        let d = limiter.check(key).await.unwrap();
        assert!(d.is_denied(), "fail closed");
        let (true, Some(BackendError::Script(message))) = (d.failed_closed(), d.backend_error())
        else {
            panic!("expected a script error, got {d:?}");
        };
        let redis_key = limiter.redis_keys(key).remove(0);
        assert!(message.contains(&redis_key), "{message}");
        assert!(
            message.contains("delete it or change the prefix"),
            "{message}"
        );
    }
    let junk: String = conn.get(&junk_key).unwrap();
    assert_eq!(junk, "not a number", "nothing overwritten");

    // In a batch, only the call on the bad key fails.
    let results = limiter.check_many(&[("junk", 1), ("fine", 1)]).await;
    assert!(results[0].as_ref().unwrap().failed_closed());
    assert_eq!(results[1].as_ref().unwrap().origin(), Some(Origin::Remote));
    assert!(!backend.stats().breaker_open, "a bad key is not an outage");
}

#[tokio::test]
async fn bad_calls_and_bad_stacks_are_refused_with_the_fix() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let stack = RedisStack::builder(&backend, "costs")
        .layer(
            RedisLayer::keyed("user", |r: &Request| Some(r.user.to_owned()))
                .limit(Kind::SlidingWindow, Limit::per_second(5)),
        )
        .build()
        .unwrap();
    let error = stack.check_n(&Request { user: "a" }, 6).await.unwrap_err();
    assert!(error.to_string().contains("split the request"), "{error}");

    // Tagged by each layer's key on one server: the keys name their slots (for a cluster),
    // and one script still decides the call, all or nothing.
    let two_layers = RedisStack::builder(&backend, "cross")
        .layer(
            RedisLayer::keyed("user", |r: &Request| Some(r.user.to_owned()))
                .limit(Kind::TokenBucket, Limit::per_second(5)),
        )
        .layer(RedisLayer::global("all").limit(Kind::TokenBucket, Limit::per_second(6)))
        .tag_by_key()
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let ada = Request { user: "ada" };
    assert_eq!(
        two_layers.redis_keys(&ada),
        ["limiter:cross:{ada}:user:0", "limiter:{cross}:all:0"]
    );
    let trips = backend.stats().round_trips;
    for _ in 0..5 {
        assert!(two_layers.check(&ada).await.unwrap().is_allowed());
    }
    assert_eq!(
        backend.stats().round_trips,
        trips + 5,
        "one script per call"
    );
    let bob = Request { user: "bob" };
    assert!(two_layers.check(&bob).await.unwrap().is_allowed());
    let over = two_layers.check(&bob).await.unwrap();
    assert_eq!(
        over.stack().binding().unwrap().layer,
        1,
        "the global layer binds"
    );
    assert_eq!(
        two_layers
            .check_n(&bob, 0)
            .await
            .unwrap()
            .layers()
            .iter()
            .next()
            .unwrap()
            .decision
            .remaining(),
        4,
        "the denied call took nothing from bob"
    );

    let bad_names: [(&str, &str); 3] = [("a{b", "hash tag"), ("a:b", "separates"), ("", "empty")];
    for (name, says) in bad_names {
        let e = RedisLimiter::builder(&backend, name)
            .limit(Kind::TokenBucket, Limit::per_second(1))
            .build()
            .unwrap_err();
        assert!(e.to_string().contains(says), "{name:?}: {e}");
    }
    let e = RedisLimiter::builder(&backend, "x").build().unwrap_err();
    assert!(matches!(e, BuildError::NoLimits { .. }), "{e}");

    // Limits once refused on Redis are accepted: a period with a fraction of a microsecond
    // (rounded up), 100k per second sliding, 100k per day fixed, u32::MAX per day.
    for (kind, limit) in [
        (
            Kind::TokenBucket,
            Limit::new(3, Duration::from_nanos(1_000_500)),
        ),
        (Kind::SlidingWindow, Limit::per_second(100_000)),
        (Kind::FixedWindow, Limit::per_day(100_000)),
        (Kind::TokenBucket, Limit::per_day(u64::from(u32::MAX))),
    ] {
        let built = RedisLimiter::builder(&backend, "x")
            .limit(kind, limit)
            .build();
        assert!(built.is_ok(), "{kind} {limit}: {:?}", built.err());
    }
    // Only a burst no bucket can hold is refused, in the user's terms, once, at build.
    let e = RedisLimiter::builder(&backend, "x")
        .limit(Kind::TokenBucket, Limit::per_day(1).with_burst(u64::MAX))
        .build()
        .unwrap_err();
    assert!(e.to_string().contains("burst"), "{e}");
    // A limit that cannot be counted at all is named by its field, with its layer.
    for (limit, field) in [
        (Limit::per_second(0), "`count`"),
        (Limit::per_second(5).with_burst(0), "`burst`"),
        (Limit::new(5, Duration::ZERO), "`period`"),
    ] {
        let e = RedisStack::builder(&backend, "zero")
            .layer(RedisLayer::global("ok").limit(Kind::FixedWindow, Limit::per_second(5)))
            .layer(
                RedisLayer::keyed("user", |r: &Request| Some(r.user.to_owned()))
                    .limit(Kind::SlidingWindow, Limit::per_second(5))
                    .limit(Kind::TokenBucket, limit),
            )
            .build()
            .unwrap_err();
        assert!(
            matches!(&e, BuildError::Limit { owner, .. } if owner == "layer `user`"),
            "{e:?}"
        );
        assert!(e.to_string().contains(field), "{e} should name {field}");
    }
}

/// A server that lost the script (its functions and scripts flushed here; restarted or a new
/// cluster node alike) gets the library once, the call is decided as usual, the reload is
/// counted, and the next call runs the loaded function again.
#[tokio::test]
async fn a_server_without_the_script_gets_it_once_and_the_call_is_decided() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let limiter = RedisLimiter::builder(&backend, "script-reload")
        .limit(Kind::TokenBucket, Limit::per_minute(4))
        .build()
        .unwrap();
    let remaining = |d: limiter_redis::RedisDecision| {
        assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
        d.stack().decision().remaining()
    };
    assert_eq!(remaining(limiter.check("k").await.unwrap()), 3);
    assert_eq!(backend.stats().script_loads, 1, "loaded at the first call");
    for flush in ["FUNCTION", "SCRIPT"] {
        let _: () = redis::cmd(flush)
            .arg("FLUSH")
            .query(&mut server.client())
            .unwrap();
    }
    assert_eq!(
        remaining(limiter.check("k").await.unwrap()),
        2,
        "state kept, one more taken"
    );
    assert_eq!(backend.stats().script_loads, 2);
    assert_eq!(remaining(limiter.check("k").await.unwrap()), 1);
    assert_eq!(backend.stats().script_loads, 2, "loaded again, once");
    let functions: redis::Value = redis::cmd("FUNCTION")
        .arg("LIST")
        .query(&mut server.client())
        .unwrap();
    assert!(
        format!("{functions:?}").contains("limiter_decide_"),
        "run as a function: {functions:?}"
    );
}

/// A server that refuses functions (an ACL here; a server before Redis 7 alike) runs the
/// script by `EVALSHA`, sent in full once, with the same decisions.
#[tokio::test]
async fn a_server_that_refuses_functions_runs_the_script_by_hash() {
    let server = common::RedisServer::start();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("default")
        .arg("-fcall")
        .arg("-function")
        .query(&mut server.client())
        .unwrap();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let limiter = RedisLimiter::builder(&backend, "no-functions")
        .limit(Kind::FixedWindow, Limit::per_minute(2))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    for allowed in [true, true, false] {
        let d = limiter.check("k").await.unwrap();
        assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
        assert_eq!(d.is_allowed(), allowed);
    }
    assert_eq!(backend.stats().script_loads, 1, "sent in full once");
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.client())
        .unwrap();
    let d = limiter.check("k").await.unwrap();
    assert_eq!((d.origin(), d.is_denied()), (Some(Origin::Remote), true));
    assert_eq!(backend.stats().script_loads, 2);
}

/// A state written by the previous version of the script (the Rust word in decimal, tagged
/// with the limit that wrote it, or untagged) is read as it was meant, rescaled when another
/// limit wrote it, and rewritten in the new form: nodes can be upgraded one by one.
#[tokio::test]
async fn a_state_written_by_the_previous_version_is_read() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let ten = Limit::per_hour(10);
    let limiter = RedisLimiter::builder(&backend, "upgrade")
        .limit(Kind::TokenBucket, ten)
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let spec = RedisLimit::new(Kind::TokenBucket, ten).unwrap();
    // 4 of 10 taken, as the previous version stored it.
    let now_us = START / 1_000;
    let mut word = 0;
    for _ in 0..4 {
        word = spec.decide(word, 1, now_us).unwrap().next.unwrap();
    }
    let (code, [a, b, c, d]) = spec.script_fields();
    let twenty = RedisLimit::new(Kind::TokenBucket, Limit::per_hour(20)).unwrap();
    let (code20, [a20, b20, c20, d20]) = twenty.script_fields();
    let mut conn = server.client();
    for (key, stored, left) in [
        ("tagged", format!("{word} {code}:{a}:{b}:{c}:{d}"), 5),
        ("untagged", word.to_string(), 5),
        // Written under 20 an hour: 4 of 20 is 2 of 10 taken.
        (
            "other",
            {
                let mut w = 0;
                for _ in 0..4 {
                    w = twenty.decide(w, 1, now_us).unwrap().next.unwrap();
                }
                format!("{w} {code20}:{a20}:{b20}:{c20}:{d20}")
            },
            7,
        ),
    ] {
        let name = limiter.redis_keys(key).remove(0);
        let _: () = conn.set(&name, stored).unwrap();
        let d = limiter.check(key).await.unwrap();
        assert_eq!(d.origin(), Some(Origin::Remote), "{key}: {d:?}");
        assert_eq!(d.decision().unwrap().remaining(), left, "{key}");
        let raw = common::stored_state(&mut conn, &name).unwrap();
        assert_eq!(raw.len(), 64, "{key}: rewritten in the new form");
        assert!(spec.twin_state(&raw).is_some(), "{key}: by this limit");
    }
}

#[tokio::test]
async fn through_the_seam_each_layers_answer_is_kept_when_asked_for() {
    use limiter_stack::{AsyncLimiter, LayerAnswers, Outcome};
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let stack = user_and_all(&backend, "each-layer");
    let ada = Request { user: "ada" };
    let mut each = LayerAnswers::new();
    let Ok(Outcome::Decided { decision, .. }) = stack.decide_request_each(&ada, 2, &mut each).await
    else {
        panic!("decided");
    };
    let left: Vec<u64> = each.iter().map(|l| l.decision.remaining()).collect();
    assert_eq!(left, [3, 6], "{each:?}");
    assert_eq!(each.summary(), decision);
    // The compact answer alone says the same of the call.
    let Ok(Outcome::Decided { decision, .. }) = stack.decide_request(&ada, 1).await else {
        panic!("decided");
    };
    assert_eq!(decision.decision().remaining(), 2);
    assert_eq!(decision.binding().map(|b| b.layer), Some(0));
}
