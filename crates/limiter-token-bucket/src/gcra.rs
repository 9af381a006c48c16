//! [`Gcra`]: the token bucket's pure transition. The whole state is one `u64`, the `tat`.
//!
//! Why this representation. One `u64` per key stays (36 B per key at
//! 1M keys, governor's size). The alternatives: exact rational ticks for every limit (what this
//! crate did before) refuse ordinary limits (1009 per minute leaves 211 days of clock); time
//! relative to a rolling epoch needs a second word or a rebase protocol on every key; a second
//! word only for rare limits doubles the CAS width or the cell type. A per-limit fixed-point
//! tick with conservative rounding costs one multiply and one shift per call (the same as the
//! old exact ticks), keeps every round limit exact, and its error is below 1 unit in 10^5 for
//! every limit up to 10^6 per second, proven by `tests/integration/every_limit.rs` against the exact `u128`
//! model.
#![deny(clippy::arithmetic_side_effects)]

use core::num::NonZeroU64;

use crate::reciprocal::Reciprocal;
use limiter_core::{
    Accuracy, Algorithm, Decision, DecisionError, Limit, LimitError, MIN_CLOCK_RANGE, StateCell,
    Step, Usage,
};

/// The finest sub-nanosecond tick an inexact limit is counted in: 1/128 ns. Finer ticks would
/// leave less than [`MIN_CLOCK_RANGE`] of clock (2^64 / 2^8 ticks is exactly 2^56 ns, with no
/// room left for the bucket's depth).
const FINEST_TICKS_PER_NS: u64 = 1 << 7;

/// The token bucket, in GCRA form: its parameters, derived once from its [`Limit`].
///
/// # Ticks and the tat
///
/// The bucket is kept in GCRA form: instead of a token count and a timestamp, it stores the
/// *theoretical arrival time* (`tat`): the instant at which the bucket would be full again.
/// A bucket is full when `tat <= now`, and holds `(now + tau - tat) / unit` tokens otherwise,
/// where `unit` is the time one token takes to refill and `tau = burst * unit`.
///
/// Time is counted in *ticks*, chosen per limit so that one `u64` holds the tat for at least
/// [`MIN_CLOCK_RANGE`] ns (2.3 years) of clock, whatever the limit:
///
/// 1. **Exact** (the common case): ticks of `1/q` ns with `q = count / gcd(count, period)`, so
///    one unit is exactly `p = period / gcd(count, period)` ticks and no fractional credit is
///    ever lost or invented. For round limits (10 per second, 100 per minute) `q` is 1 and a tick
///    is a nanosecond.
/// 2. **Conservative, fine**: where `q` would leave too little clock range (1009 per minute
///    needs `q = 1009`), ticks of `1/2^k` ns (`2^k <= 128`, the finest that fits) and a unit of
///    `ceil(period * 2^k / count)` ticks: rounded up, so the bucket refills slightly slower than
///    the limit, never faster.
/// 3. **Conservative, coarse**: where even nanosecond ticks cannot hold the bucket's depth (a
///    burst of billions of units that each take hours), ticks of `2^s` ns, readings floored to a
///    tick, and a unit of `ceil(period / (count * 2^s)) + 1` ticks; the extra tick pays for
///    the flooring, so no span of real time ever refills more than the limit allows.
///
/// Over any span `T` the bucket admits at most `burst + floor(T * count / period)` units in every
/// case; [`accuracy`](Algorithm::accuracy) states how much less a conservative limit may admit
/// (under 1 unit in 10^5 for every limit up to 10^6 per second; about 1 in 10^10 for 1009 per
/// minute).
///
/// # Range
///
/// The `tat` is absolute: ticks since the clock's epoch. Every limit leaves at least
/// [`MIN_CLOCK_RANGE`] ns of clock; past [`max_now_nanos`](Self::max_now_nanos) a call is
/// refused with [`DecisionError::ClockOutOfRange`] rather than decided wrongly.
///
/// # Debt
///
/// [`record`](Algorithm::record) moves the tat ahead by the recorded cost whatever the state,
/// so it may pass `now + tau`: the bucket is then in debt, and every call is denied until the
/// clock has paid it back, a unit per `period / count`. The tat is kept at most `2 * tau` ahead
/// of `now` ([`Usage::MAX_DEBT`]): a bucket owes at most one more burst, and usage recorded
/// past that is not kept.
///
/// # A clock that goes backwards
///
/// The state is read at the earlier instant: that can only show less capacity (a `tat` further
/// ahead), never more, so it never admits more; when time catches up, decisions are as if the
/// clock had never moved back. `retry_after` includes the time needed to catch up.
#[derive(Clone, Debug)]
pub struct Gcra {
    limit: Limit,
    /// `q`: ticks per nanosecond (1 when `shift` is above 0).
    ticks_per_ns: NonZeroU64,
    /// `s`: a tick is `2^s` ns (0 unless the bucket's depth needs ticks longer than 1 ns).
    shift: u32,
    /// `p`: ticks one unit takes to refill.
    unit_ticks: NonZeroU64,
    /// Division by `p` (the units in a headroom) without a division instruction.
    per_unit: Reciprocal,
    /// Division by `q` (ticks to nanoseconds) without a division instruction.
    per_ns: Reciprocal,
    /// `tau = burst * p`: how far ahead of `now` the tat may be; at `now + tau` the bucket is empty.
    tau_ticks: u64,
    /// `MAX_DEBT * tau`: how far ahead of `now` a record may push the tat (a debt of one burst).
    debt_cap_ticks: u64,
    /// The last clock reading, in ns, whose tick plus `tau` stays below `StateCell::RETIRED`.
    max_now_ns: u64,
    accuracy: Accuracy,
}

