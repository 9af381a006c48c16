//! Every limit a user can write, against the exact reference model in `u128`: the limits users
//! copy from pricing pages (1009 per minute, 617 per second, 99,991 per hour), the extremes of
//! the supported range (1 to `u32::MAX` units, 1 µs to 366 days, bursts to `u32::MAX`), and
//! random limits over that whole range with clock readings up to the end of each limit's range.

use std::time::Duration;

use limiter_core::{Accuracy, Algorithm, MIN_CLOCK_RANGE};
use limiter_testkit::harness::{greedy_span, proptest_config, run_conservative};
use limiter_testkit::model::GcraModel;
use limiter_testkit::ops::ops;
use limiter_token_bucket::{Gcra, KeyedTokenBucket, Limit, ManualClock, TokenBucket};
use proptest::prelude::*;

const MICRO: u64 = 1_000;
const DAY: u64 = 86_400_000_000_000;
const MAX_PERIOD: u64 = 366 * DAY;
const MAX_UNITS: u64 = u32::MAX as u64;

/// The limits named in the issue that reported them refused, and the corners of the range.
fn ordinary_and_extreme() -> Vec<Limit> {
    let mut limits = vec![
        Limit::per_minute(1009),
        Limit::per_second(617),
        Limit::per_second(1234),
        Limit::new(99_991, Duration::from_secs(3_600)),
        Limit::per_minute(257),
        Limit::per_day(MAX_UNITS),
        Limit::per_second(1_000_000),
        Limit::per_second(999_983),
    ];
    for count in [1, 7, 1009, MAX_UNITS] {
        for period in [MICRO, 1_000_003, 60_000_000_000, MAX_PERIOD] {
            for burst in [None, Some(1), Some(MAX_UNITS)] {
                let limit = Limit::from_nanos(count, period);
                limits.push(burst.map_or(limit, |b| limit.with_burst(b)));
            }
        }
    }
    limits
}

/// The shortfall the contract allows: 1 unit in 10^5 for every limit up to 10^6 per second.
fn within_contract(limit: &Limit, accuracy: Accuracy) -> bool {
    let per_second_or_less =
        u128::from(limit.count()) * 1_000_000_000 <= 1_000_000 * u128::from(limit.period_nanos());
    !per_second_or_less || accuracy.shortfall_per_billion() <= 10_000
}

#[test]
fn every_ordinary_and_extreme_limit_is_accepted_and_decides() {
    for limit in ordinary_and_extreme() {
        let gcra = Gcra::new(limit).unwrap_or_else(|e| panic!("{limit} refused: {e}"));
        assert!(gcra.max_now_nanos() >= MIN_CLOCK_RANGE, "{limit}");
        assert!(
            within_contract(&limit, gcra.accuracy()),
            "{limit}: {}",
            gcra.accuracy()
        );
        let clock = ManualClock::new();
        let bucket = TokenBucket::with_clock(limit, clock.clone()).unwrap();
        let keyed = KeyedTokenBucket::<&str, _>::with_clock(limit, clock.clone()).unwrap();
        assert!(
            bucket.check_n(limit.burst()).unwrap().is_allowed(),
            "{limit}"
        );
        assert!(keyed.check_key_n(&"k", limit.burst()).unwrap().is_allowed());
        let denied = bucket.check().unwrap();
        assert!(
            denied.is_denied() && denied.retry_after_nanos() > 0,
            "{limit}"
        );
        // The retry instant is never before one whole interval: units never come back early.
        assert!(
            u128::from(denied.retry_after_nanos()) * u128::from(limit.count())
                >= u128::from(limit.period_nanos()),
            "{limit}: retry after {denied:?}"
        );
        clock.advance(denied.retry_after());
        assert!(bucket.check().unwrap().is_allowed(), "{limit}");
        // A unit takes at most its interval stretched by the stated shortfall: the greedy
        // caller's 20 units take no longer than 21 exact intervals.
        let span = greedy_span(&gcra, 0, 20).unwrap_or_else(|e| panic!("{limit}: {e}"));
        assert!(
            u128::from(span) * u128::from(limit.count())
                <= 21 * u128::from(limit.period_nanos()) + 21 * u128::from(limit.count()),
            "{limit}: {span}"
        );
    }
}

/// Any limit in the supported range: counts and bursts 1 to `u32::MAX` (biased to the edges and
/// to round numbers), periods 1 µs to 366 days (biased to round periods and primes).
fn any_limit() -> impl Strategy<Value = Limit> {
    let units = || {
        prop_oneof![
            1u64..=100,
            1u64..=MAX_UNITS,
            Just(MAX_UNITS),
            prop::sample::select(vec![617, 1009, 1234, 99_991, 1_000_000, 999_983])
        ]
    };
    let period = prop_oneof![
        MICRO..=MAX_PERIOD,
        prop::sample::select(vec![
            MICRO,
            1_000_000,
            1_000_000_000,
            60_000_000_000,
            3_600_000_000_000,
            DAY,
            MAX_PERIOD
        ]),
        (1u64..=1_000_000).prop_map(|ms| ms * 1_000_000),
    ];
    (
        units(),
        period,
        prop_oneof![Just(None), units().prop_map(Some)],
    )
        .prop_map(|(count, period, burst)| {
            let limit = Limit::from_nanos(count, period);
            burst.map_or(limit, |b| limit.with_burst(b))
        })
}

