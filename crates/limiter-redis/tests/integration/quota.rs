//! Calendar quotas on Redis against a real `redis-server`, on pinned clocks: a day in Berlin
//! ends at its local midnight as in process; Redis's clock picks the window when a caller's
//! clock is off across a boundary; a refund gives units back only in their own window; two
//! backends on one Redis count together; a value no quota wrote is refused and left alone.
#![cfg(feature = "calendar")]

use limiter_testkit::redis_server as common;

use std::time::Duration;

use limiter_calendar::{Calendar, CalendarUnit, MAX_CALENDAR_COUNT};
use limiter_core::ManualClock;
use limiter_redis::RedisBackend;

const S: u64 = 1_000_000_000;
/// 2026-10-26 00:00 in Berlin, the end of a 25-hour day.
const MIDNIGHT: u64 = 1_792_969_200 * S;

async fn pinned(server: &common::RedisServer, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(server.url().as_str())
        .time_from(clock.clone())
        // Not a test of timeouts: a loaded machine (the whole suite at once) must not fail it.
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connects")
}

fn day() -> Calendar {
    Calendar::new(CalendarUnit::Day, "Europe/Berlin").expect("known zone")
}

/// Quota `daily`, 2 a day in Berlin, on `server` with `clock` set 10 s before [`MIDNIGHT`].
async fn two_a_day(server: &common::RedisServer, clock: &ManualClock) -> limiter_redis::RedisQuota {
    clock.set(MIDNIGHT - 10 * S);
    pinned(server, clock)
        .await
        .quota("daily", 2, day())
        .unwrap()
}

#[tokio::test]
async fn a_day_ends_at_local_midnight_and_redis_time_picks_the_window() {
    let server = common::RedisServer::start();
    let clock = ManualClock::new();
    let quota = two_a_day(&server, &clock).await;
    // A key that counts nothing is full now: no reset to wait for.
    let fresh = quota.take("acme", 0, MIDNIGHT - 10 * S).await.unwrap();
    assert_eq!(
        (
            fresh.decision.remaining(),
            fresh.decision.reset_after_nanos()
        ),
        (2, 0)
    );
    let first = quota.take("acme", 2, MIDNIGHT - 10 * S).await.unwrap();
    assert!(first.decision.is_allowed());
    assert_eq!(first.decision.reset_after(), Duration::from_secs(10));
    let denied = quota.take("acme", 1, MIDNIGHT - 10 * S).await.unwrap();
    assert!(denied.decision.is_denied());
    assert_eq!(denied.decision.retry_after(), Duration::from_secs(10));

    // A reading between milliseconds: the wait still ends at midnight exactly (Redis counts
    // whole milliseconds left on its clock, which would land 0.4 ms past it).
    let between = MIDNIGHT - 10 * S + 400_000;
    clock.set(between);
    let exact = quota.take("acme", 0, between).await.unwrap();
    assert_eq!(between + exact.decision.reset_after_nanos(), MIDNIGHT);

    // Redis's clock is past midnight while this caller's still reads the old day: Redis's
    // clock decides, so the call counts in the new day, full again at its end (the boundary
    // itself, measured from this caller's reading, as in process)...
    clock.set(MIDNIGHT + S);
    let late = quota.take("acme", 1, MIDNIGHT - S).await.unwrap();
    assert!(late.decision.is_allowed());
    assert_eq!(late.window, first.window + 1);
    assert_eq!(late.decision.remaining(), 1);
    let next_midnight = MIDNIGHT + 24 * 3_600 * S;
    assert_eq!(
        MIDNIGHT - S + late.decision.reset_after_nanos(),
        next_midnight
    );
    // ...while a denial's wait is Redis's, whose clock reaches that end 2 s sooner: no caller
    // is told to come back later than it may, nor before.
    assert!(
        quota
            .take("acme", 1, MIDNIGHT - S)
            .await
            .unwrap()
            .decision
            .is_allowed()
    );
    let denied = quota.take("acme", 1, MIDNIGHT - S).await.unwrap();
    assert!(denied.decision.is_denied());
    assert_eq!(
        denied.decision.retry_after(),
        Duration::from_secs(24 * 3_600 - 1)
    );
    assert_eq!(
        MIDNIGHT - S + denied.decision.reset_after_nanos(),
        next_midnight
    );
}

