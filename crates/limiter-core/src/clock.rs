//! [`Clock`]: where limiters read time, as integer nanoseconds since the clock's own epoch.
//!
//! [`MonotonicClock`] reads `std::time::Instant`; [`ManualClock`] is moved by hand in tests.
//! Library code reads time only through this trait.

use core::time::Duration;
use std::time::Instant;

use crate::sync::{Arc, AtomicU64, Ordering};

/// A source of time: nanoseconds since the clock's own epoch.
///
/// A reading may be earlier than a previous one (a manual clock set back, a broken source);
/// limiters never panic on it and never admit more because of it.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's epoch.
    fn now(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> u64 {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> u64 {
        (**self).now()
    }
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    fn now(&self) -> u64 {
        (**self).now()
    }
}

/// The default clock: monotonic time from `std::time::Instant`, with its epoch at construction.
///
/// Copies share the epoch, so limiters built from copies of one clock agree on time.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    epoch: Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> u64 {
        // 2^64 ns is about 584 years; saturate rather than wrap past it.
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock moved by hand, for tests: cheap to clone, and every clone shares the same time.
///
/// ```
/// use std::time::Duration;
/// use limiter_core::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(shared.now(), 5_000_000);
/// clock.set(1); // time may also be set backwards
/// assert_eq!(shared.now(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading 0.
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A clock reading `nanos`.
    pub fn starting_at(nanos: u64) -> Self {
        Self {
            nanos: Arc::new(AtomicU64::new(nanos)),
        }
    }

    /// Moves time forward by `by`, saturating at `u64::MAX` nanoseconds.
    pub fn advance(&self, by: Duration) {
        self.advance_nanos(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Moves time forward by `nanos`, saturating at `u64::MAX`.
    pub fn advance_nanos(&self, nanos: u64) {
        // Relaxed: the reading is a value, not a flag guarding other memory; tests that need a
        // reading to be seen by another thread order it with their own join or barrier.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_add(nanos))
            });
    }

    /// Sets the reading to `nanos`, which may be earlier than the current one.
    pub fn set(&self, nanos: u64) {
        // Relaxed: as in `advance_nanos`.
        self.nanos.store(nanos, Ordering::Relaxed);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        // Relaxed: pairs with nothing; see `advance_nanos`.
        self.nanos.load(Ordering::Relaxed)
    }
}

#[cfg(all(test, not(limiter_loom)))]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_saturates_instead_of_overflowing() {
        let clock = ManualClock::starting_at(u64::MAX - 1);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), u64::MAX);
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        let clock = MonotonicClock::new();
        let first = clock.now();
        assert!(clock.now() >= first);
    }
}
