//! Tests of `counter.rs`.

use super::*;
use limiter_core::StateCell;

const SECOND: u64 = 1_000_000_000;

#[test]
fn a_million_per_second_is_kept_with_its_previous_count_rounded_to_32_units() {
    let s = sliding(1_000_000, SECOND);
    assert!(s.max_now_nanos() >= MIN_CLOCK_RANGE);
    assert_eq!(s.accuracy().shortfall_per_billion(), 31_000);
    // The previous window's 999,969 units weigh as 1,000,000: never less than they are.
    let state = s
        .decide(SlidingCounter::FRESH, 999_969, 0)
        .unwrap()
        .next
        .unwrap();
    let d = s.decide(state, 0, SECOND).unwrap().decision;
    assert_eq!(d.remaining(), 0);
    // The fixed window counts it exactly.
    let f = FixedCounter::from_limit(Limit::per_second(1_000_000)).unwrap();
    assert!(f.accuracy().is_exact());
}

fn sliding(count: u64, period_ns: u64) -> SlidingCounter {
    SlidingCounter::from_limit(Limit::from_nanos(count, period_ns)).unwrap()
}

/// Fills window 0 with `count` at its very end, so window 1 starts with all of it weighted.
fn full_previous(s: &SlidingCounter) -> u64 {
    s.decide(SlidingCounter::FRESH, s.count, s.window_ns - 1)
        .unwrap()
        .next
        .unwrap()
}

#[test]
fn the_previous_window_decays_linearly_and_rounds_against_the_caller() {
    let s = sliding(10, SECOND);
    let state = full_previous(&s);
    // At 10% into window 1, 90% of window 0 overlaps: 9 weighted, 1 left.
    let d = s.decide(state, 1, SECOND + SECOND / 10).unwrap().decision;
    assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
    // One ns earlier the weight is 9.00000001, rounded up to 10: nothing left.
    let d = s
        .decide(state, 1, SECOND + SECOND / 10 - 1)
        .unwrap()
        .decision;
    assert!(d.is_denied(), "{d:?}");
    assert_eq!(d.retry_after_nanos(), 1);
}

#[test]
fn retry_after_is_the_exact_first_admitting_instant() {
    let s = sliding(10, SECOND);
    let state = full_previous(&s);
    for cost in 1..=10 {
        let first = s.decide(state, cost, SECOND).unwrap().decision;
        assert!(first.is_denied());
        let at = SECOND + first.retry_after_nanos();
        assert!(
            s.decide(state, cost, at).unwrap().decision.is_allowed(),
            "cost {cost} at {at}"
        );
        assert!(
            s.decide(state, cost, at - 1).unwrap().decision.is_denied(),
            "cost {cost} before {at}"
        );
    }
}

#[test]
fn a_full_window_waits_for_the_next_and_a_burst_for_the_one_after() {
    let s = sliding(4, SECOND);
    let state = s.decide(SlidingCounter::FRESH, 4, 0).unwrap().next.unwrap();
    // Window 0 is full from its start: in window 1 it weighs 4 * (1 - e), so one unit fits
    // after a quarter of window 1, and all four only in window 2.
    assert_eq!(
        s.decide(state, 1, 0).unwrap().decision.retry_after_nanos(),
        SECOND + SECOND / 4
    );
    assert_eq!(
        s.decide(state, 4, 0).unwrap().decision.retry_after_nanos(),
        2 * SECOND
    );
    let fixed = FixedCounter::from_limit(Limit::from_nanos(4, SECOND)).unwrap();
    let state = fixed
        .decide(FixedCounter::FRESH, 4, 0)
        .unwrap()
        .next
        .unwrap();
    assert_eq!(
        fixed
            .decide(state, 4, SECOND / 2)
            .unwrap()
            .decision
            .retry_after_nanos(),
        SECOND / 2
    );
}

#[test]
fn only_a_burst_or_a_count_no_word_can_hold_is_refused() {
    // Twice the count (a window in debt) fits 18 bits: exact, with 27 for the window number.
    let sliding_max = SlidingCounter::from_limit(Limit::per_second(131_071)).unwrap();
    assert!(sliding_max.accuracy().is_exact());
    let past = SlidingCounter::from_limit(Limit::per_second(131_072)).unwrap();
    assert!(!past.accuracy().is_exact());
    for count in [1, 131_072, 1_000_000, u64::from(u32::MAX)] {
        for window in [1_000, SECOND, 366 * 86_400 * SECOND] {
            let limit = Limit::from_nanos(count, window);
            assert!(SlidingCounter::from_limit(limit).is_ok(), "{limit}");
            assert!(FixedCounter::from_limit(limit).is_ok(), "{limit}");
        }
    }
    let too_many = Limit::per_second(u64::MAX);
    let err = SlidingCounter::from_limit(too_many)
        .unwrap_err()
        .to_string();
    assert!(err.contains("at most 4294967295 units per window"), "{err}");
    let burst = Limit::per_second(10).with_burst(5);
    assert!(
        SlidingCounter::from_limit(burst)
            .unwrap_err()
            .to_string()
            .contains("no separate burst")
    );
}

