//! [`Gcra`]: the token bucket's pure transition. The whole state is one `u64`, the `tat`.
#![deny(clippy::arithmetic_side_effects)]

use core::num::NonZeroU64;
use core::time::Duration;

use limiter_core::{
    Algorithm, Decision, DecisionError, Limit, LimitError, MIN_CLOCK_RANGE, StateCell, Step, Usage,
};

/// The token bucket, in GCRA form: its parameters, derived once from its [`Limit`].
///
/// # Ticks and the tat
///
/// The bucket is kept in GCRA form: instead of a token count and a timestamp, it stores the
/// *theoretical arrival time* (`tat`): the instant at which the bucket would be full again.
/// A bucket is full when `tat <= now`, and holds `(now + tau - tat) / unit` tokens otherwise,
/// where `unit` is the time one token takes to refill and `tau = burst * unit`.
///
/// One unit takes `period / count` nanoseconds, which is often not a whole number (7 per
/// second). To keep refill exact, with no fractional credit lost or invented, time is counted in
/// *ticks* of `1 / q` ns, where `q = count / gcd(count, period)`. One unit is then exactly
/// `p = period / gcd(count, period)` ticks, and every quantity is an integer. For the common
/// limits (10 per second, 100 per minute) `q` is 1 and a tick is a nanosecond.
///
/// # Range
///
/// The `tat` is absolute: ticks since the clock's epoch. A limit is accepted only if its clock
/// range, `(u64::MAX - tau) / q` ns, is at least [`MIN_CLOCK_RANGE`] (2^56 ns, about 2.3 years
/// of uptime on the default clock; 584 years when `q` is 1). Past that range a call is refused
/// with [`DecisionError::ClockOutOfRange`] rather than decided wrongly.
///
/// # A clock that goes backwards
///
/// The state is read at the earlier instant: that can only show less capacity (a `tat` further
/// ahead), never more, so it never admits more; when time catches up, decisions are as if the
/// clock had never moved back. `retry_after` includes the time needed to catch up.
#[derive(Clone, Debug)]
pub struct Gcra {
    limit: Limit,
    /// `q`: ticks per nanosecond.
    ticks_per_ns: NonZeroU64,
    /// `p`: ticks one unit takes to refill.
    unit_ticks: NonZeroU64,
    /// `tau = burst * p`: how far ahead of `now` the tat may be; at `now + tau` the bucket is empty.
    tau_ticks: u64,
    /// The last clock reading, in ns, for which `now * q + tau` fits in a `u64`.
    max_now_ns: u64,
}

impl Gcra {
    /// Derives the tick parameters for `limit`, or says why the limit cannot be represented.
    pub fn from_limit(limit: Limit) -> Result<Self, LimitError> {
        Self::derive(limit).map_err(|reason| {
            let hint = nearest_supported_count(limit)
                .map(|count| {
                    format!(
                        "; {count} per {:?} is the nearest lower count that is",
                        limit.period()
                    )
                })
                .unwrap_or_default();
            LimitError::Unsupported {
                algorithm: Gcra::NAME,
                reason: format!("{reason}{hint}"),
            }
        })
    }

    /// The parameters, or the reason (without a suggestion) the limit cannot be represented.
    fn derive(limit: Limit) -> Result<Self, String> {
        let (Some(period), Some(count)) = (
            NonZeroU64::new(limit.period_nanos()),
            NonZeroU64::new(limit.count()),
        ) else {
            return Err(format!(
                "{limit} has a zero count or period, which `Limit` never builds"
            ));
        };
        let (unit_ticks, ticks_per_ns) = reduce(period, count);
        let tau_ticks = limit.burst().checked_mul(unit_ticks.get()).ok_or_else(|| {
            format!(
                "a burst of {} units at {:?} each spans more than u64::MAX ns (584 years); use a smaller burst",
                limit.burst(),
                limit.interval(),
            )
        })?;
        // The largest tat written is now + tau, kept below `StateCell::RETIRED` (u64::MAX).
        let max_now_ns = StateCell::RETIRED
            .saturating_sub(1)
            .saturating_sub(tau_ticks)
            / ticks_per_ns;
        if max_now_ns < MIN_CLOCK_RANGE {
            return Err(format!(
                "{limit} refills one unit every {unit_ticks}/{ticks_per_ns} ns; counting that exactly \
                 leaves a clock range of {:?}, less than the {:?} required. Use a count that divides \
                 the period into fewer fractional parts",
                Duration::from_nanos(max_now_ns),
                Duration::from_nanos(MIN_CLOCK_RANGE),
            ));
        }
        Ok(Self {
            limit,
            ticks_per_ns,
            unit_ticks,
            tau_ticks,
            max_now_ns,
        })
    }

