//! Reference models: plain, obviously-correct restatements of each algorithm in `u128`
//! arithmetic, with no packing, no tick reduction and no range limits.

use limiter_core::{Decision, DecisionError, Limit};

/// A reference model of one limiter's state, driven call by call.
pub trait Model {
    /// A full (fresh) model for `limit`.
    fn new(limit: Limit) -> Self;

    /// Decides `cost` at `now` and updates the model's state.
    fn decide(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError>;

    /// Records `cost` units of usage at `now`, never refused: the state may go into debt, up
    /// to twice its capacity in use ([`limiter_core::Usage::MAX_DEBT`]); the decision says
    /// whether it is still within its limit, and when one unit is admitted again. Cost 0 is
    /// [`decide`](Self::decide)'s peek.
    fn record(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError>;

    /// The most units the algorithm may admit in any span of `span_ns` nanoseconds, measured
    /// on the running maximum of the readings at which it wrote (the state's own time).
    fn max_admitted(limit: &Limit, span_ns: u64) -> u128;

    /// Whether units recorded at state time `recorded_at` count, with the admitted ones,
    /// toward [`max_admitted`](Self::max_admitted) for a span that ends with an admission at
    /// state time `admitted_at`: a debt the state still carries then. A token bucket carries
    /// every debt until it is paid back (always); a window counter, only within its window.
    fn record_counts(limit: &Limit, recorded_at: u64, admitted_at: u64) -> bool {
        let _ = (limit, recorded_at, admitted_at);
        true
    }
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

    fn record(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        if cost == 0 {
            return self.decide(0, now);
        }
        let (count, period, burst) = (
            u128::from(self.limit.count()),
            u128::from(self.limit.period_nanos()),
            u128::from(self.limit.burst()),
        );
        let now = u128::from(now) * count;
        let tau = burst * period;
        let start = self.tat.max(now);
        // At most one burst of debt; never lowered. (A record of up to u64::MAX units of a
        // period up to u64::MAX ns passes u128 past a late start: saturated, then capped.)
        let after = start
            .saturating_add(u128::from(cost) * period)
            .min(now + 2 * tau)
            .max(start);
        self.tat = after;
        let ns = |scaled: u128| u64::try_from(scaled.div_ceil(count)).unwrap_or(u64::MAX);
        let units = |headroom: u128| u64::try_from(headroom / period).expect("fits: at most burst");
        Ok(if after <= now + tau {
            Decision::allow(
                self.limit.burst(),
                units(now + tau - after),
                ns(after - now),
            )
        } else {
            // One unit fits once after + period <= t + tau.
            Decision::deny(
                self.limit.burst(),
                0,
                ns(after + period - tau - now),
                ns(after - now),
            )
        })
    }

    fn max_admitted(limit: &Limit, span_ns: u64) -> u128 {
        u128::from(limit.burst())
            + u128::from(span_ns) * u128::from(limit.count()) / u128::from(limit.period_nanos())
    }
}

/// The token bucket as a count of tokens and a timestamp, the textbook form: a second,
/// independent formulation of the same algorithm. Tokens are kept multiplied by `period`, so
/// refill is exact; a debt is a negative count. Only meaningful for clocks that never go back.
#[derive(Clone, Debug)]
pub struct TokenModel {
    limit: Limit,
    /// Tokens, times `period`: below zero in debt, never below minus the burst.
    tokens: i128,
    last: u64,
}

impl TokenModel {
    /// The full bucket, times `period`, and the tokens after refilling up to `now`.
    fn refill(&mut self, now: u64) -> i128 {
        let (count, period) = (
            i128::from(self.limit.count()),
            i128::from(self.limit.period_nanos()),
        );
        let full = i128::from(self.limit.burst()) * period;
        assert!(
            now >= self.last,
            "TokenModel models clocks that never go back"
        );
        self.tokens = full.min(self.tokens + i128::from(now - self.last) * count);
        self.last = now;
        full
    }
}

impl Model for TokenModel {
    fn new(limit: Limit) -> Self {
        Self {
            tokens: i128::from(limit.burst()) * i128::from(limit.period_nanos()),
            limit,
            last: 0,
        }
    }

    fn record(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        if cost == 0 {
            return self.decide(0, now);
        }
        let full = self.refill(now);
        let (count, period) = (
            i128::from(self.limit.count()),
            i128::from(self.limit.period_nanos()),
        );
        // Never below minus a full bucket (one burst of debt); never raised by a record. (The
        // units' ticks pass i128 for a record of u64::MAX units of a period of u64::MAX ns.)
        let floor = (-full).min(self.tokens);
        let taken = i128::from(cost).saturating_mul(period);
        self.tokens = self.tokens.saturating_sub(taken).max(floor);
        // Waits past u64::MAX ns saturate, as the algorithms report them.
        let ns = |scaled: i128| u64::try_from((scaled + count - 1) / count).unwrap_or(u64::MAX);
        Ok(if self.tokens >= 0 {
            Decision::allow(
                self.limit.burst(),
                u64::try_from(self.tokens / period).expect("at most burst"),
                ns(full - self.tokens),
            )
        } else {
            Decision::deny(
                self.limit.burst(),
                0,
                ns(period - self.tokens),
                ns(full - self.tokens),
            )
        })
    }

    fn decide(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        if cost > self.limit.burst() {
            return Err(DecisionError::CostExceedsBurst {
                cost,
                burst: self.limit.burst(),
            });
        }
        let full = self.refill(now);
        let (count, period) = (
            i128::from(self.limit.count()),
            i128::from(self.limit.period_nanos()),
        );
        // Waits past u64::MAX ns saturate, as the algorithms report them.
        let ns = |scaled: i128| u64::try_from((scaled + count - 1) / count).unwrap_or(u64::MAX);
        let remaining =
            |tokens: i128| u64::try_from(tokens.max(0) / period).expect("at most burst");
        let need = i128::from(cost) * period;
        if need <= self.tokens {
            self.tokens -= need;
            Ok(Decision::allow(
                self.limit.burst(),
                remaining(self.tokens),
                ns(full - self.tokens),
            ))
        } else {
            Ok(Decision::deny(
                self.limit.burst(),
                remaining(self.tokens),
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

    fn record(&mut self, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        if cost == 0 {
            return self.decide(0, now);
        }
        let count = self.limit.count();
        let w = u128::from(self.limit.period_nanos());
        let at = u128::from(now).max(u128::from(self.latest) * w);
        let index = u64::try_from(at / w).expect("fits");
        let lag = u64::try_from(at - u128::from(now)).expect("fits");
        // A window's count is kept up to twice the limit's count; never lowered.
        let held = self.counts.get(&index).copied().unwrap_or(0);
        let kept = held
            .saturating_add(cost)
            .min(count.saturating_mul(2))
            .max(held);
        self.counts.insert(index, kept);
        self.latest = self.latest.max(index);
        let in_window = |i: u64| u128::from(self.counts.get(&i).copied().unwrap_or(0));
        let estimate = |t: u128| {
            let i = u64::try_from(t / w).expect("fits");
            let elapsed = t - u128::from(i) * w;
            let previous = if SLIDING && i > 0 {
                in_window(i - 1)
            } else {
                0
            };
            (previous * (w - elapsed)).div_ceil(w) + in_window(i)
        };
        let used = estimate(at);
        let count_u = u128::from(count);
        let ns = |x: u128| u64::try_from(x).unwrap_or(u64::MAX);
        // The window just written holds units: it weighs until the end of the next one.
        let last = if SLIDING { index + 2 } else { index + 1 };
        let reset = ns(u128::from(last) * w - u128::from(now));
        if used <= count_u {
            return Ok(Decision::allow(count, ns(count_u - used), reset));
        }
        // The first instant one unit fits, by bisection over the next two windows.
        let fits = |t: u128| estimate(t) < count_u;
        let (mut lo, mut hi) = (at, (u128::from(index) + 2) * w);
        while lo + 1 < hi {
            let mid = lo + (hi - lo) / 2;
            if fits(mid) { hi = mid } else { lo = mid }
        }
        Ok(Decision::deny(
            count,
            0,
            lag.saturating_add(ns(hi - at)),
            reset,
        ))
    }

    fn max_admitted(limit: &Limit, span_ns: u64) -> u128 {
        u128::from(limit.count()) * (u128::from(span_ns / limit.period_nanos()) + 2)
    }

    /// Within one aligned window: there, the units admitted plus those recorded before the
    /// window's last admission are at most `count`. A fixed window forgets its debt when it
    /// ends, and a sliding one weighs it into the next (where the bound does not count it).
    fn record_counts(limit: &Limit, recorded_at: u64, admitted_at: u64) -> bool {
        recorded_at / limit.period_nanos() == admitted_at / limit.period_nanos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of every unit a `u64` holds, on the longest period, late in the clock's range:
    /// each model takes one burst of debt (denying, full again after two bursts' time), where
    /// its arithmetic used to overflow (a fuzz input found it).
    #[test]
    fn the_largest_record_on_the_longest_period_is_one_burst_of_debt() {
        let limit = Limit::from_nanos(9, u64::MAX);
        let at = u64::MAX - 1;
        let gcra = GcraModel::new(limit).record(u64::MAX, at).unwrap();
        let tokens = TokenModel::new(limit).record(u64::MAX, at).unwrap();
        for answer in [gcra, tokens] {
            assert!(answer.is_denied(), "{answer:?}");
            assert_eq!(answer.remaining(), 0);
            assert_eq!(answer.reset_after_nanos(), u64::MAX, "two bursts saturate");
        }
    }
}