impl Gcra {
    /// Derives the tick parameters for `limit`, or says why the limit cannot be represented
    /// (only a burst beyond `u32::MAX` units can be: see [`Limit`]).
    pub fn from_limit(limit: Limit) -> Result<Self, LimitError> {
        Self::with_max_depth(limit, StateCell::RETIRED.saturating_sub(1))
    }

    /// Like [`from_limit`](Self::from_limit), with the bucket's depth (`tau`, in ticks) kept at
    /// or below `max_tau_ticks`: for a twin of this algorithm that computes in narrower numbers
    /// (the Redis script's doubles hold integers below 2^53; its debt reaches `2 * tau`).
    pub fn with_max_depth(limit: Limit, max_tau_ticks: u64) -> Result<Self, LimitError> {
        limit.check()?;
        Self::derive(limit, max_tau_ticks).ok_or_else(|| {
            let most = largest_burst(limit, max_tau_ticks)
                .map(|most| format!("; use a burst of at most {most}"))
                .unwrap_or_default();
            LimitError::Unsupported {
                algorithm: Gcra::NAME,
                reason: format!(
                    "{limit}: a burst of {} units, each taking {:?} to come back, is more than one \
                     bucket can count{most}",
                    limit.burst(),
                    limit.interval(),
                ),
            }
        })
    }

    /// The most precise ticks that hold `limit`'s bucket: exact if possible, else conservative.
    // Construction only: every operation is on u128 values of at most 2^64 shifted by at most 63.
    #[allow(clippy::arithmetic_side_effects)]
    fn derive(limit: Limit, max_tau: u64) -> Option<Self> {
        let (period, count) = (u128::from(limit.period_nanos()), u128::from(limit.count()));
        let divisor = u128::from(gcd(limit.period_nanos(), limit.count())).max(1);
        let exact = Self::build(limit, max_tau, count / divisor, 0, period / divisor);
        let fine = || {
            (0..=FINEST_TICKS_PER_NS.trailing_zeros())
                .rev()
                .find_map(|k| {
                    let q = 1u128 << k;
                    Self::build(limit, max_tau, q, 0, (period * q).div_ceil(count))
                })
        };
        let coarse = || {
            (1..u64::BITS).find_map(|shift| {
                let unit = period.div_ceil(count << shift).saturating_add(1);
                Self::build(limit, max_tau, 1, shift, unit)
            })
        };
        exact.or_else(fine).or_else(coarse)
    }

