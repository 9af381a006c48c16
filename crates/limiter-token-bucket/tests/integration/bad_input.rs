//! Bad input through the public API: every case is a clear error or a sane decision, never a
//! panic, an overflow, or an admission beyond the burst.

use std::time::Duration;

use limiter_token_bucket::{
    DecisionError, KeyedTokenBucket, Limit, LimitError, ManualClock, TokenBucket,
};

/// A limit is written without `?`; one that cannot be counted is refused where a limiter is
/// built from it, direct or keyed, naming the field.
#[test]
fn invalid_limits_are_refused_at_construction_with_the_field_named() {
    let cases = [
        (Limit::per_second(0), LimitError::ZeroCount, "`count`"),
        (
            Limit::new(5, Duration::ZERO),
            LimitError::ZeroPeriod,
            "`period`",
        ),
        (
            Limit::per_minute(5).with_burst(0),
            LimitError::ZeroBurst,
            "`burst`",
        ),
        (
            Limit::new(1, Duration::MAX),
            LimitError::PeriodTooLong {
                period: Duration::MAX,
            },
            "`period`",
        ),
    ];
    for (limit, want, field) in cases {
        assert_eq!(limit.check(), Err(want.clone()), "{limit:?}");
        let direct = TokenBucket::with_clock(limit, ManualClock::new()).unwrap_err();
        assert_eq!(direct, want, "{limit:?}");
        assert!(
            direct.to_string().contains(field),
            "{direct} should name {field}"
        );
        let keyed = KeyedTokenBucket::<u64, _>::with_clock(limit, ManualClock::new()).unwrap_err();
        assert_eq!(keyed, want, "{limit:?}");
        assert_eq!(TokenBucket::new(limit).unwrap_err(), want);
    }
}

#[test]
fn only_bursts_beyond_any_bucket_are_refused_and_in_the_users_terms() {
    // Once refused for needing too fine a tick: now counted, conservatively.
    for limit in [Limit::per_minute(1009), Limit::per_second(1 << 40)] {
        assert!(
            TokenBucket::with_clock(limit, ManualClock::new()).is_ok(),
            "{limit}"
        );
    }
    let long_burst = Limit::per_day(1).with_burst(u64::MAX);
    let err = TokenBucket::with_clock(long_burst, ManualClock::new()).unwrap_err();
    assert!(
        matches!(
            err,
            LimitError::Unsupported {
                algorithm: "token bucket",
                ..
            }
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(msg.contains("burst") && msg.contains("at most"), "{msg}");
    for internal in ["tick", "clock range", "2^"] {
        assert!(!msg.contains(internal), "{msg} speaks of {internal}");
    }
}

#[test]
fn extreme_limits_decide_without_overflow() {
    let extremes = [
        Limit::from_nanos(u64::MAX, u64::MAX),
        Limit::from_nanos(1, u64::MAX),
        Limit::from_nanos(1, 1),
        Limit::from_nanos(1, u64::MAX / 2).with_burst(2),
    ];
    for limit in extremes {
        let clock = ManualClock::new();
        let Ok(bucket) = TokenBucket::with_clock(limit, clock.clone()) else {
            continue;
        };
        let all = bucket.check_n(limit.burst()).unwrap();
        assert!(all.is_allowed(), "{limit}");
        let denied = bucket.check().unwrap();
        assert!(
            denied.is_denied() && denied.retry_after_nanos() > 0,
            "{limit}: {denied:?}"
        );
        for now in [1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            clock.set(now);
            match bucket.check_n(limit.burst()) {
                Ok(d) => assert!(d.remaining() <= limit.burst()),
                Err(DecisionError::ClockOutOfRange { now_ns, .. }) => assert_eq!(now_ns, now),
                Err(e) => panic!("{limit} at {now}: {e}"),
            }
        }
    }
}

#[test]
fn costs_above_the_burst_are_errors_on_every_form() {
    let limit = Limit::per_second(10).with_burst(4);
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(limit, clock.clone()).unwrap();
    let keyed = KeyedTokenBucket::<u64, _>::with_clock(limit, clock).unwrap();
    let want = Err(DecisionError::CostExceedsBurst { cost: 5, burst: 4 });
    assert_eq!(bucket.check_n(5), want);
    assert_eq!(keyed.check_key_n(&1, 5), want);
    assert!(keyed.is_empty(), "an erroring call inserted a key");
    let msg = DecisionError::CostExceedsBurst { cost: 5, burst: 4 }.to_string();
    assert!(msg.contains("split the request"), "{msg}");
}

#[test]
fn denied_floods_of_new_keys_insert_nothing() {
    let limit = Limit::per_second(1);
    let keyed = KeyedTokenBucket::<u64, _>::with_clock(limit, ManualClock::new()).unwrap();
    for key in 0..1_000 {
        assert!(keyed.check_key_n(&key, 2).is_err());
        assert!(keyed.peek_key(&key).unwrap().is_allowed());
    }
    assert!(keyed.is_empty());
}
