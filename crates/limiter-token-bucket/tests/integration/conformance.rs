//! The shared conformance suite, run on the token bucket against both reference models.

use limiter_testkit::conformance::{Refill, run_all};
use limiter_testkit::model::{GcraModel, TokenModel};
use limiter_token_bucket::{Gcra, Limit};

/// A drained bucket admits exactly one more unit after one interval, rounded up to a whole ns.
fn one_interval(limit: &Limit) -> Refill {
    Refill::OneUnit(limit.interval())
}

#[test]
fn token_bucket_passes_the_conformance_suite() {
    run_all::<Gcra, GcraModel>(one_interval);
}

#[test]
fn token_bucket_matches_the_token_count_model_on_the_conformance_scenarios() {
    for limit in limiter_testkit::conformance::sample_limits() {
        // The token-count model only models clocks that never go back.
        use limiter_testkit::ops::Op;
        let period = limit.period_nanos();
        let ops = [
            Op::Check(limit.burst()),
            Op::Advance(period / 3),
            Op::Check(1),
            Op::Advance(period),
            Op::Check(0),
        ];
        limiter_testkit::harness::run::<Gcra, TokenModel>(limit, 0, &ops).unwrap();
    }
}
