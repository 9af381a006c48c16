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
        // Waits past u64::MAX ns saturate, as the algorithms report them.
        let ns = |scaled: u128| u64::try_from(scaled.div_ceil(count)).unwrap_or(u64::MAX);
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

/// A window counter restated plainly: every window's count kept in a map by window number, the
/// estimate recomputed from scratch in `u128`. `SLIDING` picks the sliding or fixed counter.
#[derive(Clone, Debug)]
pub struct WindowModel<const SLIDING: bool> {
    limit: Limit,
    counts: std::collections::BTreeMap<u64, u64>,
    /// The latest window written: a reading before it is decided at its start.
    latest: u64,
}

/// The sliding-window counter's model.
pub type SlidingWindowModel = WindowModel<true>;
/// The fixed-window counter's model.
pub type FixedWindowModel = WindowModel<false>;

impl<const SLIDING: bool> Model for WindowModel<SLIDING> {
    fn new(limit: Limit) -> Self {
        Self {
            limit,
            counts: Default::default(),
            latest: 0,
        }
    }

    fn decide(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        let count = self.limit.count();
        let w = u128::from(self.limit.period_nanos());
        if cost > count {
            return Err(DecisionError::CostExceedsBurst { cost, burst: count });
        }
        let at = u128::from(now).max(u128::from(self.latest) * w);
        let index = u64::try_from(at / w).expect("fits");
        let lag = u64::try_from(at - u128::from(now)).expect("fits");
        let in_window = |i: u64| u128::from(self.counts.get(&i).copied().unwrap_or(0));
        // The estimate at `t` for a window `i`'s perspective, with an extra `extra` in window i.
        let estimate = |t: u128, counts: &dyn Fn(u64) -> u128| {
            let i = u64::try_from(t / w).expect("fits");
            let elapsed = t - u128::from(i) * w;
            let previous = if SLIDING && i > 0 { counts(i - 1) } else { 0 };
            (previous * (w - elapsed)).div_ceil(w) + counts(i)
        };
        let used = estimate(at, &in_window);
        let c = u128::from(cost);
        let count_u = u128::from(count);
        let ns = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        let reset_from = |counts: &dyn Fn(u64) -> u128| {
            let last = if counts(index) > 0 {
                if SLIDING { index + 2 } else { index + 1 }
            } else if SLIDING && index > 0 && counts(index - 1) > 0 {
                index + 1
            } else {
                return 0;
            };
            ns(u128::from(last) * w - u128::from(now))
        };
        if used + c <= count_u {
            let after = |i: u64| in_window(i) + if i == index { c } else { 0 };
            let reset = reset_from(&after);
            if cost > 0 {
                *self.counts.entry(index).or_insert(0) += cost;
                self.latest = self.latest.max(index);
            }
            Ok(Decision::allow(count, ns(count_u - used - c), reset))
        } else {
            // Search for the first instant the cost fits, by bisection over the next two
            // windows: the estimate only falls as time passes when nothing is consumed.
            let fits = |t: u128| estimate(t, &in_window) + c <= count_u;
            let (mut lo, mut hi) = (at, (u128::from(index) + 2) * w);
            debug_assert!(fits(hi));
            while lo + 1 < hi {
                let mid = lo + (hi - lo) / 2;
                if fits(mid) { hi = mid } else { lo = mid }
            }
            Ok(Decision::deny(
                count,
                ns(count_u.saturating_sub(used)),
                lag.saturating_add(ns(hi - at)),
                reset_from(&in_window),
            ))
        }
    }

    fn max_admitted(limit: &Limit, span_ns: u64) -> u128 {
        u128::from(limit.count()) * (u128::from(span_ns / limit.period_nanos()) + 2)
    }
}