    /// The last clock reading, in nanoseconds since the epoch, this limit can decide at.
    pub fn max_now_nanos(&self) -> u64 {
        self.max_now_ns
    }

    /// The exact refill time of one unit as `(numerator, denominator)` nanoseconds, in lowest
    /// terms: `period / count`.
    pub fn unit_nanos(&self) -> (u64, u64) {
        (self.unit_ticks.get(), self.ticks_per_ns.get())
    }

    /// `now` in ticks, if it is within range.
    fn ticks(&self, now_ns: u64) -> Option<u64> {
        if now_ns > self.max_now_ns {
            return None;
        }
        now_ns.checked_mul(self.ticks_per_ns.get())
    }

    /// Ticks rounded up to whole nanoseconds (waits never favour the caller).
    fn ceil_ns(&self, ticks: u64) -> u64 {
        // A tick is a nanosecond for the common limits: no division.
        if self.ticks_per_ns == NonZeroU64::MIN {
            return ticks;
        }
        ticks.div_ceil(self.ticks_per_ns.get())
    }

    /// Whole units in `debt` ticks of headroom below `tau`, floored.
    fn whole_units(&self, headroom_ticks: u64) -> u64 {
        // Division by `NonZeroU64` cannot fail.
        headroom_ticks / self.unit_ticks
    }
}

impl Algorithm for Gcra {
    const NAME: &'static str = "token bucket";
    /// A tat of 0 is at or before every reading, so the bucket is full.
    const FRESH: u64 = 0;

    fn new(limit: Limit) -> Result<Self, LimitError> {
        Self::from_limit(limit)
    }

    fn limit(&self) -> &Limit {
        &self.limit
    }

    #[inline]
    fn decide(&self, tat: u64, cost: u64, now_ns: u64) -> Result<Step, DecisionError> {
        let burst = self.limit.burst();
        if cost > burst {
            return Err(DecisionError::CostExceedsBurst { cost, burst });
        }
        let now = self.ticks(now_ns).ok_or(DecisionError::ClockOutOfRange {
            now_ns,
            max_ns: self.max_now_ns,
        })?;
        // cost <= burst, so cost * p <= tau, which fit at construction.
        let cost_ticks = cost.saturating_mul(self.unit_ticks.get());
        // A tat in the past means a full bucket: consumption starts from now.
        let start = tat.max(now);
        // Ticks of capacity consumed and not yet refilled (above tau only if the clock went back).
        let debt = start.saturating_sub(now);
        let budget = self.tau_ticks.saturating_sub(cost_ticks);
        if debt <= budget {
            let new_debt = debt.saturating_add(cost_ticks);
            let decision = Decision::allow(
                burst,
                self.whole_units(self.tau_ticks.saturating_sub(new_debt)),
                self.ceil_ns(new_debt),
            );
            // now + new_debt <= now + tau, which is in range by `ticks`.
            let next = (cost > 0).then(|| now.saturating_add(new_debt));
            Ok(Step { decision, next })
        } else {
            let decision = Decision::deny(
                burst,
                self.whole_units(self.tau_ticks.saturating_sub(debt)),
                self.ceil_ns(debt.saturating_sub(budget)),
                self.ceil_ns(debt),
            );
            Ok(Step {
                decision,
                next: None,
            })
        }
    }

    #[inline]
    fn is_full(&self, tat: u64, now_ns: u64) -> bool {
        // Past the clock range every call is refused, so forgetting the state changes nothing.
        self.ticks(now_ns).is_none_or(|now| tat <= now)
    }

    fn usage(&self, tat: u64, now_ns: u64) -> Usage {
        // Past the clock range every call is refused; report nothing in use.
        let debt = self.ticks(now_ns).map_or(0, |now| tat.saturating_sub(now));
        Usage::new(debt, self.tau_ticks)
    }

    fn with_usage(&self, usage: Usage, now_ns: u64) -> Result<u64, DecisionError> {
        let now = self.ticks(now_ns).ok_or(DecisionError::ClockOutOfRange {
            now_ns,
            max_ns: self.max_now_ns,
        })?;
        // At most tau, so now + debt is in range by `ticks`.
        Ok(now.saturating_add(usage.scaled_to(self.tau_ticks)))
    }

    fn refund(&self, tat: u64, units: u64, _granted_at: u64, now_ns: u64) -> Option<u64> {
        let now = self.ticks(now_ns)?;
        if tat <= now {
            return None; // full: everything taken has already come back
        }
        // Never below now: a refund cannot lift the bucket above full.
        let back = units.saturating_mul(self.unit_ticks.get());
        Some(tat.saturating_sub(back).max(now))
    }
}