    /// The bucket in ticks of `2^shift / q` ns with units of `unit` ticks, if its depth fits
    /// `max_tau` and it leaves at least [`MIN_CLOCK_RANGE`] of clock.
    // Construction only: every operation is on u128 values of at most 2^64 shifted by at most 63.
    #[allow(clippy::arithmetic_side_effects)]
    fn build(limit: Limit, max_tau: u64, q: u128, shift: u32, unit: u128) -> Option<Self> {
        let ticks_per_ns = NonZeroU64::new(u64::try_from(q).ok()?)?;
        let unit_ticks = NonZeroU64::new(u64::try_from(unit).ok()?)?;
        let tau_ticks = limit.burst().checked_mul(unit_ticks.get())?;
        let debt_cap_ticks = tau_ticks.checked_mul(Usage::MAX_DEBT)?;
        // The largest tat written is now + 2 * tau (a record's), kept below
        // `StateCell::RETIRED` (u64::MAX).
        let last_tick = StateCell::RETIRED
            .saturating_sub(1)
            .checked_sub(debt_cap_ticks)?;
        if tau_ticks > max_tau {
            return None;
        }
        let max_now_ns = if shift == 0 {
            last_tick / ticks_per_ns
        } else {
            // Every reading whose floored tick is at most `last_tick`.
            let end = (u128::from(last_tick) << shift) | ((1u128 << shift) - 1);
            u64::try_from(end).unwrap_or(u64::MAX)
        };
        if max_now_ns < MIN_CLOCK_RANGE {
            return None;
        }
        // Shortfall: 1 - (period / count) / (unit * 2^shift / q).
        let effective = (unit << shift).checked_mul(u128::from(limit.count()))?;
        let wanted = u128::from(limit.period_nanos()).checked_mul(q)?;
        let accuracy = Accuracy::from_shortfall(effective.saturating_sub(wanted), effective);
        Some(Self {
            limit,
            ticks_per_ns,
            shift,
            unit_ticks,
            per_unit: Reciprocal::new(unit_ticks),
            per_ns: Reciprocal::new(ticks_per_ns),
            tau_ticks,
            debt_cap_ticks,
            max_now_ns,
            accuracy,
        })
    }

    /// The last clock reading, in nanoseconds since the epoch, this limit can decide at.
    pub fn max_now_nanos(&self) -> u64 {
        self.max_now_ns
    }

    /// The refill time of one unit as counted, `(numerator, denominator)` nanoseconds:
    /// `period / count` in lowest terms when the bucket is exact, and slightly more (never less)
    /// when it is not (see [`accuracy`](Algorithm::accuracy)).
    pub fn unit_nanos(&self) -> (u128, u64) {
        (
            u128::from(self.unit_ticks.get()) << self.shift,
            self.ticks_per_ns.get(),
        )
    }

    /// The tick parameters, as the Redis script receives them: ticks per ns `q`, the tick's
    /// shift `s` (a tick is `2^s / q` ns; `q` is 1 when `s` is above 0), ticks per unit `p` and
    /// the depth `tau`.
    pub fn ticks(&self) -> (u64, u32, u64, u64) {
        (
            self.ticks_per_ns.get(),
            self.shift,
            self.unit_ticks.get(),
            self.tau_ticks,
        )
    }

    /// `now` in ticks (floored), if it is within range.
    #[inline]
    fn tick_of(&self, now_ns: u64) -> Option<u64> {
        if now_ns > self.max_now_ns {
            return None;
        }
        // now_ns <= max_now_ns, so the product fits (see `build`).
        Some(
            now_ns
                .wrapping_mul(self.ticks_per_ns.get())
                .wrapping_shr(self.shift),
        )
    }

    /// From reading `now_ns` (tick `now`), the nanoseconds until the clock reaches tick
    /// `now + ticks`: the first reading at which that tick is current, so waits are exact and
    /// never favour the caller.
    #[inline]
    fn ns_until(&self, now_ns: u64, now: u64, ticks: u64) -> u64 {
        if self.shift == 0 {
            // A tick is a nanosecond for the common limits: no division.
            if self.ticks_per_ns == NonZeroU64::MIN {
                return ticks;
            }
            return self.per_ns.divide_ceil(ticks);
        }
        // Below 2^65 shifted by at most 63: fits a u128.
        let at = (u128::from(now).wrapping_add(u128::from(ticks))).wrapping_shl(self.shift);
        u64::try_from(at.saturating_sub(u128::from(now_ns))).unwrap_or(u64::MAX)
    }

    /// Whole units in `headroom` ticks below `tau`, floored.
    fn whole_units(&self, headroom_ticks: u64) -> u64 {
        self.per_unit.divide(headroom_ticks)
    }

