//! [`Decision`]: the answer to one call, admitted or not, with what is left and when to retry.

use core::fmt;
use core::time::Duration;

/// The answer to one call. A denial is a `Decision`, not an error.
///
/// Rounding never favours the caller: `remaining` counts whole units (floored) and the waits are
/// rounded up to whole nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Decision {
    verdict: Verdict,
    limit: u64,
    remaining: u64,
    retry_after_ns: u64,
    reset_after_ns: u64,
}

/// Admitted or not, as a whole word: a `bool` among the answer's words would leave seven bytes
/// of padding, which every move of an answer copies in overlapping pieces (a store the next
/// load cannot be forwarded from, a stall each time an answer is returned). Its unused values
/// leave `Option<Decision>` the size of a `Decision`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u64)]
enum Verdict {
    Denied = 0,
    Allowed = 1,
}

impl Decision {
    /// An admitted call: `remaining` whole units are left, and the state is full again after
    /// `reset_after_ns` nanoseconds if nothing else is consumed.
    pub const fn allow(limit: u64, remaining: u64, reset_after_ns: u64) -> Self {
        Self {
            verdict: Verdict::Allowed,
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
            verdict: Verdict::Denied,
            limit,
            remaining,
            retry_after_ns,
            reset_after_ns,
        }
    }

    /// Whether the call was admitted.
    pub const fn is_allowed(&self) -> bool {
        matches!(self.verdict, Verdict::Allowed)
    }

    /// Whether the call was denied.
    pub const fn is_denied(&self) -> bool {
        matches!(self.verdict, Verdict::Denied)
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

impl fmt::Debug for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Decision")
            .field("allowed", &self.is_allowed())
            .field("limit", &self.limit)
            .field("remaining", &self.remaining)
            .field("retry_after_ns", &self.retry_after_ns)
            .field("reset_after_ns", &self.reset_after_ns)
            .finish()
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_allowed() {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_five_whole_words_and_an_absent_one_costs_nothing() {
        // No byte-sized field among the words: moving an answer copies words, not padding in
        // overlapping pieces; the verdict's unused values make `None` free.
        assert_eq!(size_of::<Decision>(), 5 * 8);
        assert_eq!(size_of::<Option<Decision>>(), size_of::<Decision>());
    }

    #[test]
    fn an_answer_reads_back_as_made_and_prints_its_admission() {
        let allowed = Decision::allow(10, 4, 7);
        let denied = Decision::deny(10, 0, 3, 9);
        assert!(allowed.is_allowed() && !allowed.is_denied());
        assert!(denied.is_denied() && !denied.is_allowed());
        assert_eq!(
            format!("{denied:?}"),
            "Decision { allowed: false, limit: 10, remaining: 0, retry_after_ns: 3, \
             reset_after_ns: 9 }"
        );
        assert_ne!(allowed, Decision::deny(10, 4, 1, 7));
    }
}
