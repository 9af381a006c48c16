//! Refunds on a real `redis-server`: the guard (never more than a grant took, never on
//! another stack's grant), windows that have moved on, the deny cache forgetting refunded
//! keys, a refund while Redis is down, a take the local fallback granted and gave back, and a
//! proptest holding every refund and every state written to the Rust algorithms' own `refund`.

use limiter_testkit::redis_server as common;

use std::time::Duration;

use limiter_core::{Clock, Limit, ManualClock};
use limiter_redis::{
    Kind, OnFailure, Origin, RedisBackend, RedisDecision, RedisGrant, RedisLimit, RedisLimiter,
    RefundError,
};
use proptest::prelude::*;

/// 2026-11-25 in nanoseconds.
const START: u64 = 1_795_000_000_000_000_000;

async fn backend(url: &str, clock: &ManualClock, deny_cache: usize) -> RedisBackend {
    RedisBackend::builder(url)
        .time_from(clock.clone())
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .expiry_slack(Duration::from_secs(3_600))
        .deny_cache(deny_cache)
        .connect()
        .await
        .unwrap()
}

/// A backend on a Redis the test kills: each call waits at most 200 ms for it.
async fn backend_to_kill(url: &str, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(url)
        .time_from(clock.clone())
        .clock(clock.clone())
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap()
}

fn limiter(backend: &RedisBackend, name: &str, kind: Kind, limit: Limit) -> RedisLimiter {
    RedisLimiter::builder(backend, name)
        .limit(kind, limit)
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
}

fn remaining(d: &RedisDecision) -> u64 {
    d.decision().expect("a limit answered").remaining()
}

#[tokio::test]
async fn a_grant_gives_back_at_most_what_it_took() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server.url(), &clock, 0).await;
    let bucket = limiter(&backend, "bucket", Kind::TokenBucket, Limit::per_hour(10));

    let (d, grant) = bucket.acquire("k", 6).await.unwrap();
    assert_eq!(remaining(&d), 4);
    let mut grant = grant.expect("Redis admitted 6");
    assert_eq!((grant.taken(), grant.left()), (6, 6));
    assert_eq!(
        remaining(&bucket.refund("k", &mut grant, 4).await.unwrap()),
        8
    );
    assert_eq!(grant.left(), 2);
    let err = bucket.refund("k", &mut grant, 3).await.unwrap_err();
    assert_eq!(
        err,
        RefundError::ExceedsGrant {
            units: 3,
            left: 2,
            taken: 6
        }
    );
    assert!(err.to_string().contains("2 left of the 6"), "{err}");
    assert_eq!(
        remaining(&bucket.refund("k", &mut grant, 2).await.unwrap()),
        10
    );
    assert!(matches!(
        bucket.refund("k", &mut grant, 1).await,
        Err(RefundError::ExceedsGrant { left: 0, .. })
    ));

    // Another stack's grant is refused, and so is a refund that would lift a full bucket:
    // 5 taken, 5 already back by refill, nothing more to give.
    let other = limiter(&backend, "other", Kind::TokenBucket, Limit::per_hour(10));
    let (_, grant) = other.acquire("k", 5).await.unwrap();
    let mut grant = grant.unwrap();
    assert_eq!(
        bucket.refund("k", &mut grant, 1).await.unwrap_err(),
        RefundError::WrongStack
    );
    assert_eq!(grant.left(), 5, "a refused refund leaves the grant whole");
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(
        remaining(&other.refund("k", &mut grant, 5).await.unwrap()),
        10
    );

    // No grant for a peek or a denial.
    assert!(bucket.acquire("k", 0).await.unwrap().1.is_none());
    let (_, all) = bucket.acquire("full", 10).await.unwrap();
    assert!(all.is_some());
    let (denied, none) = bucket.acquire("full", 1).await.unwrap();
    assert!(denied.is_denied() && none.is_none());
}

#[tokio::test]
async fn a_window_refund_comes_off_the_grants_window_only_while_it_counts() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server.url(), &clock, 0).await;
    let fixed = limiter(&backend, "fixed", Kind::FixedWindow, Limit::per_minute(10));
    let (_, grant) = fixed.acquire("k", 7).await.unwrap();
    let mut grant = grant.unwrap();
    assert_eq!(
        remaining(&fixed.refund("k", &mut grant, 3).await.unwrap()),
        6
    );
    // The next window started fresh: the old window's units are not given to it.
    clock.advance(Duration::from_secs(60));
    let (_, other) = fixed.acquire("k", 2).await.unwrap();
    assert_eq!(
        remaining(&fixed.refund("k", &mut grant, 4).await.unwrap()),
        8
    );
    drop(other);

    let sliding = limiter(
        &backend,
        "sliding",
        Kind::SlidingWindow,
        Limit::per_minute(10),
    );
    // At the start of a minute (windows are aligned to the Unix epoch).
    let minute = 60_000_000_000;
    clock.set((clock.now() / minute + 1) * minute);
    let (_, grant) = sliding.acquire("k", 10).await.unwrap();
    let mut grant = grant.unwrap();
    // Half way into the next window, half of the previous window's 10 still count...
    clock.advance(Duration::from_secs(90));
    assert_eq!(remaining(&sliding.check_n("k", 0).await.unwrap()), 5);
    // ...and 6 of them coming back leaves 4 previous units, 2 of which count now.
    assert_eq!(
        remaining(&sliding.refund("k", &mut grant, 6).await.unwrap()),
        8
    );
}