/// `period / count` in lowest terms: `(p, q)`.
fn reduce(period_ns: NonZeroU64, count: NonZeroU64) -> (NonZeroU64, NonZeroU64) {
    // The gcd of two non-zero numbers divides both, so the quotients are non-zero too.
    let divisor = NonZeroU64::new(gcd(period_ns.get(), count.get())).unwrap_or(NonZeroU64::MIN);
    let quotient = |n: NonZeroU64| NonZeroU64::new(n.get() / divisor).unwrap_or(NonZeroU64::MIN);
    (quotient(period_ns), quotient(count))
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while let Some(rest) = a.checked_rem(b) {
        (a, b) = (b, rest);
    }
    a
}

/// The largest count below `limit`'s (same period and burst) that the token bucket accepts,
/// searching a bounded distance so an error stays cheap.
fn nearest_supported_count(limit: Limit) -> Option<u64> {
    const SEARCH: u64 = 4_096;
    let lowest = limit.count().saturating_sub(SEARCH).max(1);
    (lowest..limit.count()).rev().find(|&count| {
        Limit::from_nanos(count, limit.period_nanos())
            .and_then(|candidate| candidate.with_burst(limit.burst()))
            .is_ok_and(|candidate| Gcra::derive(candidate).is_ok())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(count: u64, period_ns: u64, burst: u64) -> Gcra {
        Gcra::from_limit(
            Limit::from_nanos(count, period_ns)
                .unwrap()
                .with_burst(burst)
                .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn ticks_are_nanoseconds_for_round_limits_and_exact_fractions_otherwise() {
        assert_eq!(gcra(10, 1_000_000_000, 10).unit_nanos(), (100_000_000, 1));
        assert_eq!(gcra(7, 1_000_000_000, 7).unit_nanos(), (1_000_000_000, 7));
        assert_eq!(gcra(6, 9, 1).unit_nanos(), (3, 2));
    }

    #[test]
    fn a_unit_of_a_fractional_interval_comes_back_on_the_exact_nanosecond() {
        // 2 per 3 ns: one unit every 1.5 ns. After draining at 0, units return at 1.5 ns, 3 ns...
        let g = gcra(2, 3, 2);
        let s = g.decide(Gcra::FRESH, 2, 0).unwrap();
        let tat = s.next.unwrap();
        assert_eq!(g.decide(tat, 1, 1).unwrap().decision.retry_after_nanos(), 1); // 1.5 - 1 => 1 (rounded up)
        let at2 = g.decide(tat, 1, 2).unwrap();
        assert!(at2.decision.is_allowed());
        // Taking the unit at 2 ns (0.5 ns late) keeps the 0.5 ns of credit: the next unit is
        // back at 3 ns, not 3.5 ns.
        let at3 = g.decide(at2.next.unwrap(), 1, 3).unwrap();
        assert!(at3.decision.is_allowed(), "{at3:?}");
    }

    #[test]
    fn limits_needing_too_fine_ticks_are_refused_with_a_nearby_count() {
        // 1009 per minute: q = 1009, so the range would be 2^64 / 1009 ns, about 211 days.
        let err = Gcra::from_limit(Limit::per_minute(1009).unwrap()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("1008 per 60s"), "{msg}");
        assert!(Gcra::from_limit(Limit::per_minute(1008).unwrap()).is_ok());
    }

    #[test]
    fn a_burst_too_long_for_the_clock_is_refused() {
        let limit = Limit::per_day(1).unwrap().with_burst(u64::MAX).unwrap();
        assert!(matches!(
            Gcra::from_limit(limit),
            Err(LimitError::Unsupported { .. })
        ));
    }

    #[test]
    fn readings_past_the_range_are_refused_and_count_as_full() {
        let g = gcra(1, 1, 1);
        // The last reading leaves room for a tat of now + tau below RETIRED.
        assert_eq!(g.max_now_nanos(), u64::MAX - 2);
        assert_eq!(
            g.decide(0, 1, u64::MAX - 1),
            Err(DecisionError::ClockOutOfRange {
                now_ns: u64::MAX - 1,
                max_ns: u64::MAX - 2
            })
        );
        assert!(g.is_full(u64::MAX - 1, u64::MAX));
        let last = g.decide(0, 1, u64::MAX - 2).unwrap();
        assert!(last.decision.is_allowed());
        assert_eq!(last.next, Some(StateCell::RETIRED - 1));
    }
}
