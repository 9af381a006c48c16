//! Quotas by the calendar: at most `count` units per day, week (from Monday), month or year, in
//! UTC or any IANA time zone ("1,000,000 a month, in the customer's time zone"). A window starts
//! at local midnight of its unit's first day, so a day across a daylight-saving change lasts 23
//! or 25 hours, a month 28 to 31 days, and `reset_after` names the next boundary exactly.
//!
//! The IANA time zone database is embedded (through jiff), so every machine draws the same
//! boundaries, with or without `/usr/share/zoneinfo`; an unknown zone is refused when the
//! calendar is built.
//!
//! A calendar turns a clock's readings into Unix time (from the reading 0's instant,
//! [`limiter_core::unix_origin`]), so it needs a clock that keeps the OS clock's rate:
//! [`MonotonicClock`](limiter_core::MonotonicClock), the default of [`CalendarWindow`] and
//! [`KeyedCalendarWindow`]. The library's `DefaultClock` reads the time-stamp counter at the
//! rate quanta calibrated once (16 ppm off on the development VM: a month's boundary half a
//! minute off after a month of uptime); a stack with a calendar layer is built with
//! `.clock(MonotonicClock::new())` for the same reason, and refuses to build on a clock that
//! does not keep the wall clock's rate ([`Clock::keeps_wall_rate`](limiter_core::Clock::keeps_wall_rate)),
//! as a window built from a counter does ([`limiter_core::check_clock`]).
//!
//! ```
//! use limiter_calendar::{Calendar, CalendarCounter, CalendarUnit, CalendarWindow};
//! use limiter_core::ManualClock;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 3 a month in Berlin. The manual clock's reading 0 is 2026-03-31 21:59:59 UTC: one
//! // second before April starts in Berlin (summer time, UTC+2).
//! let origin = 1_774_994_399_000_000_000;
//! let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin")?;
//! let clock = ManualClock::new();
//! let quota = CalendarWindow::from_algorithm(CalendarCounter::new(3, month, origin)?, clock.clone())?;
//! assert!(quota.check_n(3)?.is_allowed());
//! let denied = quota.check()?;
//! assert_eq!(denied.retry_after().as_secs(), 1); // April starts in a second
//! clock.advance(std::time::Duration::from_secs(1));
//! assert!(quota.check()?.is_allowed());
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

mod cache;
#[cfg(test)]
mod cache_tests;
mod calendar;
mod counter;
mod sync;
mod window;

pub use calendar::{Calendar, CalendarError, CalendarUnit};
pub use counter::{CalendarCounter, MAX_CALENDAR_COUNT};
pub use window::Window;

/// One calendar window counter (build it with `DirectLimiter::from_algorithm` from a
/// [`CalendarCounter::on_clock`]), on the OS's monotonic clock unless another is named (see
/// the crate's docs on the clock).
pub type CalendarWindow<C = limiter_core::MonotonicClock> =
    limiter_core::DirectLimiter<CalendarCounter, C>;

/// A calendar window counter per key (build it with `KeyedLimiter::from_algorithm` from a
/// [`CalendarCounter::on_clock`]), on the OS's monotonic clock unless another is named.
pub type KeyedCalendarWindow<
    K,
    C = limiter_core::MonotonicClock,
    St = limiter_store::ShardedStore<K>,
> = limiter_store::KeyedLimiter<CalendarCounter, K, C, St>;