#[tokio::test]
async fn a_refund_comes_back_only_in_its_own_window_and_backends_share_the_count() {
    let server = common::RedisServer::start();
    let clock = ManualClock::new();
    clock.set(MIDNIGHT - 100 * S);
    let (a, b) = (pinned(&server, &clock).await, pinned(&server, &clock).await);
    let (qa, qb) = (
        a.quota("daily", 3, day()).unwrap(),
        b.quota("daily", 3, day()).unwrap(),
    );
    let at = MIDNIGHT - 100 * S;
    let taken = qa.take("acme", 2, at).await.unwrap();
    assert_eq!(
        qb.take("acme", 1, at).await.unwrap().decision.remaining(),
        0,
        "one count"
    );
    qa.refund("acme", 2, taken.window).await.unwrap();
    assert_eq!(
        qb.take("acme", 2, at).await.unwrap().decision.remaining(),
        0
    );
    // A refund of a window that has passed gives nothing back to the next.
    clock.set(MIDNIGHT);
    let new_day = qa.take("acme", 3, MIDNIGHT).await.unwrap();
    assert!(new_day.decision.is_allowed());
    qa.refund("acme", 3, taken.window).await.unwrap();
    assert!(
        qb.take("acme", 1, MIDNIGHT)
            .await
            .unwrap()
            .decision
            .is_denied()
    );
    assert!(a.quota("daily", 0, day()).is_err());
}

#[tokio::test]
async fn a_record_counts_whatever_the_window_holds_and_leaves_it_in_debt_until_it_ends() {
    let server = common::RedisServer::start();
    let clock = ManualClock::new();
    let at = MIDNIGHT - 100 * S;
    clock.set(at);
    let quota = pinned(&server, &clock)
        .await
        .quota("tokens", 10, day())
        .unwrap();
    // Within the count: admitted, as a take would be.
    let within = quota.record("acme", 6, at).await.unwrap();
    assert!(within.decision.is_allowed());
    assert_eq!(within.decision.remaining(), 4);
    // Past it: written all the same (a take of 6 would be refused and count nothing).
    let over = quota.record("acme", 6, at).await.unwrap();
    assert!(over.decision.is_denied());
    assert_eq!(over.decision.retry_after(), Duration::from_secs(100));
    assert!(
        quota
            .take("acme", 0, at)
            .await
            .unwrap()
            .decision
            .is_denied()
    );
    assert!(
        quota
            .take("acme", 1, at)
            .await
            .unwrap()
            .decision
            .is_denied()
    );
    // At most twice the count is held, so the debt ends with the window all the same.
    let capped = quota.record("acme", 1_000, at).await.unwrap();
    assert!(capped.decision.is_denied());
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let held: String = redis::cmd("GET")
        .arg("limiter:quota:tokens:{acme}")
        .query(&mut redis)
        .unwrap();
    assert_eq!(held, format!("{}:20:10:1d@Europe/Berlin", within.window));
    clock.set(MIDNIGHT);
    let next_day = quota.take("acme", 10, MIDNIGHT).await.unwrap();
    assert!(next_day.decision.is_allowed());
    assert_eq!(next_day.window, within.window + 1);
}

#[tokio::test]
async fn bad_settings_are_refused_naming_what_is_wrong() {
    let server = common::RedisServer::start();
    let backend = RedisBackend::builder(server.url().as_str())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    for count in [0, limiter_calendar::MAX_CALENDAR_COUNT + 1] {
        let err = backend.quota("monthly", count, day()).unwrap_err();
        assert!(
            matches!(err, limiter_redis::BuildError::Quota { .. }),
            "{err}"
        );
        assert!(err.to_string().contains("give 1"), "{err}");
    }
    for name in ["", "a{b"] {
        let err = backend.quota(name, 10, day()).unwrap_err();
        assert!(
            matches!(
                err,
                limiter_redis::BuildError::BadName { what: "quota", .. }
            ),
            "{err}"
        );
    }
    let err = backend
        .quota("monthly", 10, day())
        .unwrap()
        .with_prefix("")
        .unwrap_err();
    assert!(err.to_string().contains("prefix `` is empty"), "{err}");
}

