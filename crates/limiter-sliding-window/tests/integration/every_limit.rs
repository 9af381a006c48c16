//! Every limit a user can write, on both window counters, against the plain window models: the
//! table of ordinary and extreme limits, and random limits over the whole supported range (1 to
//! `u32::MAX` per window, windows of 1 µs to 366 days) with readings up to the end of each
//! limit's range. Where a counter is conservative it must never admit more than the model's
//! bound; where it is exact it must match the model call for call.

use limiter_core::{Algorithm, MIN_CLOCK_RANGE};
use limiter_sliding_window::{
    FixedCounter, KeyedSlidingWindow, Limit, ManualClock, SlidingCounter, SlidingWindow,
};
use limiter_testkit::harness::{proptest_config, run_conservative};
use limiter_testkit::model::{FixedWindowModel, SlidingWindowModel};
use limiter_testkit::ops::{Op, ops};
use proptest::prelude::*;

const MICRO: u64 = 1_000;
const SECOND: u64 = 1_000_000_000;
const DAY: u64 = 86_400 * SECOND;
const MAX_UNITS: u64 = u32::MAX as u64;

#[test]
fn a_million_per_second_and_a_hundred_million_per_minute_keep_their_range() {
    for (count, window) in [
        (1_000_000, SECOND),
        (100_000_000, 60 * SECOND),
        (10_000, SECOND),
    ] {
        let limit = Limit::from_nanos(count, window);
        let sliding = SlidingCounter::new(limit).unwrap();
        assert!(sliding.max_now_nanos() >= MIN_CLOCK_RANGE, "{limit}");
        assert_eq!(sliding.accuracy().horizon_nanos(), None, "{limit}");
        // At most 1 unit in 10,000 short (the previous count's granule, which also holds a
        // window in debt: 31 units in 10^6, 8,191 in 10^8).
        assert!(
            sliding.accuracy().shortfall_per_billion() <= 100_000,
            "{limit}: {}",
            sliding.accuracy()
        );
        assert!(
            FixedCounter::new(limit).unwrap().accuracy().is_exact(),
            "{limit}"
        );
    }
}

#[test]
fn every_ordinary_and_extreme_limit_is_accepted_and_admits_exactly_its_count() {
    for count in [1, 617, 1009, 262_144, 1_000_000, MAX_UNITS] {
        for window in [MICRO, 1_000_003, SECOND, 60 * SECOND, 366 * DAY] {
            let limit = Limit::from_nanos(count, window);
            let clock = ManualClock::starting_at(window / 2);
            let sliding = SlidingWindow::with_clock(limit, clock.clone()).unwrap();
            let keyed = KeyedSlidingWindow::<u8, _>::with_clock(limit, clock.clone()).unwrap();
            assert!(sliding.check_n(count).unwrap().is_allowed(), "{limit}");
            assert!(
                keyed.check_key_n(&1, count).unwrap().is_allowed(),
                "{limit}"
            );
            let denied = sliding.check().unwrap();
            assert!(
                denied.is_denied() && denied.retry_after_nanos() > 0,
                "{limit}"
            );
            // Two windows on, everything is back.
            clock.advance_nanos(2 * window);
            assert!(sliding.check_n(count).unwrap().is_allowed(), "{limit}");
            assert!(FixedCounter::new(limit).is_ok(), "{limit}");
        }
    }
}

fn any_limit() -> impl Strategy<Value = Limit> {
    let units = prop_oneof![
        1u64..=100,
        1u64..=MAX_UNITS,
        Just(MAX_UNITS),
        Just(1_000_000)
    ];
    let window = prop_oneof![
        MICRO..=366 * DAY,
        prop::sample::select(vec![MICRO, 1_000_000, SECOND, 60 * SECOND, DAY]),
        (1u64..=100_000).prop_map(|ms| ms * 1_000_000),
    ];
    (units, window).prop_map(|(count, window)| Limit::from_nanos(count, window))
}

/// A limit, a start anywhere in its range, and a script. For a wrapping layout, every reading
/// stays within a band of a quarter of the horizon its accuracy states, so no state is ever
/// older than the horizon (the claim is exactness within it; see `WindowCounter`).
fn scenario<A: Algorithm>() -> impl Strategy<Value = (Limit, u64, Vec<Op>)> {
    any_limit().prop_flat_map(|limit| {
        let counter = A::new(limit).expect("accepted");
        let max = SlidingCounter::new(limit)
            .expect("accepted")
            .max_now_nanos();
        let band = counter.accuracy().horizon_nanos().map(|h| h / 4);
        let start = match band {
            Some(band) => (0..=max - band).boxed(),
            None => prop_oneof![Just(0), 0..=max, max.saturating_sub(1 << 40)..=max].boxed(),
        };
        (
            Just(limit),
            start,
            ops(limit.period_nanos() / 10 + 1, limit.burst()),
        )
            .prop_map(move |(limit, start, script)| (limit, start, within(band, start, script)))
    })
}

/// `script` with its steps shortened so every reading stays in `[start, start + band]`.
fn within(band: Option<u64>, start: u64, script: Vec<Op>) -> Vec<Op> {
    let Some(band) = band else { return script };
    let mut now = start;
    script
        .into_iter()
        .map(|op| match op {
            Op::Advance(by) => {
                let by = by.min(start + band - now);
                now += by;
                Op::Advance(by)
            }
            Op::Back(by) => {
                let by = by.min(now - start);
                now -= by;
                Op::Back(by)
            }
            check => check,
        })
        .collect()
}

proptest! {
    #![proptest_config(proptest_config(600))]

    #[test]
    fn every_limit_keeps_the_sliding_window_bound((limit, start, script) in scenario::<SlidingCounter>()) {
        if let Err(e) = run_conservative::<SlidingCounter, SlidingWindowModel>(limit, start, &script) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn every_limit_keeps_the_fixed_window_bound((limit, start, script) in scenario::<FixedCounter>()) {
        if let Err(e) = run_conservative::<FixedCounter, FixedWindowModel>(limit, start, &script) {
            prop_assert!(false, "{}", e);
        }
    }
}
