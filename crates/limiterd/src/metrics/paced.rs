//! A log line paced: due at most once a period, with the number of events left out since the
//! last line, so an event on every request (a denial, a store failure) is seen in the log
//! without a line per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One kind of event's pace in the log.
#[derive(Debug)]
pub(crate) struct Paced {
    started: Instant,
    every_ms: u64,
    /// When a line was last due, in ms since `started` (`u64::MAX`: never).
    logged_at_ms: AtomicU64,
    /// Events left out since the last line.
    unlogged: AtomicU64,
}

impl Paced {
    /// At most one line every `every`.
    pub(crate) fn new(every: Duration) -> Self {
        Self {
            started: Instant::now(),
            every_ms: u64::try_from(every.as_millis()).unwrap_or(u64::MAX),
            logged_at_ms: AtomicU64::new(u64::MAX),
            unlogged: AtomicU64::new(0),
        }
    }

    /// `Some(left_out)` when this event is to be logged now (`left_out`: the events left out
    /// since the last line), else `None`, and it is counted as left out.
    pub(crate) fn due(&self) -> Option<u64> {
        let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Relaxed: the instant only paces the log (see the exchange below).
        let last = self.logged_at_ms.load(Ordering::Relaxed);
        let due = last == u64::MAX || now_ms.saturating_sub(last) >= self.every_ms;
        if due
            && self
                .logged_at_ms
                // Relaxed: the instant only paces the log; losing a race leaves out one line.
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // Relaxed: a count of events left out, a statistic.
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
    fn the_first_event_is_due_and_the_rest_of_the_period_is_counted() {
        let paced = Paced::new(Duration::from_secs(3_600));
        assert_eq!(paced.due(), Some(0));
        assert_eq!(paced.due(), None);
        assert_eq!(paced.due(), None);
        // A period of zero makes every event due, with those left out before it.
        let every = Paced::new(Duration::ZERO);
        assert_eq!(every.due(), Some(0));
        assert_eq!(every.due(), Some(0));
        let hourly = Paced::new(Duration::from_secs(3_600));
        hourly.due();
        hourly.due();
        // Rewound by hand to the start: the next line reports the one left out.
        hourly.logged_at_ms.store(u64::MAX, Ordering::Relaxed);
        assert_eq!(hourly.due(), Some(1));
    }
}