/// A value at a quota's key that no quota wrote (an operator's, another program's under the
/// same prefix) is refused with an error naming the key and the fix, and left as found: not
/// read as an empty window, which would count from zero and admit past the count.
#[tokio::test]
async fn a_value_no_quota_wrote_is_refused_naming_its_key_and_left_alone() {
    use redis::Commands;
    let server = common::RedisServer::start();
    let clock = ManualClock::new();
    let quota = two_a_day(&server, &clock).await;
    let mut conn = server.client();
    let strings = ["not a counter", "12", "7:1:junk", "7:1:0:1d@Europe/Berlin"];
    for (i, value) in strings.iter().enumerate() {
        let key = format!("s{i}");
        let redis_key = format!("limiter:quota:daily:{{{key}}}");
        let _: () = conn.set(&redis_key, value).unwrap();
        let taken = quota.take(&key, 1, MIDNIGHT - 10 * S).await;
        let refunded = quota.refund(&key, 1, 7).await;
        for error in [taken.map(|_| ()).unwrap_err(), refunded.unwrap_err()] {
            let message = error.to_string();
            assert!(message.contains(&redis_key), "{value}: {message}");
            assert!(
                message.contains("delete it or change the prefix"),
                "{value}: {message}"
            );
        }
        let kept: String = conn.get(&redis_key).unwrap();
        assert_eq!(&kept, value, "left as found");
    }
    let _: () = conn
        .hset("limiter:quota:daily:{hash}", "field", "1")
        .unwrap();
    let error = quota.take("hash", 1, MIDNIGHT - 10 * S).await.unwrap_err();
    assert!(error.to_string().contains("WRONGTYPE"), "{error}");
    assert!(error.to_string().contains("{hash}"), "{error}");
    // A counter written before the count and calendar were kept still counts.
    let window = quota
        .take("new", 0, MIDNIGHT - 10 * S)
        .await
        .unwrap()
        .window;
    let _: () = conn
        .set("limiter:quota:daily:{old}", format!("{window}:1"))
        .unwrap();
    let old = quota.take("old", 1, MIDNIGHT - 10 * S).await.unwrap();
    assert_eq!(old.decision.remaining(), 0, "{old:?}");
}

#[tokio::test]
async fn a_counter_keeps_its_consumption_when_its_count_or_calendar_changes() {
    let server = common::RedisServer::start();
    let clock = ManualClock::new();
    let at = MIDNIGHT - 100 * S;
    clock.set(at);
    let backend = pinned(&server, &clock).await;
    let quota = |count: u64, calendar: Calendar| backend.quota("plan", count, calendar).unwrap();
    let left = |answer: limiter_redis::QuotaAnswer| answer.decision.remaining();
    assert_eq!(left(quota(3, day()).take("acme", 1, at).await.unwrap()), 2);
    // 1 of 3 used is 2 of 6 (the same fraction, rounded up); 3 of 6 is 2 of 3.
    assert_eq!(left(quota(6, day()).take("acme", 0, at).await.unwrap()), 4);
    assert_eq!(left(quota(6, day()).take("acme", 1, at).await.unwrap()), 3);
    assert_eq!(left(quota(3, day()).take("acme", 0, at).await.unwrap()), 1);
    // Another calendar: the counter's day is still on, so it counts in the month's window.
    let month = Calendar::new(CalendarUnit::Month, "Asia/Tokyo").expect("known zone");
    let in_month = quota(12, month.clone()).take("acme", 0, at).await.unwrap();
    assert_eq!(left(in_month), 6, "3 of 6 used is 6 of 12");
    assert_eq!(in_month.window, month.window(at).expect("in range").index);
    // Once the day it counted in has ended, nothing carries over.
    clock.set(MIDNIGHT);
    assert_eq!(
        left(quota(3, day()).take("acme", 0, MIDNIGHT).await.unwrap()),
        3
    );

    // A counter written as `index:used` (before the count and calendar were kept) counts as
    // written under the same ones.
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let window = day().window(MIDNIGHT).expect("in range").index;
    let _: () = redis::cmd("SET")
        .arg("limiter:quota:plan:{old}")
        .arg(format!("{window}:2"))
        .query(&mut redis)
        .unwrap();
    assert_eq!(
        left(quota(3, day()).take("old", 0, MIDNIGHT).await.unwrap()),
        1
    );

    // Counts past 2^53 in Lua's doubles: never less than the exact fraction, rounded up, and
    // at most one more.
    let (old, new) = (MAX_CALENDAR_COUNT, MAX_CALENDAR_COUNT - 2);
    let used = old / 3 + 1;
    let exact = (u128::from(used) * u128::from(new)).div_ceil(u128::from(old));
    let exact = u64::try_from(exact).unwrap();
    quota(old, day()).take("big", used, MIDNIGHT).await.unwrap();
    let scaled = new - left(quota(new, day()).take("big", 0, MIDNIGHT).await.unwrap());
    assert!(
        exact <= scaled && scaled <= exact + 1,
        "{scaled} for {exact}"
    );
}