#[test]
fn a_wrapping_counter_decides_like_the_exact_one_over_recent_windows() {
    // u32::MAX per microsecond: the window number wraps.
    let s = sliding(u64::from(u32::MAX), 1_000);
    assert_eq!(s.max_now_nanos(), u64::MAX);
    assert!(s.layout()[4] == 1, "{:?}", s.layout());
    let start = 1_000 << 52; // the start of a window
    let state = s
        .decide(SlidingCounter::FRESH, 1 << 31, start)
        .unwrap()
        .next
        .unwrap();
    // Half a window on, the previous window (rounded up) weighs about half.
    let d = s.decide(state, 0, start + 1_500).unwrap().decision;
    // (the weight is rounded up: half of the rounded count, plus one if odd)
    let previous = s.layout.round_previous(1 << 31);
    assert_eq!(d.remaining(), u64::from(u32::MAX) - previous.div_ceil(2));
    // Two windows on it is empty; a reading before its window sees it whole.
    assert!(s.is_full(state, start + 2_000));
    assert!(!s.is_full(state, start - 5_000));
    let back = s
        .decide(state, u64::from(u32::MAX), start - 5_000)
        .unwrap()
        .decision;
    assert!(back.is_denied());
}

#[test]
fn a_reading_before_the_state_window_is_decided_at_its_start() {
    let s = sliding(10, SECOND);
    let state = s
        .decide(SlidingCounter::FRESH, 10, 5 * SECOND)
        .unwrap()
        .next
        .unwrap();
    let d = s.decide(state, 1, 2 * SECOND).unwrap().decision;
    // Denied: window 5 is full. The wait runs from the reading, through the catch-up.
    assert!(d.is_denied());
    assert_eq!(d.retry_after_nanos(), 3 * SECOND + SECOND + SECOND / 10);
    assert!(!s.is_full(state, 2 * SECOND));
    assert!(s.is_full(state, 7 * SECOND));
}

#[test]
fn the_window_found_without_dividing_is_the_quotient() {
    for window_ns in [1, 7, 1_000, SECOND, u64::MAX / 3] {
        let s = WindowCounter::<true> {
            window_ns,
            ..sliding(1, 1)
        };
        for stored in [
            0,
            1,
            5,
            u64::MAX / window_ns,
            u64::MAX / window_ns - 1,
            u64::MAX,
        ] {
            let start = stored.saturating_mul(window_ns);
            let readings = [0, 1, window_ns, 2 * window_ns + 1]
                .into_iter()
                .flat_map(|d| {
                    let before = start.saturating_sub(d);
                    let after = start.saturating_add(d);
                    [before, after, after.saturating_add(window_ns - 1)]
                })
                .chain([u64::MAX, u64::MAX - 1]);
            for now in readings {
                assert_eq!(
                    s.window_of(now, stored),
                    now / window_ns,
                    "window {window_ns}, stored {stored}, now {now}"
                );
            }
        }
    }
}

#[test]
fn counts_and_windows_too_large_for_64_bit_products_decide_in_128() {
    // 2^20 per 2^45 ns: a full previous window weighs 2^20 * overlap, past u64 at any
    // overlap above 2^44 ns.
    let window = 1 << 45;
    let s = sliding(1 << 20, window);
    let state = full_previous(&s);
    // A quarter into window 1, three quarters of window 0 overlap: 786,432 weighted.
    let d = s.decide(state, 0, window + window / 4).unwrap().decision;
    assert_eq!(d.remaining(), (1 << 20) - 786_432);
    // The window's own end, as a multiple of the period, past u64: the reset comes out in
    // 128 bits, from the last window a reading can be in.
    let last = s.max_now_nanos();
    let d = s.decide(SlidingCounter::FRESH, 1, last).unwrap().decision;
    let end = (u128::from(last / window) + 2) * u128::from(window);
    assert_eq!(
        d.reset_after_nanos(),
        u64::try_from(end - u128::from(last)).unwrap_or(u64::MAX)
    );
}

#[test]
fn no_state_is_the_retired_word_even_at_the_last_reading() {
    // 255 = 2^8 - 1 fills every count bit; the last window number is the one left unused.
    let s = sliding(255, 1_000);
    let full = s
        .decide(SlidingCounter::FRESH, 255, s.max_now_nanos())
        .unwrap();
    assert_ne!(full.next, Some(StateCell::RETIRED));
    let refilled = s.decide(full.next.unwrap(), 255, s.max_now_nanos());
    assert!(refilled.unwrap().decision.is_denied());
    let fixed = FixedCounter::from_limit(Limit::from_nanos(255, 1_000)).unwrap();
    let full = fixed
        .decide(FixedCounter::FRESH, 255, fixed.max_now_nanos())
        .unwrap();
    assert_ne!(full.next, Some(StateCell::RETIRED));
}
