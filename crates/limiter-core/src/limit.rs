//! [`Limit`]: how many units a limiter admits per period, and how many at once (the burst).

use core::fmt;
use core::time::Duration;

use crate::LimitError;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// `count` units per `period`, with at most `burst` units at once.
///
/// Building a `Limit` never fails, so a limit written in code takes no `?`: it is checked once,
/// where a limiter is built from it (`TokenBucket::new(limit)?`, a stack's `build()?`), and
/// [`check`](Self::check) checks it on its own. Only a limit that cannot be counted at all is
/// refused: a zero count, period or burst, or a period beyond `u64` nanoseconds (584 years).
/// Every algorithm accepts every count and burst from 1 to `u32::MAX` with every period from
/// 1 µs to 366 days, in memory and on Redis.
///
/// # Accuracy
///
/// No algorithm ever admits more than its limit allows: a token bucket admits at most
/// `burst + floor(T * count / period)` units over any span `T`. Where an algorithm's one-word
/// state cannot count a limit exactly (a token bucket's refill of 1009 per minute is not a whole
/// number of nanoseconds, nor of any tick that leaves years of clock range), it rounds
/// against the caller and admits slightly less: at most 1 unit in 10^5 fewer for every limit up
/// to 10^6 per second. Each built algorithm reports its own bound through
/// [`Algorithm::accuracy`](crate::Algorithm::accuracy), as an [`Accuracy`](crate::Accuracy).
///
/// ```
/// use limiter_core::{Limit, LimitError};
///
/// let limit = Limit::per_minute(100).with_burst(10);
/// assert_eq!((limit.count(), limit.burst()), (100, 10));
/// assert_eq!(limit.period().as_secs(), 60);
/// assert_eq!(limit.check(), Ok(()));
/// assert_eq!(Limit::per_second(0).check(), Err(LimitError::ZeroCount));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    count: u64,
    period_ns: u64,
    burst: u64,
    /// A period given as a `Duration` too long for `u64` nanoseconds, kept for the error.
    too_long: Option<Duration>,
}

impl Limit {
    /// `count` units per `period`; the burst defaults to `count`.
    pub const fn new(count: u64, period: Duration) -> Self {
        let nanos = period.as_nanos();
        if nanos > u64::MAX as u128 {
            return Self {
                count,
                period_ns: u64::MAX,
                burst: count,
                too_long: Some(period),
            };
        }
        Self::from_nanos(count, nanos as u64)
    }

    /// `count` units per `period_ns` nanoseconds; the burst defaults to `count`.
    pub const fn from_nanos(count: u64, period_ns: u64) -> Self {
        Self {
            count,
            period_ns,
            burst: count,
            too_long: None,
        }
    }

    /// `count` units per second.
    pub const fn per_second(count: u64) -> Self {
        Self::from_nanos(count, NANOS_PER_SECOND)
    }

    /// `count` units per minute.
    pub const fn per_minute(count: u64) -> Self {
        Self::from_nanos(count, 60 * NANOS_PER_SECOND)
    }

    /// `count` units per hour.
    pub const fn per_hour(count: u64) -> Self {
        Self::from_nanos(count, 60 * 60 * NANOS_PER_SECOND)
    }

    /// `count` units per day (24 hours).
    pub const fn per_day(count: u64) -> Self {
        Self::from_nanos(count, 24 * 60 * 60 * NANOS_PER_SECOND)
    }

    /// The same rate with at most `burst` units at once (larger or smaller than `count`).
    pub const fn with_burst(self, burst: u64) -> Self {
        Self { burst, ..self }
    }

    /// Whether the limit can be counted: `Ok` unless its count, period or burst is zero or
    /// its period is beyond `u64` nanoseconds. Every limiter checks its limits this way when it
    /// is built; the error names the field and the fix.
    pub const fn check(&self) -> Result<(), LimitError> {
        if self.count == 0 {
            return Err(LimitError::ZeroCount);
        }
        if let Some(period) = self.too_long {
            return Err(LimitError::PeriodTooLong { period });
        }
        if self.period_ns == 0 {
            return Err(LimitError::ZeroPeriod);
        }
        if self.burst == 0 {
            return Err(LimitError::ZeroBurst);
        }
        Ok(())
    }

    /// Units admitted per period, on average.
    pub const fn count(&self) -> u64 {
        self.count
    }

    /// The period over which `count` units are admitted.
    pub const fn period(&self) -> Duration {
        Duration::from_nanos(self.period_ns)
    }

    /// The period in nanoseconds.
    pub const fn period_nanos(&self) -> u64 {
        self.period_ns
    }

    /// The most units admitted at once; a cost above it is an error, not a denial.
    pub const fn burst(&self) -> u64 {
        self.burst
    }

    /// The time one unit takes to come back, rounded up to a whole nanosecond (the whole
    /// period for a count of 0, which [`check`](Self::check) refuses).
    pub const fn interval(&self) -> Duration {
        let count = if self.count == 0 { 1 } else { self.count };
        Duration::from_nanos(self.period_ns.div_ceil(count))
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} per {:?}", self.count, self.period())?;
        if self.burst != self.count {
            write!(f, " (burst {})", self.burst)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_names_every_field_that_cannot_be_counted() {
        let cases: [(Limit, Option<LimitError>); 10] = [
            (Limit::per_second(0), Some(LimitError::ZeroCount)),
            (Limit::new(1, Duration::ZERO), Some(LimitError::ZeroPeriod)),
            (Limit::from_nanos(1, 0), Some(LimitError::ZeroPeriod)),
            (
                Limit::per_second(1).with_burst(0),
                Some(LimitError::ZeroBurst),
            ),
            (
                Limit::new(1, Duration::MAX),
                Some(LimitError::PeriodTooLong {
                    period: Duration::MAX,
                }),
            ),
            // A zero count is named before the period or burst.
            (
                Limit::from_nanos(0, 0).with_burst(0),
                Some(LimitError::ZeroCount),
            ),
            (Limit::per_second(NANOS_PER_SECOND + 1), None),
            (
                Limit::new(u64::from(u32::MAX), Duration::from_micros(1)),
                None,
            ),
            (Limit::per_day(u64::from(u32::MAX)), None),
            (Limit::from_nanos(u64::MAX, u64::MAX), None),
        ];
        for (limit, want) in cases {
            assert_eq!(limit.check(), want.map_or(Ok(()), Err), "{limit:?}");
        }
        // A valid period given as a Duration is the same limit as in nanoseconds.
        assert_eq!(Limit::new(5, Duration::from_secs(60)), Limit::per_minute(5));
        assert_eq!(Limit::per_second(0).interval(), Duration::from_secs(1));
    }

    #[test]
    fn burst_defaults_to_count_and_displays_when_different() {
        let limit = Limit::per_minute(100);
        assert_eq!(limit.burst(), 100);
        assert_eq!(limit.to_string(), "100 per 60s");
        assert_eq!(limit.with_burst(7).to_string(), "100 per 60s (burst 7)");
    }

    #[test]
    fn interval_rounds_up() {
        assert_eq!(
            Limit::per_second(3).interval(),
            Duration::from_nanos(333_333_334)
        );
        assert_eq!(Limit::per_second(4).interval(), Duration::from_millis(250));
    }

    #[test]
    fn errors_name_the_field_and_the_fix() {
        let msg = LimitError::ZeroBurst.to_string();
        assert!(
            msg.contains("`burst`") && msg.contains("at least 1"),
            "{msg}"
        );
    }
}
