//! Random operation sequences against the reference models: identical decisions, no write on
//! denial or peek, and never more admitted than `burst + floor(T * count / period)`.

use limiter_core::Algorithm;
use limiter_testkit::harness::{proptest_config, run};
use limiter_testkit::model::{GcraModel, TokenModel};
use limiter_testkit::ops::{Op, ops};
use limiter_token_bucket::{Gcra, Limit};
use proptest::prelude::*;

/// Limits the token bucket counts exactly: small and large counts, periods from a few ns to a day,
/// whole and fractional intervals, bursts below and above the count.
fn limits() -> impl Strategy<Value = Limit> {
    let period = prop_oneof![
        1u64..=1_000,
        Just(1_000_000_000u64),
        Just(60_000_000_000),
        1u64..=86_400_000_000_000
    ];
    (
        period,
        any::<u64>(),
        prop_oneof![Just(None), (1u64..=1_000).prop_map(Some)],
    )
        .prop_filter_map("not counted exactly", |(period, count_seed, burst)| {
            let count = count_seed % period.min(10_000) + 1;
            let limit = Limit::from_nanos(count, period);
            let limit = match burst {
                Some(burst) => limit.with_burst(burst),
                None => limit,
            };
            // Limits counted conservatively are checked against the same models in
            // `every_limit.rs`; here every decision must equal the model's.
            Gcra::new(limit)
                .ok()
                .filter(|gcra| gcra.accuracy().is_exact())
                .map(|_| limit)
        })
}

fn scenario() -> impl Strategy<Value = (Limit, u64, Vec<Op>)> {
    limits().prop_flat_map(|limit| {
        let start = prop_oneof![Just(0u64), 0u64..=1 << 50, Just(u64::MAX - 1)];
        (
            Just(limit),
            start,
            ops(limit.period_nanos() / limit.count() + 1, limit.burst()),
        )
    })
}

proptest! {
    #![proptest_config(proptest_config(2_000))]

    #[test]
    fn matches_the_gcra_model_under_any_clock((limit, start, ops) in scenario()) {
        if let Err(e) = run::<Gcra, GcraModel>(limit, start, &ops) {
            prop_assert!(false, "{}", e);
        }
    }

    #[test]
    fn matches_the_token_count_model_under_a_forward_clock((limit, _start, ops) in scenario()) {
        let forward: Vec<Op> = ops
            .into_iter()
            .filter(|op| !matches!(op, Op::Back(_)))
            .map(|op| match op {
                // Keep readings within the token bucket's range so both sides decide.
                Op::Advance(by) => Op::Advance(by % (1 << 40)),
                other => other,
            })
            .collect();
        if let Err(e) = run::<Gcra, TokenModel>(limit, 0, &forward) {
            prop_assert!(false, "{}", e);
        }
    }
}
