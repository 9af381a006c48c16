//! Records of usage that already happened, on a real `redis-server`: never refused, a debt past
//! the limit that later checks respect until it is paid back (envoy's check-then-charge
//! pattern), every layer of a stack debited, a record inside a refused batch still written,
//! the deny cache fed by a debt and never denying past it, and the failure policies.

use limiter_testkit::redis_server as common;

use std::time::Duration;

use limiter_core::{Limit, ManualClock};
use limiter_redis::{
    Kind, OnFailure, Origin, RedisBackend, RedisDecision, RedisLayer, RedisLimiter, RedisStack,
};

const SECOND: u64 = 1_000_000_000;
/// A fixed instant (Nov 2026) in ns since the Unix epoch, on a minute's boundary.
const START: u64 = 1_795_000_020 * SECOND;

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

fn remaining(d: &RedisDecision) -> u64 {
    d.decision().unwrap().remaining()
}

/// The quota leak, closed: with 10,000 tokens a minute, a check passes, a charge of 6,000
/// leaves 4,000, the next charge of 6,000 is recorded (not refused), and every check after it is
/// over until the debt is paid back, for each algorithm.
#[tokio::test]
async fn check_then_charge_never_leaks_the_quota() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    for kind in [Kind::TokenBucket, Kind::FixedWindow, Kind::SlidingWindow] {
        clock.set(START);
        let tokens = RedisLimiter::builder(&backend, format!("tokens-{kind}"))
            .limit(kind, Limit::per_minute(10_000))
            .on_failure(OnFailure::Closed)
            .build()
            .unwrap();
        assert!(tokens.check_n("team", 0).await.unwrap().is_allowed());
        let first = tokens.record("team", 6_000).await.unwrap();
        assert!(first.is_allowed(), "{kind}: {first:?}");
        assert_eq!(remaining(&first), 4_000);
        assert!(tokens.check_n("team", 0).await.unwrap().is_allowed());
        let second = tokens.record("team", 6_000).await.unwrap();
        assert_eq!(second.origin(), Some(Origin::Remote));
        assert!(
            second.is_denied(),
            "{kind}: the second charge is over: {second:?}"
        );
        assert_eq!(remaining(&second), 0);
        let check = tokens.check_n("team", 0).await.unwrap();
        assert!(
            check.is_denied(),
            "{kind}: the check after it is over: {check:?}"
        );
        // The wait the record gave is exact: one unit before it denied, at it admitted.
        let wait = second.decision().unwrap().retry_after_nanos();
        clock.advance_nanos(wait - 1_000);
        assert!(tokens.check("team").await.unwrap().is_denied(), "{kind}");
        clock.advance_nanos(1_000);
        assert!(tokens.check("team").await.unwrap().is_allowed(), "{kind}");
        match kind {
            // 2,000 owed past the limit, then one unit: 2,001 units at 6 ms each.
            Kind::TokenBucket => assert_eq!(wait, 2_001 * 6_000_000),
            // Over until the window ends, as envoy's reference counts.
            Kind::FixedWindow => assert_eq!(wait, 60 * SECOND),
            // The next window weighs 12,000: one unit fits once 9,999 of it is left.
            _ => assert!(wait > 60 * SECOND, "{wait}"),
        }
    }
}

/// Every layer of a stack is debited by a record, whatever another layer holds: a record
/// past the global limit still counts on the user's own layer, and the global layer's debt
/// refuses everyone until it is paid back.
#[tokio::test]
async fn a_record_debits_every_layer_and_each_keeps_its_debt() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let stack = RedisStack::builder(&backend, "layers")
        .layer(
            RedisLayer::keyed("user", |u: &&str| Some((*u).to_owned()))
                .limit(Kind::TokenBucket, Limit::per_minute(100)),
        )
        .layer(RedisLayer::global("all").limit(Kind::TokenBucket, Limit::per_minute(150)))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let d = stack.record(&"ada", 120).await.unwrap();
    assert!(d.is_denied(), "ada's own layer is 20 in debt: {d:?}");
    assert_eq!(d.stack().binding().unwrap().layer, 0);
    let bob = stack.check_n(&"bob", 30).await.unwrap();
    assert!(bob.is_allowed(), "30 of the global 150 are left: {bob:?}");
    let bob = stack.record(&"bob", 40).await.unwrap();
    assert!(bob.is_denied(), "the global layer is 40 in debt: {bob:?}");
    assert_eq!(bob.stack().binding().unwrap().layer, 1);
    assert!(
        stack.check(&"cy").await.unwrap().is_denied(),
        "the debt refuses everyone"
    );
    let peek = stack.check_n(&"ada", 0).await.unwrap();
    let user = peek.layers().iter().next().unwrap().decision;
    assert!(user.is_denied() && user.remaining() == 0, "{user:?}");
}

