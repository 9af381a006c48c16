//! The small, stable core every limiter crate builds on: [`Limit`], [`Decision`], the
//! [`Limiter`] trait, the [`Algorithm`] trait with its atomic [`StateCell`], [`Clock`] with
//! [`DefaultClock`] (the time-stamp counter where it is invariant), [`MonotonicClock`] and [`ManualClock`], and the error types. It does no IO.
//!
//! # The model
//!
//! A limit admits `count` units per `period`, at most `burst` at once. Each call asks for a
//! `cost` (1 by default; 0 is a peek) and gets a [`Decision`]: admitted or not, how many whole
//! units remain, when the same cost would be admitted (`retry_after`), and when the state is full
//! again (`reset_after`). Time is integer nanoseconds read from a [`Clock`]; there are no floats
//! on any decision path.
//!
//! An [`Algorithm`] is a pure function `(state, cost, now) -> (Decision, new state)` over one
//! `u64` word. A [`StateCell`] applies it with a compare-and-swap loop, and a denial writes
//! nothing. [`DirectLimiter`] is one such cell; keyed stores hold one per key.
//!
//! Usage that already happened (tokens a response used, bytes already sent) is not a request:
//! [`Algorithm::record`] counts it whatever the state, leaving the key in debt if it went over,
//! and later calls are denied until the debt is paid back at the limit's rate
//! ([`DirectLimiter::record`], [`Limiter::record`]).
//!
//! # Example
//!
//! Algorithms live in their own crates (`limiter-token-bucket`, ...). Here the core pieces on
//! their own:
//!
//! ```
//! use std::time::Duration;
//! use limiter_core::{Clock, Decision, Limit, ManualClock};
//!
//! # fn main() -> Result<(), limiter_core::LimitError> {
//! let limit = Limit::per_second(10).with_burst(5);
//! assert_eq!(limit.interval(), Duration::from_millis(100));
//!
//! let clock = ManualClock::new();
//! clock.advance(limit.interval());
//! assert_eq!(clock.now(), 100_000_000);
//!
//! let denied = Decision::deny(limit.burst(), 0, 100_000_000, 500_000_000);
//! assert_eq!(denied.retry_after(), Duration::from_millis(100));
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

mod accuracy;
mod algorithm;
mod clock;
mod decision;
mod direct;
mod error;
mod lease;
mod limit;
mod limiter;
mod paced;
mod sync;
pub mod text;
pub mod wait;

pub use accuracy::Accuracy;
pub use algorithm::{
    Algorithm, MIN_CLOCK_RANGE, Recording, Refunding, StateCell, Step, Usage, check_clock,
};
#[cfg(not(limiter_loom))]
pub use clock::CoarseClock;
pub use clock::{
    Clock, ClockSource, DefaultClock, ManualClock, MonotonicClock, TscClock, WEEK_NANOS,
    unix_origin, unix_week_phase,
};
pub use decision::Decision;
pub use direct::DirectLimiter;
pub use error::{DecisionError, LimitError};
pub use lease::{LEASE_TICK_NANOS, LeaseCell, LeaseSpend, MAX_LEASE_UNITS};
pub use limit::Limit;
pub use limiter::Limiter;
pub use paced::Paced;
