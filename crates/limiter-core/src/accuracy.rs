//! [`Accuracy`]: how far below its limit's exact rate an algorithm may admit, stated per limit.

use core::fmt;

/// How far below the exact rate `count / period` a built algorithm may admit, as a fraction
/// rounded up to parts per billion.
///
/// Rounding only ever goes against the caller: an algorithm never admits more than its limit
/// promises, and where its state cannot count a limit exactly it admits slightly *less*. A
/// shortfall of `s` means that over any span `T` the algorithm refills at least
/// `T * count / period * (1 - s)` units (and, as always, at most `burst + floor(T * count /
/// period)`). The token bucket is exact for most limits and short by at most 1 part in 10^5 for
/// every limit up to 10^6 per second; see each algorithm's docs for its own statement.
///
/// ```
/// use limiter_core::Accuracy;
///
/// assert!(Accuracy::EXACT.is_exact());
/// let close = Accuracy::from_shortfall(1, 128_000);
/// assert_eq!(close.shortfall_per_billion(), 7_813);
/// assert_eq!(close.to_string(), "within 0.0007813% below the limit");
/// ```
///
/// A window counter whose window number wraps (billions per window of milliseconds) also
/// states a *horizon*: a state left untouched for longer may be read as recent, which only ever
/// denies more ([`horizon_nanos`](Self::horizon_nanos)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Accuracy {
    per_billion: u64,
    /// 0 for none.
    horizon_ns: u64,
}

impl Accuracy {
    /// Exact: the algorithm admits exactly what the limit allows.
    pub const EXACT: Self = Self {
        per_billion: 0,
        horizon_ns: 0,
    };

    /// The same shortfall, exact only for states written within the last `horizon_ns`
    /// nanoseconds (an older state may be read conservatively).
    pub const fn with_horizon(self, horizon_ns: u64) -> Self {
        Self { horizon_ns, ..self }
    }

    /// How long after it is written a state is still read exactly, if that is limited.
    pub const fn horizon_nanos(&self) -> Option<u64> {
        if self.horizon_ns == 0 {
            None
        } else {
            Some(self.horizon_ns)
        }
    }

    /// A shortfall of `numerator / denominator`, rounded up to parts per billion (a zero
    /// denominator, or a fraction above one, counts as a shortfall of one: nothing guaranteed).
    pub fn from_shortfall(numerator: u128, denominator: u128) -> Self {
        const BILLION: u128 = 1_000_000_000;
        let per_billion = numerator
            .checked_mul(BILLION)
            .and_then(|scaled| scaled.checked_next_multiple_of(denominator))
            .and_then(|scaled| scaled.checked_div(denominator))
            .map_or(BILLION, |parts| parts.min(BILLION));
        Self {
            // At most a billion, so it fits.
            per_billion: u64::try_from(per_billion).unwrap_or(u64::MAX),
            horizon_ns: 0,
        }
    }

    /// Whether the algorithm decides exactly for this limit, for every state and reading.
    pub const fn is_exact(&self) -> bool {
        self.per_billion == 0 && self.horizon_ns == 0
    }

    /// The largest shortfall, in parts per billion of the limit's rate, rounded up.
    pub const fn shortfall_per_billion(&self) -> u64 {
        self.per_billion
    }
}

impl fmt::Display for Accuracy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.per_billion == 0 {
            f.write_str("exact")?;
        } else {
            // Display only: a float never decides anything.
            let percent = self.per_billion as f64 / 10_000_000.0;
            write!(f, "within {percent}% below the limit")?;
        }
        if let Some(horizon) = self.horizon_nanos() {
            let horizon = core::time::Duration::from_nanos(horizon);
            write!(f, ", for states written within the last {horizon:?}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortfalls_round_up_and_saturate() {
        assert_eq!(Accuracy::from_shortfall(0, 7), Accuracy::EXACT);
        assert_eq!(
            Accuracy::from_shortfall(1, 3).shortfall_per_billion(),
            333_333_334
        );
        assert_eq!(
            Accuracy::from_shortfall(1, 0).shortfall_per_billion(),
            1_000_000_000
        );
        assert_eq!(
            Accuracy::from_shortfall(5, 2).shortfall_per_billion(),
            1_000_000_000
        );
        assert_eq!(
            Accuracy::from_shortfall(u128::MAX, u128::MAX).shortfall_per_billion(),
            1_000_000_000
        );
        assert_eq!(Accuracy::EXACT.to_string(), "exact");
        let wrapping = Accuracy::EXACT.with_horizon(1_000);
        assert!(!wrapping.is_exact());
        assert_eq!(
            wrapping.to_string(),
            "exact, for states written within the last 1µs"
        );
    }
}