    fn out_of_range(&self, now_ns: u64) -> DecisionError {
        DecisionError::ClockOutOfRange {
            now_ns,
            max_ns: self.max_now_ns,
        }
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

    fn accuracy(&self) -> Accuracy {
        self.accuracy
    }

    // Always inlined: a caller that stores the `Step` it returns and reads it back (a `dyn`
    // stack layer) stalls on the copy; inlined, the answer stays in registers.
    #[inline(always)]
    fn decide(&self, tat: u64, cost: u64, now_ns: u64) -> Result<Step, DecisionError> {
        let burst = self.limit.burst();
        if cost > burst {
            return Err(DecisionError::CostExceedsBurst { cost, burst });
        }
        let now = self
            .tick_of(now_ns)
            .ok_or_else(|| self.out_of_range(now_ns))?;
        // Wrapping arithmetic below never wraps; each line says why (saturating forms cost a
        // compare and a conditional move each, on the path every call takes).
        // cost <= burst, so cost * p <= tau, which fit at construction.
        let cost_ticks = cost.wrapping_mul(self.unit_ticks.get());
        // A tat in the past means a full bucket: consumption starts from now.
        let start = tat.max(now);
        // Ticks of capacity consumed and not yet refilled (above tau only if the clock went
        // back); start >= now.
        let debt = start.wrapping_sub(now);
        // cost_ticks <= tau.
        let budget = self.tau_ticks.wrapping_sub(cost_ticks);
        if debt <= budget {
            // debt + cost_ticks <= budget + cost_ticks = tau.
            let new_debt = debt.wrapping_add(cost_ticks);
            // A full bucket (the common case) leaves `burst - cost` whole units: no division.
            let remaining = if debt == 0 {
                burst.wrapping_sub(cost)
            } else {
                self.whole_units(self.tau_ticks.wrapping_sub(new_debt))
            };
            let decision = Decision::allow(burst, remaining, self.ns_until(now_ns, now, new_debt));
            // now + new_debt <= now + tau, which is in range by `tick_of`.
            let next = (cost > 0).then(|| now.wrapping_add(new_debt));
            Ok(Step { decision, next })
        } else {
            // Denied: the headroom holds fewer than `cost` whole units, so one unit (or a peek,
            // denied only past a clock that went back) leaves none, with no division.
            let remaining = if cost <= 1 {
                0
            } else {
                self.whole_units(self.tau_ticks.saturating_sub(debt))
            };
            let decision = Decision::deny(
                burst,
                remaining,
                self.ns_until(now_ns, now, debt.saturating_sub(budget)),
                self.ns_until(now_ns, now, debt),
            );
            Ok(Step {
                decision,
                next: None,
            })
        }
    }

    fn record(&self, tat: u64, cost: u64, now_ns: u64) -> Result<Step, DecisionError> {
        if cost == 0 {
            return self.decide(tat, 0, now_ns);
        }
        let burst = self.limit.burst();
        let now = self
            .tick_of(now_ns)
            .ok_or_else(|| self.out_of_range(now_ns))?;
        let start = tat.max(now);
        // now + 2 * tau is in range by `tick_of`; a tat already past it (a clock that went
        // back) stays where it is: a record never gives anything back.
        let cap = now.saturating_add(self.debt_cap_ticks);
        let next = start
            .saturating_add(cost.saturating_mul(self.unit_ticks.get()))
            .min(cap)
            .max(start);
        // next >= start >= now.
        let debt = next.saturating_sub(now);
        let decision = if debt <= self.tau_ticks {
            Decision::allow(
                burst,
                self.whole_units(self.tau_ticks.saturating_sub(debt)),
                self.ns_until(now_ns, now, debt),
            )
        } else {
            // One unit fits once the debt is down to tau - p.
            let one_unit = self.tau_ticks.saturating_sub(self.unit_ticks.get());
            Decision::deny(
                burst,
                0,
                self.ns_until(now_ns, now, debt.saturating_sub(one_unit)),
                self.ns_until(now_ns, now, debt),
            )
        };
        Ok(Step {
            decision,
            next: Some(next),
        })
    }

    #[inline]
    fn is_full(&self, tat: u64, now_ns: u64) -> bool {
        // Past the clock range every call is refused, so forgetting the state changes nothing.
        self.tick_of(now_ns).is_none_or(|now| tat <= now)
    }

    fn usage(&self, tat: u64, now_ns: u64) -> Usage {
        // Past the clock range every call is refused; report nothing in use.
        let debt = self
            .tick_of(now_ns)
            .map_or(0, |now| tat.saturating_sub(now));
        Usage::new(debt, self.tau_ticks)
    }

    fn with_usage(&self, usage: Usage, now_ns: u64) -> Result<u64, DecisionError> {
        let now = self
            .tick_of(now_ns)
            .ok_or_else(|| self.out_of_range(now_ns))?;
        // At most 2 * tau (a debt carried over), so now + debt is in range by `tick_of`.
        Ok(now.saturating_add(usage.scaled_to(self.tau_ticks).min(self.debt_cap_ticks)))
    }

    fn refund(&self, tat: u64, units: u64, _granted_at: u64, now_ns: u64) -> Option<u64> {
        let now = self.tick_of(now_ns)?;
        if tat <= now {
            return None; // full: everything taken has already come back
        }
        // Never below now: a refund cannot lift the bucket above full.
        let back = units.saturating_mul(self.unit_ticks.get());
        Some(tat.saturating_sub(back).max(now))
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while let Some(rest) = a.checked_rem(b) {
        (a, b) = (b, rest);
    }
    a
}

/// The largest burst (same count and period) whose bucket fits `max_tau`, for an error message.
// Construction only: every operation is on u128 values of at most 2^64 shifted by at most 63.
#[allow(clippy::arithmetic_side_effects)]
fn largest_burst(limit: Limit, max_tau: u64) -> Option<u64> {
    let fits = |burst: u64| burst > 0 && Gcra::derive(limit.with_burst(burst), max_tau).is_some();
    if !fits(1) {
        return None;
    }
    let (mut good, mut bad) = (1u64, limit.burst());
    while bad.saturating_sub(good) > 1 {
        let mid = good + (bad - good) / 2;
        if fits(mid) {
            good = mid;
        } else {
            bad = mid;
        }
    }
    Some(good)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gcra(count: u64, period_ns: u64, burst: u64) -> Gcra {
        Gcra::from_limit(Limit::from_nanos(count, period_ns).with_burst(burst)).unwrap()
    }

    #[test]
    fn ticks_are_nanoseconds_for_round_limits_and_exact_fractions_otherwise() {
        assert_eq!(gcra(10, 1_000_000_000, 10).unit_nanos(), (100_000_000, 1));
        assert_eq!(gcra(7, 1_000_000_000, 7).unit_nanos(), (1_000_000_000, 7));
        assert_eq!(gcra(6, 9, 1).unit_nanos(), (3, 2));
        for g in [gcra(10, 1_000_000_000, 10), gcra(7, 1_000_000_000, 7)] {
            assert!(g.accuracy().is_exact(), "{g:?}");
        }
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
    fn limits_too_fine_for_exact_ticks_are_counted_in_128ths_of_a_ns_rounded_up() {
        // 1009 per minute: exact ticks would be 1/1009 ns, leaving 211 days of clock.
        let g = gcra(1009, 60_000_000_000, 1009);
        assert_eq!(g.ticks().0, 128);
        let (num, den) = g.unit_nanos();
        // ceil(60e9 * 128 / 1009) = 7611496532 ticks: never shorter than the true interval.
        assert_eq!((num, den), (7_611_496_532, 128));
        assert!(num * 1009 >= 60_000_000_000 * 128);
        assert!(!g.accuracy().is_exact());
        assert!(
            g.accuracy().shortfall_per_billion() <= 1,
            "{}",
            g.accuracy()
        );
        assert!(g.max_now_nanos() >= MIN_CLOCK_RANGE);
    }

    #[test]
    fn buckets_too_deep_for_nanosecond_ticks_count_in_coarser_ticks() {
        // u32::MAX units, one a day: 371,000 billion seconds of depth.
        let g = gcra(1, 86_400_000_000_000, u64::from(u32::MAX));
        let (q, shift, unit, tau) = g.ticks();
        assert_eq!(q, 1);
        assert!(shift > 0);
        assert!(u128::from(unit) << shift >= 86_400_000_000_000 + (1 << shift));
        assert_eq!(tau, unit * u64::from(u32::MAX));
        assert!(g.max_now_nanos() >= MIN_CLOCK_RANGE);
        assert!(
            g.accuracy().shortfall_per_billion() <= 1,
            "{}",
            g.accuracy()
        );
        // Drain the whole burst, then wait exactly as long as the answer says for one unit.
        let drained = g.decide(Gcra::FRESH, u64::from(u32::MAX), 5).unwrap();
        let tat = drained.next.unwrap();
        let denied = g.decide(tat, 1, 7).unwrap().decision;
        assert!(denied.is_denied());
        let at = 7 + denied.retry_after_nanos();
        assert!(g.decide(tat, 1, at).unwrap().decision.is_allowed());
        assert!(g.decide(tat, 1, at - 1).unwrap().decision.is_denied());
        assert!(at - 5 >= 86_400_000_000_000, "a unit came back early");
    }

    #[test]
    fn only_a_burst_no_bucket_can_count_is_refused_and_the_error_names_the_largest() {
        let limit = Limit::per_day(1).with_burst(u64::MAX);
        let err = Gcra::from_limit(limit).unwrap_err().to_string();
        assert!(err.contains("use a burst of at most"), "{err}");
        assert!(!err.contains("tick") && !err.contains("range"), "{err}");
    }

    #[test]
    fn a_record_is_never_refused_and_leaves_a_debt_paid_back_at_the_rate() {
        // 10 per second: a unit every 100 ms.
        let g = gcra(10, 1_000_000_000, 10);
        // 4 left, then a response that used 6: two units in debt.
        let tat = g.decide(Gcra::FRESH, 6, 0).unwrap().next.unwrap();
        let step = g.record(tat, 6, 0).unwrap();
        let owed = step.next.unwrap();
        assert!(step.decision.is_denied());
        assert_eq!(step.decision.remaining(), 0);
        // Two units of debt, then one unit to admit: 300 ms.
        assert_eq!(step.decision.retry_after_nanos(), 300_000_000);
        assert_eq!(step.decision.reset_after_nanos(), 1_200_000_000);
        assert!(g.decide(owed, 1, 299_999_999).unwrap().decision.is_denied());
        assert!(
            g.decide(owed, 1, 300_000_000)
                .unwrap()
                .decision
                .is_allowed()
        );
        // A peek while in debt is denied; at exactly the limit it is not.
        assert!(g.decide(owed, 0, 0).unwrap().decision.is_denied());
        assert!(
            g.decide(owed, 0, 200_000_000)
                .unwrap()
                .decision
                .is_allowed()
        );
        // A cost above the burst is recorded too, capped at one burst of debt.
        let capped = g.record(Gcra::FRESH, 1_000, 0).unwrap();
        assert_eq!(capped.next, Some(2_000_000_000));
        assert_eq!(
            g.usage(2_000_000_000, 0),
            Usage::new(2_000_000_000, 1_000_000_000)
        );
        // Within the limit, a record is an admission.
        let fits = g.record(Gcra::FRESH, 3, 0).unwrap();
        assert_eq!(fits.decision, g.decide(Gcra::FRESH, 3, 0).unwrap().decision);
        assert_eq!(fits.next, g.decide(Gcra::FRESH, 3, 0).unwrap().next);
    }

    #[test]
    fn readings_past_the_range_are_refused_and_count_as_full() {
        let g = gcra(1, 1, 1);
        // The last reading leaves room for a tat of now + 2 * tau (a record's) below RETIRED.
        assert_eq!(g.max_now_nanos(), u64::MAX - 3);
        assert_eq!(
            g.decide(0, 1, u64::MAX - 2),
            Err(DecisionError::ClockOutOfRange {
                now_ns: u64::MAX - 2,
                max_ns: u64::MAX - 3
            })
        );
        assert!(g.is_full(u64::MAX - 1, u64::MAX));
        let last = g.decide(0, 1, u64::MAX - 3).unwrap();
        assert!(last.decision.is_allowed());
        assert_eq!(last.next, Some(StateCell::RETIRED - 2));
        let owed = g.record(0, u64::MAX, u64::MAX - 3).unwrap();
        assert!(owed.decision.is_denied());
        assert_eq!(owed.next, Some(StateCell::RETIRED - 1));
    }
}
