//! Error types: what was wrong with a limit or a call, and how to fix it.
//!
//! A denial is never an error: it is a [`Decision`](crate::Decision) with `allowed == false`.
//! These errors are for input that can never be decided.

use core::time::Duration;

/// A [`Limit`](crate::Limit) that cannot be built or that an algorithm cannot represent.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// `count` was 0. Fix: a limit admits at least one unit per period.
    #[error(
        "invalid limit: `count` is 0; a limit must admit at least 1 unit per period (use a count of 1 or more)"
    )]
    ZeroCount,
    /// `period` was zero. Fix: use a period of at least one nanosecond.
    #[error(
        "invalid limit: `period` is zero; use a period of at least 1 ns, e.g. `Limit::per_second(n)`"
    )]
    ZeroPeriod,
    /// `burst` was 0. Fix: a burst is at least 1 unit; leave it out to default to `count`.
    #[error(
        "invalid limit: `burst` is 0; a burst must be at least 1 unit (leave it out to default to `count`)"
    )]
    ZeroBurst,
    /// `period` does not fit in `u64` nanoseconds (about 584 years). Fix: use a shorter period.
    #[error(
        "invalid limit: `period` {period:?} is longer than u64::MAX nanoseconds (about 584 years); use a shorter period"
    )]
    PeriodTooLong {
        /// The period that was asked for.
        period: Duration,
    },
    /// The limit is valid, but the named algorithm cannot represent it; `reason` says why and
    /// what nearby limit would work.
    #[error("invalid limit for the {algorithm}: {reason}")]
    Unsupported {
        /// The algorithm that refused the limit.
        algorithm: &'static str,
        /// Why, and how to fix it.
        reason: String,
    },
}

/// A call that can never be decided. A call that is merely over the limit is not an error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DecisionError {
    /// The cost is larger than the burst, so no amount of waiting admits it.
    /// Fix: split the work into parts of at most `burst` units, or raise the burst.
    #[error(
        "cost {cost} exceeds the burst of {burst}, so it can never be admitted; split the request into parts of at most {burst} units or raise the limit's burst"
    )]
    CostExceedsBurst {
        /// The cost that was asked for.
        cost: u64,
        /// The limit's burst.
        burst: u64,
    },
    /// The clock reading is past the last instant this limit can represent.
    /// Fix: build the limiter on a clock whose epoch is more recent (a new `DefaultClock`).
    #[error(
        "clock reading {now_ns} ns is past the last instant this limit can represent ({max_ns} ns after the clock's epoch); build the limiter on a clock with a more recent epoch"
    )]
    ClockOutOfRange {
        /// The clock reading, in nanoseconds since the clock's epoch.
        now_ns: u64,
        /// The last reading the limit can represent.
        max_ns: u64,
    },
}
