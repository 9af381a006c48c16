//! What the middleware does with a failure it answers for: a store whose failure policy
//! answered (the request let through uncounted, refused with 503, or decided by a local
//! fallback) or a request that cannot be rate limited (500). The operator reads it in the log
//! (`tracing`, target `limiter_tower`), at most one warning every ten seconds per layer with
//! the number left out since; of a store's failure the client is told only that the limiter is
//! unavailable, since its error names servers and keys, which are not the client's to see.

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};

use limiter_core::{Clock, MonotonicClock};

/// The least time between two warnings of one layer.
const EVERY_NS: u64 = 10_000_000_000;

/// One layer's failures, paced in the log.
#[derive(Debug)]
pub(crate) struct FailureLog {
    clock: MonotonicClock,
    /// When a warning was last written, by `clock` (`u64::MAX`: never).
    logged_at: AtomicU64,
    /// Failures left out since the last warning.
    unlogged: AtomicU64,
}

impl FailureLog {
    pub(crate) fn new() -> Self {
        Self {
            clock: MonotonicClock::new(),
            logged_at: AtomicU64::new(u64::MAX),
            unlogged: AtomicU64::new(0),
        }
    }

    /// Logs `error` with `what` the middleware did about it, unless a warning was written less
    /// than ten seconds ago (then it is counted, and the next warning says how many).
    #[cold]
    pub(crate) fn report(&self, what: &str, error: &dyn Display) {
        if let Some(unlogged) = self.due() {
            tracing::warn!(
                %error,
                unlogged,
                "{what} (one such line every 10 s per layer)"
            );
        }
    }

    /// `Some(left out since the last warning)` when a warning is due now, else `None` (and
    /// this failure is counted as left out).
    fn due(&self) -> Option<u64> {
        let now = self.clock.now();
        // Relaxed: the instant only paces the log (see the exchange below).
        let last = self.logged_at.load(Ordering::Relaxed);
        let due = last == u64::MAX || now.saturating_sub(last) >= EVERY_NS;
        if due
            && self
                .logged_at
                // Relaxed: the instant only paces the log; losing a race leaves out one line.
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // Relaxed: a count of failures left out, a statistic.
            return Some(self.unlogged.swap(0, Ordering::Relaxed));
        }
        // Relaxed: as above.
        self.unlogged.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_due_and_the_rest_of_ten_seconds_are_counted() {
        let log = FailureLog::new();
        assert_eq!(log.due(), Some(0));
        assert_eq!(log.due(), None);
        assert_eq!(log.due(), None);
        // Rewound by hand to "never": the next warning reports the two left out.
        log.logged_at.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(log.due(), Some(2));
        assert_eq!(log.due(), None);
    }
}
