//! [`Limit`]: how many units a limiter admits per period, and how many at once (the burst).

use core::fmt;
use core::time::Duration;

use crate::LimitError;

const NANOS_PER_SECOND: u64 = 1_000_000_000;

/// `count` units per `period`, with at most `burst` units at once.
///
/// A limit is validated when it is built, so every `Limit` value is usable: the count, period
/// and burst are non-zero and the period fits in `u64` nanoseconds (584 years). Nothing else is
/// refused: every algorithm accepts every count and burst from 1 to `u32::MAX` with every
/// period from 1 µs to 366 days, in memory and on Redis.
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
/// use limiter_core::Limit;
/// # fn main() -> Result<(), limiter_core::LimitError> {
/// let limit = Limit::per_minute(100)?.with_burst(10)?;
/// assert_eq!((limit.count(), limit.burst()), (100, 10));
/// assert_eq!(limit.period().as_secs(), 60);
/// assert!(Limit::per_second(0).is_err());
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Limit {
    count: u64,
    period_ns: u64,
    burst: u64,
}

impl Limit {
    /// `count` units per `period`; the burst defaults to `count`.
    pub fn new(count: u64, period: Duration) -> Result<Self, LimitError> {
        let period_ns =
            u64::try_from(period.as_nanos()).map_err(|_| LimitError::PeriodTooLong { period })?;
        Self::from_nanos(count, period_ns)
    }

    /// `count` units per `period_ns` nanoseconds; the burst defaults to `count`.
    pub fn from_nanos(count: u64, period_ns: u64) -> Result<Self, LimitError> {
        if count == 0 {
            return Err(LimitError::ZeroCount);
        }
        if period_ns == 0 {
            return Err(LimitError::ZeroPeriod);
        }
        Ok(Self {
            count,
            period_ns,
            burst: count,
        })
    }

    /// `count` units per second.
    pub fn per_second(count: u64) -> Result<Self, LimitError> {
        Self::from_nanos(count, NANOS_PER_SECOND)
    }

    /// `count` units per minute.
    pub fn per_minute(count: u64) -> Result<Self, LimitError> {
        Self::new(count, Duration::from_secs(60))
    }

    /// `count` units per hour.
    pub fn per_hour(count: u64) -> Result<Self, LimitError> {
        Self::new(count, Duration::from_secs(60 * 60))
    }

    /// `count` units per day (24 hours).
    pub fn per_day(count: u64) -> Result<Self, LimitError> {
        Self::new(count, Duration::from_secs(24 * 60 * 60))
    }

    /// The same rate with at most `burst` units at once (larger or smaller than `count`).
    pub fn with_burst(self, burst: u64) -> Result<Self, LimitError> {
        if burst == 0 {
            return Err(LimitError::ZeroBurst);
        }
        Ok(Self { burst, ..self })
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

    /// The time one unit takes to come back, rounded up to a whole nanosecond.
    pub const fn interval(&self) -> Duration {
        Duration::from_nanos(self.period_ns.div_ceil(self.count))
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
    fn constructors_validate_every_field() {
        let cases: [(Result<Limit, LimitError>, Option<LimitError>); 8] = [
            (Limit::per_second(0), Some(LimitError::ZeroCount)),
            (Limit::new(1, Duration::ZERO), Some(LimitError::ZeroPeriod)),
            (
                Limit::per_second(1).and_then(|l| l.with_burst(0)),
                Some(LimitError::ZeroBurst),
            ),
            (
                Limit::new(1, Duration::MAX),
                Some(LimitError::PeriodTooLong {
                    period: Duration::MAX,
                }),
            ),
            (Limit::per_second(NANOS_PER_SECOND + 1), None),
            (
                Limit::new(u64::from(u32::MAX), Duration::from_micros(1)),
                None,
            ),
            (Limit::per_second(NANOS_PER_SECOND), None),
            (Limit::from_nanos(u64::MAX, u64::MAX), None),
        ];
        for (got, want) in cases {
            match want {
                Some(err) => assert_eq!(got, Err(err)),
                None => assert!(got.is_ok(), "{got:?}"),
            }
        }
    }

    #[test]
    fn burst_defaults_to_count_and_displays_when_different() {
        let limit = Limit::per_minute(100).unwrap();
        assert_eq!(limit.burst(), 100);
        assert_eq!(limit.to_string(), "100 per 60s");
        assert_eq!(
            limit.with_burst(7).unwrap().to_string(),
            "100 per 60s (burst 7)"
        );
    }

    #[test]
    fn interval_rounds_up() {
        assert_eq!(
            Limit::per_second(3).unwrap().interval(),
            Duration::from_nanos(333_333_334)
        );
        assert_eq!(
            Limit::per_second(4).unwrap().interval(),
            Duration::from_millis(250)
        );
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
