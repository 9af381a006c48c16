//! Reference models: plain, obviously-correct restatements of each algorithm in `u128`
//! arithmetic, with no packing, no tick reduction and no range limits.

use limiter_core::{Decision, DecisionError, Limit};

/// A reference model of one limiter's state, driven call by call.
pub trait Model {
    /// A full (fresh) model for `limit`.
    fn new(limit: Limit) -> Self;

    /// Decides `cost` at `now` and updates the model's state.
    fn decide(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError>;

    /// The most units the algorithm may admit in any span of `span_ns` nanoseconds, measured
    /// on the running maximum of the readings at which it admitted (the state's own time).
    fn max_admitted(limit: &Limit, span_ns: u64) -> u128;
}

/// The token bucket as GCRA over exact rational time: times are kept multiplied by `count`, so
/// one unit costs exactly `period` and no division happens until a value is reported.
#[derive(Clone, Debug)]
pub struct GcraModel {
    limit: Limit,
    /// The theoretical arrival time, times `count`.
    tat: u128,
}

impl Model for GcraModel {
    fn new(limit: Limit) -> Self {
        Self { limit, tat: 0 }
    }

    fn decide(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        let (count, period, burst) = (
            u128::from(self.limit.count()),
            u128::from(self.limit.period_nanos()),
            u128::from(self.limit.burst()),
        );
        if u128::from(cost) > burst {
            return Err(DecisionError::CostExceedsBurst {
                cost,
                burst: self.limit.burst(),
            });
        }
        let now = u128::from(now) * count;
        let tau = burst * period;
        let start = self.tat.max(now);
        let after = start + u128::from(cost) * period;
        let ns = |scaled: u128| u64::try_from(scaled.div_ceil(count)).expect("fits: below tau");
        let units = |headroom: u128| u64::try_from(headroom / period).expect("fits: at most burst");
        if after <= now + tau {
            if cost > 0 {
                self.tat = after;
            }
            Ok(Decision::allow(
                self.limit.burst(),
                units(now + tau - after),
                ns(after - now),
            ))
        } else {
            Ok(Decision::deny(
                self.limit.burst(),
                units((now + tau).saturating_sub(start)),
                ns(after - now - tau),
                ns(start - now),
            ))
        }
    }

    fn max_admitted(limit: &Limit, span_ns: u64) -> u128 {
        u128::from(limit.burst())
            + u128::from(span_ns) * u128::from(limit.count()) / u128::from(limit.period_nanos())
    }
}

/// The token bucket as a count of tokens and a timestamp, the textbook form: a second,
/// independent formulation of the same algorithm. Tokens are kept multiplied by `period`, so
/// refill is exact. Only meaningful for clocks that never go back.
#[derive(Clone, Debug)]
pub struct TokenModel {
    limit: Limit,
    /// Tokens, times `period`.
    tokens: u128,
    last: u64,
}

impl Model for TokenModel {
    fn new(limit: Limit) -> Self {
        Self {
            tokens: u128::from(limit.burst()) * u128::from(limit.period_nanos()),
            limit,
            last: 0,
        }
    }

    fn decide(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        let (count, period) = (
            u128::from(self.limit.count()),
            u128::from(self.limit.period_nanos()),
        );
        let full = u128::from(self.limit.burst()) * period;
        if cost > self.limit.burst() {
            return Err(DecisionError::CostExceedsBurst {
                cost,
                burst: self.limit.burst(),
            });
        }
        assert!(
            now >= self.last,
            "TokenModel models clocks that never go back"
        );
        self.tokens = full.min(self.tokens + u128::from(now - self.last) * count);
        self.last = now;
        let ns = |scaled: u128| u64::try_from(scaled.div_ceil(count)).expect("fits: below full");
        let need = u128::from(cost) * period;
        if need <= self.tokens {
            self.tokens -= need;
            let remaining = u64::try_from(self.tokens / period).expect("at most burst");
            Ok(Decision::allow(
                self.limit.burst(),
                remaining,
                ns(full - self.tokens),
            ))
        } else {
            let remaining = u64::try_from(self.tokens / period).expect("at most burst");
            Ok(Decision::deny(
                self.limit.burst(),
                remaining,
                ns(need - self.tokens),
                ns(full - self.tokens),
            ))
        }
    }

    fn max_admitted(limit: &Limit, span_ns: u64) -> u128 {
        GcraModel::max_admitted(limit, span_ns)
    }
}
