//! The shared conformance suite, run on the sliding-window and fixed-window counters.

use std::time::Duration;

use limiter_sliding_window::{FixedCounter, Limit, SlidingCounter};
use limiter_testkit::conformance::{Refill, START_NS, run_all};
use limiter_testkit::model::{FixedWindowModel, SlidingWindowModel};

/// Drained at `START_NS`, `elapsed` into its window: in the next window the drained count weighs
/// `count * (1 - e)`, so the first unit fits once `e >= 1 - (count - 1) / count`, and only one.
fn sliding_refill(limit: &Limit) -> Refill {
    let (window, count) = (u128::from(limit.period_nanos()), u128::from(limit.count()));
    let to_next = window - u128::from(START_NS) % window;
    let into_next = window - (count - 1) * window / count;
    Refill::OneUnit(Duration::from_nanos(
        (to_next + into_next).try_into().unwrap(),
    ))
}

/// A fixed window gives the whole count back when the next window starts.
fn fixed_refill(limit: &Limit) -> Refill {
    let window = limit.period_nanos();
    Refill::Whole(Duration::from_nanos(window - START_NS % window))
}

#[test]
fn sliding_window_passes_the_conformance_suite() {
    run_all::<SlidingCounter, SlidingWindowModel>(sliding_refill);
}

#[test]
fn fixed_window_passes_the_conformance_suite() {
    run_all::<FixedCounter, FixedWindowModel>(fixed_refill);
}