/// A record in an all-or-nothing batch is written whatever the batch's answer: a refused
/// batch takes nothing from its checks and still records the usage; an admitted one does both.
#[tokio::test]
async fn a_record_in_a_refused_batch_is_still_written() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 0).await;
    let seats = RedisLimiter::builder(&backend, "seats")
        .limit(Kind::FixedWindow, Limit::per_hour(10))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let stack = seats.stack();
    let (ada, bob) = ("ada".to_owned(), "bob".to_owned());
    assert!(seats.check_n("bob", 10).await.unwrap().is_allowed());
    let mut batch = backend.batch();
    batch.add(stack, &ada, 2);
    batch.add_record(stack, &ada, 3);
    batch.add(stack, &bob, 1); // refused: bob has nothing left
    let decided = batch.decide().await.unwrap();
    assert!(!decided.is_admitted());
    let [check, record, refused] =
        <[RedisDecision; 3]>::try_from(decided.into_decisions()).unwrap();
    assert!(refused.is_denied());
    assert!(record.is_allowed());
    assert_eq!(
        remaining(&record),
        7,
        "recorded on the state before the batch"
    );
    assert!(check.is_allowed());
    assert_eq!(
        remaining(&check),
        7,
        "the admitted check reports the state after the batch"
    );
    let peek = seats.check_n("ada", 0).await.unwrap();
    assert_eq!(remaining(&peek), 7, "only the record was written");

    let mut batch = backend.batch();
    batch.add(stack, &ada, 2);
    batch.add_record(stack, &ada, 4);
    let decided = batch.decide().await.unwrap();
    assert!(decided.is_admitted());
    assert_eq!(remaining(&seats.check_n("ada", 0).await.unwrap()), 1);
}

/// A record past the limit enters the deny cache, which then answers checks of any cost
/// locally until the debt's wait, and never after it.
#[tokio::test]
async fn a_debt_feeds_the_deny_cache_and_never_outlives_its_wait() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 1_000).await;
    let limiter = RedisLimiter::builder(&backend, "cached")
        .limit(Kind::TokenBucket, Limit::per_second(10))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let owed = limiter.record("k", 12).await.unwrap();
    assert!(owed.is_denied());
    // Two units in debt, then one: 300 ms.
    assert_eq!(
        owed.decision().unwrap().retry_after(),
        Duration::from_millis(300)
    );
    let cached = limiter.check("k").await.unwrap();
    assert_eq!(cached.origin(), Some(Origin::DenyCache));
    // A record is never answered from the cache: it reaches Redis and is counted.
    let again = limiter.record("k", 1).await.unwrap();
    assert_eq!(again.origin(), Some(Origin::Remote));
    assert_eq!(
        again.decision().unwrap().retry_after(),
        Duration::from_millis(400)
    );
    clock.advance(Duration::from_millis(400));
    let after = limiter.check("k").await.unwrap();
    assert_eq!(after.origin(), Some(Origin::Remote));
    assert!(after.is_allowed(), "{after:?}");
}

/// While Redis is out, the fallback records on the local limits (which then deny), and fail
/// closed records nothing and says so.
#[tokio::test]
async fn records_follow_the_failure_policy_while_redis_is_out() {
    let mut server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = RedisBackend::builder(server.url())
        .time_from(clock.clone())
        .clock(clock.clone())
        .timeout(Duration::from_millis(200))
        .deny_cache(0)
        .connect()
        .await
        .unwrap();
    let fallback = RedisLimiter::builder(&backend, "fb")
        .limit(Kind::TokenBucket, Limit::per_minute(10))
        .on_failure(OnFailure::Fallback)
        .build()
        .unwrap();
    let closed = RedisLimiter::builder(&backend, "closed")
        .limit(Kind::TokenBucket, Limit::per_minute(10))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    server.kill();
    let owed = fallback.record("k", 11).await.unwrap();
    assert_eq!(owed.origin(), Some(Origin::Fallback), "{owed:?}");
    assert!(owed.is_denied());
    let next = fallback.check("k").await.unwrap();
    assert_eq!(next.origin(), Some(Origin::Fallback));
    assert!(
        next.is_denied(),
        "the local fallback carries the debt: {next:?}"
    );
    let refused = closed.record("k", 1).await.unwrap();
    assert!(refused.failed_closed(), "{refused:?}");
}

/// Units given back without a grant (envoy's `is_negative_hits`) come back to every limit,
/// never above full, and clear the deny cache for the keys.
#[tokio::test]
async fn a_unit_refund_returns_units_never_above_full() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = backend(&server, &clock, 1_000).await;
    let limiter = RedisLimiter::builder(&backend, "refill")
        .limit(Kind::FixedWindow, Limit::per_minute(5))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let key = "k".to_owned();
    assert!(limiter.check_n("k", 5).await.unwrap().is_allowed());
    assert_eq!(
        limiter.check("k").await.unwrap().origin(),
        Some(Origin::Remote)
    );
    assert_eq!(
        limiter.check("k").await.unwrap().origin(),
        Some(Origin::DenyCache)
    );
    let back = limiter.stack().refund_units(&key, 2).await.unwrap();
    assert_eq!(remaining(&back), 2);
    let next = limiter.check("k").await.unwrap();
    assert_eq!(
        next.origin(),
        Some(Origin::Remote),
        "the deny cache was cleared"
    );
    assert!(next.is_allowed());
    let full = limiter.stack().refund_units(&key, 50).await.unwrap();
    assert_eq!(remaining(&full), 5, "never above full");
}