proptest! {
    #![proptest_config(proptest_config(1_000))]

    /// The exact model bounds admissions over every span; exact limits match it call for call;
    /// every retry is the algorithm's own first admitting instant; the clock may start anywhere
    /// up to the end of the limit's range and step back.
    #[test]
    fn every_limit_keeps_the_exact_bound_over_the_whole_clock_range(
        (limit, start, script) in any_limit().prop_flat_map(|limit| {
            let max = Gcra::new(limit).expect("accepted").max_now_nanos();
            let start = prop_oneof![Just(0), 0..=max, max.saturating_sub(1 << 20)..=max, Just(max)];
            (Just(limit), start, ops(limit.interval().as_nanos().min(u128::from(u64::MAX / 4)) as u64 + 1, limit.burst()))
        })
    ) {
        let gcra = Gcra::new(limit).expect("accepted");
        prop_assert!(gcra.max_now_nanos() >= MIN_CLOCK_RANGE);
        prop_assert!(within_contract(&limit, gcra.accuracy()), "{}: {}", limit, gcra.accuracy());
        if let Err(e) = run_conservative::<Gcra, GcraModel>(limit, start, &script) {
            prop_assert!(false, "{}", e);
        }
    }

    /// The shortfall is real and no larger than stated: a greedy caller's units come at least
    /// as fast as `rate * (1 - shortfall)` allows (within one interval), and never faster than
    /// the exact rate. (Only for limits of at most one unit a nanosecond: a caller on a
    /// nanosecond clock cannot take more than a burst in one reading.)
    #[test]
    fn a_greedy_caller_gets_the_stated_rate(limit in any_limit(), start_seed in any::<u64>()) {
        prop_assume!(limit.count() <= limit.period_nanos());
        let gcra = Gcra::new(limit).expect("accepted");
        let units = 32;
        // The caller's readings must stay within the limit's clock range: start early enough
        // for `units + 2` intervals to fit before its end.
        let need = (u128::from(units) + 2) * u128::from(limit.period_nanos())
            / u128::from(limit.count())
            + 1;
        let room = u128::from(gcra.max_now_nanos() / 2).saturating_sub(need);
        prop_assume!(room > 0);
        let start = (u128::from(start_seed) % room) as u64;
        let span = greedy_span(&gcra, start, units).map_err(TestCaseError::fail)?;
        let (count, period) = (u128::from(limit.count()), u128::from(limit.period_nanos()));
        let billion = 1_000_000_000u128;
        let kept = billion - u128::from(gcra.accuracy().shortfall_per_billion());
        // Not faster than exact: `units` units need at least `units` intervals, less the
        // fraction of one that a mid-interval start may already hold.
        prop_assert!(u128::from(span) * count + period >= u128::from(units) * period, "{} took {}", limit, span);
        // Not slower than stated: span * rate * (1 - shortfall) <= units + 1, plus a tick of
        // flooring for coarse ticks (at most 2^s ns, tiny against these intervals). With a
        // burst of 1 the bucket holds no fraction of a unit across readings, so each unit also
        // waits for the next whole nanosecond the clock can read (up to 1 ns a unit: 999,983
        // per ms, an interval of 1.0078 ns in ticks, is taken every 2 ns).
        let (_, shift, _, _) = gcra.ticks();
        let per_unit_reading = if limit.burst() == 1 { u128::from(units) } else { 0 };
        let slack = ((1u128 << shift) + per_unit_reading) * count * kept;
        prop_assert!(
            u128::from(span) * count * kept <= (u128::from(units) + 1) * period * billion + slack,
            "{} took {} ns for {} units ({})", limit, span, units, gcra.accuracy()
        );
    }
}

/// The case the greedy-rate property found: near one unit a nanosecond with a burst of 1,
/// a caller reading a nanosecond clock is admitted every other nanosecond, never faster than
/// the limit and within the per-reading slack above.
#[test]
fn near_one_unit_a_nanosecond_with_burst_one_is_admitted_every_other_reading() {
    let limit = Limit::from_nanos(999_983, 1_000_000).with_burst(1);
    let gcra = Gcra::new(limit).expect("accepted");
    let span = greedy_span(&gcra, 0, 32).expect("admits");
    assert!((32..=64).contains(&span), "{span} ns for 32 units");
}
