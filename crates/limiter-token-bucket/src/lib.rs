//! A lock-free, exact token bucket. Each bucket's whole state is one `u64`, updated by
//! compare-and-swap: no mutex, no background refill, and a denial writes nothing.
//!
//! A bucket holds at most `burst` tokens and refills `count` per `period`, continuously and
//! lazily: the refill is computed from the clock when a call arrives. It is exact: refill is
//! counted in integer ticks of `1/q` ns (see [`Gcra`]), so no fractional credit is ever lost or
//! invented, and over any interval of length `T` the bucket admits at most
//! `burst + floor(T * count / period)` units.
//!
//! - [`TokenBucket`]: one bucket.
//! - [`KeyedTokenBucket`]: one bucket per key, created on first use.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use limiter_core::{Limit, ManualClock};
//! use limiter_token_bucket::TokenBucket;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new();
//! let bucket = TokenBucket::with_clock(Limit::per_second(10)?.with_burst(3)?, clock.clone())?;
//!
//! for _ in 0..3 {
//!     assert!(bucket.check()?.is_allowed());
//! }
//! let denied = bucket.check()?;
//! assert!(denied.is_denied());
//! assert_eq!(denied.retry_after(), Duration::from_millis(100));
//!
//! clock.advance(Duration::from_millis(100));
//! assert!(bucket.check()?.is_allowed());
//! # Ok(()) }
//! ```
//!
//! Per key, with the real clock:
//!
//! ```
//! use limiter_core::Limit;
//! use limiter_token_bucket::KeyedTokenBucket;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let per_user = KeyedTokenBucket::<String>::new(Limit::per_minute(100)?)?;
//! let decision = per_user.check_key(&"alice".to_string())?;
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining(), 99);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

mod gcra;

pub use gcra::Gcra;
pub use limiter_core::{
    Clock, Decision, DecisionError, Limit, LimitError, Limiter, MIN_CLOCK_RANGE, ManualClock,
    MonotonicClock,
};

/// One token bucket: see [`DirectLimiter`](limiter_core::DirectLimiter) for its methods.
pub type TokenBucket<C = MonotonicClock> = limiter_core::DirectLimiter<Gcra, C>;

/// A token bucket per key: see [`KeyedLimiter`](limiter_store::KeyedLimiter) for its methods.
pub type KeyedTokenBucket<K, C = MonotonicClock, St = limiter_store::ShardedStore<K>> =
    limiter_store::KeyedLimiter<Gcra, K, C, St>;