#[tokio::test]
async fn a_refund_clears_the_deny_cache_for_its_keys() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server.url(), &clock, 1_000).await;
    let bucket = limiter(&backend, "cached", Kind::FixedWindow, Limit::per_hour(10));
    let (_, grant) = bucket.acquire("k", 10).await.unwrap();
    let mut grant = grant.unwrap();
    assert_eq!(
        bucket.check("k").await.unwrap().origin(),
        Some(Origin::Remote)
    );
    let cached = bucket.check("k").await.unwrap();
    assert_eq!(cached.origin(), Some(Origin::DenyCache), "{cached:?}");
    bucket.refund("k", &mut grant, 4).await.unwrap();
    let after = bucket.check("k").await.unwrap();
    assert!(after.is_allowed(), "{after:?}");
    assert_eq!(after.origin(), Some(Origin::Remote));
    assert_eq!(remaining(&after), 3);
}

/// A key's limit changed by its callers: the deny cache answers only calls under the limit it
/// denied, and a grant taken under the old limit gives nothing back to the rescaled key (its
/// units were carried into the new limit's terms, and a refund never returns more than taken).
#[tokio::test]
async fn a_changed_limit_is_never_answered_from_the_old_limits_denial_or_refund() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server.url(), &clock, 1_000).await;
    let ten = limiter(&backend, "moved", Kind::FixedWindow, Limit::per_hour(10));
    let hundred = limiter(&backend, "moved", Kind::FixedWindow, Limit::per_hour(100));
    let (_, grant) = ten.acquire("k", 10).await.unwrap();
    let mut grant = grant.unwrap();
    assert_eq!(ten.check("k").await.unwrap().origin(), Some(Origin::Remote));
    assert_eq!(
        ten.check("k").await.unwrap().origin(),
        Some(Origin::DenyCache)
    );
    // Under 100 per hour the key holds 100 of 100 in use: denied by Redis, not the cache.
    let raised = hundred.check("k").await.unwrap();
    assert_eq!(raised.origin(), Some(Origin::Remote), "{raised:?}");
    assert!(raised.is_denied());
    // The denial under 100 wrote nothing, so the key is still under 10: the grant gives back.
    let back = ten.refund("k", &mut grant, 4).await.unwrap();
    assert_eq!(back.decision().unwrap().remaining(), 4);
    // Under 100, 6 of 10 is 60 of 100: one more is admitted and rewrites the key under 100.
    let admitted = hundred.check("k").await.unwrap();
    assert!(admitted.is_allowed(), "{admitted:?}");
    assert_eq!(remaining(&admitted), 39);
    // The old grant now gives nothing back, whatever it still holds.
    let back = ten.refund("k", &mut grant, 6).await.unwrap();
    assert_eq!(
        back.decision().unwrap().remaining(),
        3,
        "61 of 100 is 7 of 10, rounded up"
    );
    let peek = hundred.check_n("k", 0).await.unwrap();
    assert_eq!(remaining(&peek), 39, "the refund moved nothing");
}

#[tokio::test]
async fn a_refund_redis_does_not_take_is_an_error_and_never_comes_back_twice() {
    let mut server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend_to_kill(&server.url(), &clock).await;
    let bucket = limiter(&backend, "down", Kind::TokenBucket, Limit::per_hour(10));
    let (_, grant) = bucket.acquire("k", 6).await.unwrap();
    let mut grant: RedisGrant = grant.unwrap();
    server.kill();
    let err = bucket.refund("k", &mut grant, 4).await.unwrap_err();
    assert!(matches!(err, RefundError::Backend(_)), "{err}");
    assert_eq!(grant.left(), 2, "the units sent are spent, reply or not");
    // Failing closed takes nothing: no grant.
    let (d, none) = bucket.acquire("k", 1).await.unwrap();
    assert!(d.origin() != Some(Origin::Remote) && none.is_none());
}

