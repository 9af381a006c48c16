//! [`DynAlgorithm`]: an [`Algorithm`] behind a pointer, so one layer can hold a token bucket
//! beside a sliding window and a plan can choose among limits at run time.

use limiter_core::{Algorithm, DecisionError, Limit, Step, Usage};

/// The object-safe face of [`Algorithm`]; every algorithm has it.
pub(crate) trait DynAlgorithm: Send + Sync {
    fn name(&self) -> &'static str;
    fn fresh(&self) -> u64;
    fn limit(&self) -> &Limit;
    fn decide(&self, state: u64, cost: u64, now: u64) -> Result<Step, DecisionError>;
    fn is_full(&self, state: u64, now: u64) -> bool;
    fn usage(&self, state: u64, now: u64) -> Usage;
    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError>;
    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64>;
}

impl<A: Algorithm> DynAlgorithm for A {
    fn name(&self) -> &'static str {
        A::NAME
    }
    fn fresh(&self) -> u64 {
        A::FRESH
    }
    fn limit(&self) -> &Limit {
        Algorithm::limit(self)
    }
    fn decide(&self, state: u64, cost: u64, now: u64) -> Result<Step, DecisionError> {
        Algorithm::decide(self, state, cost, now)
    }
    fn is_full(&self, state: u64, now: u64) -> bool {
        Algorithm::is_full(self, state, now)
    }
    fn usage(&self, state: u64, now: u64) -> Usage {
        Algorithm::usage(self, state, now)
    }
    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError> {
        Algorithm::with_usage(self, usage, now)
    }
    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64> {
        Algorithm::refund(self, state, units, granted_at, now)
    }
}
