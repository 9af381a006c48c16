//! Random operation sequences on both window counters against their plain reference models:
//! identical decisions (the model finds `retry_after` by search, the counter in closed form), no
//! write on denial or peek, full states deciding like fresh ones, and the admission bound.

use limiter_core::{Accuracy, Algorithm};
use limiter_sliding_window::{FixedCounter, Limit, SlidingCounter};
use limiter_testkit::harness::{proptest_config, run};
use limiter_testkit::model::{FixedWindowModel, SlidingWindowModel};
use limiter_testkit::ops::{Op, ops};
use proptest::prelude::*;

/// Window limits: periods from a few ns to a day, counts from 1 to a few thousand.
fn limits() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![
        1u64..=1_000,
        Just(1_000_000_000u64),
        Just(60_000_000_000),
        1u64..=86_400_000_000_000
    ];
    let count = prop_oneof![1u64..=10, 1u64..=5_000];
    (period, count).prop_filter_map("counter refuses it", |(period, count)| {
        let limit = Limit::from_nanos(count.min(period), period);
        // Limits counted conservatively are checked in `every_limit.rs`; here every decision
        // must equal the model's.
        let exact = |accuracy: Accuracy| accuracy.is_exact();
        (SlidingCounter::new(limit).is_ok_and(|c| exact(c.accuracy()))
            && FixedCounter::new(limit).is_ok_and(|c| exact(c.accuracy())))
        .then_some(limit)
    })
}

fn scenario() -> impl Strategy<Value = (Limit, u64, Vec<Op>)> {
    limits().prop_flat_map(|limit| {
        let start = prop_oneof![Just(0u64), 0u64..=1 << 50, Just(u64::MAX - 1)];
        // Steps around a tenth of a window, so a run crosses windows often but not always.
        (
            Just(limit),
            start,
            ops(limit.period_nanos() / 10 + 1, limit.burst()),
        )
    })
}

proptest! {
    #![proptest_config(proptest_config(1_500))]

    #[test]
    fn sliding_window_matches_its_model((limit, start, ops) in scenario()) {
        if let Err(e) = run::<SlidingCounter, SlidingWindowModel>(limit, start, &ops) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn fixed_window_matches_its_model((limit, start, ops) in scenario()) {
        if let Err(e) = run::<FixedCounter, FixedWindowModel>(limit, start, &ops) {
            prop_assert!(false, "{}", e);
        }
    }
}