/// While Redis is down, a falling-back stack's take is granted by its local fallback and given
/// back there, with the same guard: never more than it took.
#[tokio::test]
async fn a_take_the_local_fallback_decided_is_granted_and_given_back_there() {
    let mut server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend_to_kill(&server.url(), &clock).await;
    let bucket = RedisLimiter::builder(&backend, "fallback")
        .limit(Kind::TokenBucket, Limit::per_hour(10))
        .on_failure(OnFailure::Fallback)
        .build()
        .unwrap();
    server.kill();
    let (taken, grant) = bucket.acquire("k", 6).await.unwrap();
    assert_eq!(taken.origin(), Some(Origin::Fallback), "{taken:?}");
    let mut grant = grant.expect("the fallback took 6 units");
    assert!(grant.fell_back() && grant.granted_at_us() == 0, "{grant:?}");
    assert_eq!((grant.taken(), grant.left()), (6, 6));
    // 4 left locally: a take of 6 is denied, with no grant.
    let (denied, none) = bucket.acquire("k", 6).await.unwrap();
    assert!(denied.is_denied() && none.is_none(), "{denied:?}");

    let after = bucket.refund("k", &mut grant, 4).await.unwrap();
    assert_eq!(after.origin(), Some(Origin::Fallback), "{after:?}");
    assert_eq!(remaining(&after), 8, "4 of the 6 back on the fallback");
    let err = bucket.refund("k", &mut grant, 3).await.unwrap_err();
    assert!(
        matches!(err, RefundError::ExceedsGrant { left: 2, .. }),
        "{err}"
    );
    let after = bucket.refund("k", &mut grant, 2).await.unwrap();
    assert_eq!((remaining(&after), grant.left()), (10, 0), "{after:?}");
    // Full again: a take of the whole burst is admitted.
    let (whole, _) = bucket.acquire("k", 10).await.unwrap();
    assert!(whole.is_allowed(), "{whole:?}");
}

// ---- The script's refunds against the Rust algorithms'. ----

#[derive(Clone, Debug)]
enum Op {
    /// Move the clock on by this many microseconds.
    Step(u64),
    /// Acquire this cost.
    Take(u64),
    /// Give back this many units of the grant at this index (modulo the grants held).
    Give(usize, u64),
}

fn ops(period_us: u64, burst: u64) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            2 => (0..=period_us * 2).prop_map(Op::Step),
            3 => (1..=burst).prop_map(Op::Take),
            3 => (any::<usize>(), 0..=burst).prop_map(|(g, u)| Op::Give(g, u)),
        ],
        1..40,
    )
}

fn cases() -> impl Strategy<Value = (Kind, u64, u64, Vec<Op>)> {
    let kind = prop_oneof![
        Just(Kind::TokenBucket),
        Just(Kind::SlidingWindow),
        Just(Kind::FixedWindow)
    ];
    (
        kind,
        1_u64..50,
        prop_oneof![Just(1_000_000_u64), 1_000_u64..5_000_000],
    )
        .prop_flat_map(|(kind, count, period_us)| {
            (
                Just(kind),
                Just(count),
                Just(period_us),
                ops(period_us, count),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn refunds_on_redis_match_the_rust_algorithms((kind, count, period_us, ops) in cases()) {
        let server = common::RedisServer::start();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let clock = ManualClock::starting_at(START);
        let backend = runtime.block_on(backend(&server.url(), &clock, 0));
        let limit = Limit::from_nanos(count, period_us * 1_000);
        let spec = RedisLimit::new(kind, limit).unwrap();
        let limiter = limiter(&backend, "model", kind, limit);
        let key = limiter.redis_keys("k").remove(0);
        let mut conn = server.client();
        let mut now_us = START / 1_000;
        let mut state = 0_u64;
        let mut grants: Vec<(RedisGrant, u64)> = Vec::new();
        for op in ops {
            match op {
                Op::Step(us) => {
                    now_us += us;
                    clock.set(now_us * 1_000);
                }
                Op::Take(cost) => {
                    let want = spec.decide(state, cost, now_us).unwrap();
                    let (got, grant) = runtime.block_on(limiter.acquire("k", cost)).unwrap();
                    prop_assert_eq!(got.decision().unwrap(), common::micros_as_nanos(want.decision));
                    prop_assert_eq!(grant.is_some(), want.decision.is_allowed());
                    if let Some(next) = want.next {
                        state = next;
                    }
                    if let Some(grant) = grant {
                        grants.push((grant, now_us));
                    }
                }
                Op::Give(index, units) => {
                    if grants.is_empty() {
                        continue;
                    }
                    let held = grants.len();
                    let (grant, granted_us) = &mut grants[index % held];
                    prop_assert_eq!(grant.granted_at_us(), *granted_us);
                    let units = units.min(grant.left());
                    if let Some(next) = spec.refund(state, units, *granted_us, now_us) {
                        state = next;
                    }
                    let want = spec.decide(state, 0, now_us).unwrap().decision;
                    let got = runtime.block_on(limiter.refund("k", grant, units)).unwrap();
                    prop_assert_eq!(got.decision().unwrap(), common::micros_as_nanos(want), "refund of {}", units);
                }
            }
            let stored = common::stored_state(&mut conn, &key)
                .map_or(0, |raw| spec.twin_state(&raw).expect("a state this limit wrote"));
            prop_assert_eq!(stored, state, "{} {} at {} us", kind, limit, now_us);
        }
    }
}
