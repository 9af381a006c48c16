//! [`Decision`]: the answer to one call, admitted or not, with what is left and when to retry.

use core::fmt;
use core::time::Duration;

/// The answer to one call. A denial is a `Decision`, not an error.
///
/// Rounding never favours the caller: `remaining` counts whole units (floored) and the waits are
/// rounded up to whole nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Decision {
    allowed: bool,
    limit: u64,
    remaining: u64,
    retry_after_ns: u64,
    reset_after_ns: u64,
}

impl Decision {
    /// An admitted call: `remaining` whole units are left, and the state is full again after
    /// `reset_after_ns` nanoseconds if nothing else is consumed.
    pub const fn allow(limit: u64, remaining: u64, reset_after_ns: u64) -> Self {
        Self {
            allowed: true,
            limit,
            remaining,
            retry_after_ns: 0,
            reset_after_ns,
        }
    }

    /// A denied call: the same cost is admitted after `retry_after_ns` nanoseconds (at least 1)
    /// if nothing else is consumed.
    pub const fn deny(
        limit: u64,
        remaining: u64,
        retry_after_ns: u64,
        reset_after_ns: u64,
    ) -> Self {
        debug_assert!(
            retry_after_ns > 0,
            "a denial always has a positive retry_after"
        );
        Self {
            allowed: false,
            limit,
            remaining,
            retry_after_ns,
            reset_after_ns,
        }
    }

    /// Whether the call was admitted.
    pub const fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the call was denied.
    pub const fn is_denied(&self) -> bool {
        !self.allowed
    }

    /// The most units the limiter admits at once (the limit's burst).
    pub const fn limit(&self) -> u64 {
        self.limit
    }

    /// Whole units left after this call.
    pub const fn remaining(&self) -> u64 {
        self.remaining
    }

    /// Zero when admitted; otherwise the exact wait after which the same cost is admitted if
    /// nothing else consumes in the meantime.
    pub const fn retry_after(&self) -> Duration {
        Duration::from_nanos(self.retry_after_ns)
    }

    /// [`retry_after`](Self::retry_after) in nanoseconds.
    pub const fn retry_after_nanos(&self) -> u64 {
        self.retry_after_ns
    }

    /// The wait until the state is full again if nothing else consumes.
    pub const fn reset_after(&self) -> Duration {
        Duration::from_nanos(self.reset_after_ns)
    }

    /// [`reset_after`](Self::reset_after) in nanoseconds.
    pub const fn reset_after_nanos(&self) -> u64 {
        self.reset_after_ns
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.allowed {
            write!(f, "allowed: {} of {} left", self.remaining, self.limit)?;
        } else {
            write!(
                f,
                "denied: {} of {} left, retry in {:?}",
                self.remaining,
                self.limit,
                self.retry_after()
            )?;
        }
        write!(f, ", full in {:?}", self.reset_after())
    }
}
