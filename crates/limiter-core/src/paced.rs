//! [`Paced`]: events too frequent to report each (a log line per refused request, per failing
//! store call), reported at most once a period with the number left out since: a limit of one
//! event per period whose refusals are counted.

use core::time::Duration;

use crate::clock::{Clock, MonotonicClock};
use crate::sync::{AtomicU64, Ordering};

/// At most one event a period is *due* (to be reported), with the number of events left out
/// since the last one that was; safe to share between threads.
///
/// ```
/// use std::time::Duration;
/// use limiter_core::{ManualClock, Paced};
///
/// let clock = ManualClock::new();
/// let pace = Paced::with_clock(Duration::from_secs(10), clock.clone());
/// assert_eq!(pace.due(), Some(0)); // the first is reported
/// assert_eq!(pace.due(), None); // left out
/// assert_eq!(pace.due(), None);
/// clock.advance(Duration::from_secs(10));
/// assert_eq!(pace.due(), Some(2)); // reported, with the two left out since
/// ```
#[derive(Debug)]
pub struct Paced<C = MonotonicClock> {
    clock: C,
    every_nanos: u64,
    /// When an event was last due, by `clock` (`u64::MAX`: never).
    due_at: AtomicU64,
    /// Events left out since.
    left_out: AtomicU64,
}

impl Paced {
    /// At most one event due every `every`, by the OS's monotonic clock.
    pub fn new(every: Duration) -> Self {
        Self::with_clock(every, MonotonicClock::new())
    }
}

impl<C: Clock> Paced<C> {
    /// At most one event due every `every`, by `clock`.
    pub fn with_clock(every: Duration, clock: C) -> Self {
        Self {
            clock,
            every_nanos: u64::try_from(every.as_nanos()).unwrap_or(u64::MAX),
            due_at: AtomicU64::new(u64::MAX),
            left_out: AtomicU64::new(0),
        }
    }

    /// `Some(left out since the last due event)` when this event is due (the first ever is,
    /// and then the first a whole period after the last due one), else `None`, and this
    /// event is counted as left out.
    pub fn due(&self) -> Option<u64> {
        let now = self.clock.now();
        // Relaxed: the instant only paces reports (see the exchange below).
        let last = self.due_at.load(Ordering::Relaxed);
        let due = last == u64::MAX || now.saturating_sub(last) >= self.every_nanos;
        if due
            && self
                .due_at
                // Relaxed: the instant only paces reports; losing a race leaves out one event.
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            // Relaxed: a count of events left out, a statistic.
            return Some(self.left_out.swap(0, Ordering::Relaxed));
        }
        // Relaxed: as above.
        self.left_out.fetch_add(1, Ordering::Relaxed);
        None
    }
}

#[cfg(all(test, not(limiter_loom)))]
mod tests {
    use super::*;
    use crate::ManualClock;

    #[test]
    fn one_event_a_period_is_due_with_the_number_left_out() {
        let clock = ManualClock::new();
        let pace = Paced::with_clock(Duration::from_secs(1), clock.clone());
        assert_eq!(pace.due(), Some(0));
        clock.advance(Duration::from_millis(999));
        assert_eq!(pace.due(), None, "within the period");
        clock.advance(Duration::from_millis(1));
        assert_eq!(pace.due(), Some(1));
        assert_eq!(pace.due(), None);
        // A period of zero makes every event due.
        let every = Paced::with_clock(Duration::ZERO, clock);
        assert_eq!(every.due(), Some(0));
        assert_eq!(every.due(), Some(0));
    }
}
