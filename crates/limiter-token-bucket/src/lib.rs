//! A lock-free, exact token bucket. Each bucket's whole state is one `u64`, updated by
//! compare-and-swap: no mutex, no background refill, and a denial writes nothing.
//!
//! A bucket holds at most `burst` tokens and refills `count` per `period`, continuously and
//! lazily: the refill is computed from the clock when a call arrives. Every limit from 1 to
//! `u32::MAX` per 1 µs to 366 days is accepted. Over any interval of length `T` the bucket admits
//! at most `burst + floor(T * count / period)` units. Refill is counted in integer ticks (see
//! [`Gcra`]): exactly, with no fractional credit lost or invented, for every limit whose ticks
//! leave years of clock range in one `u64` (all round limits); conservatively otherwise, short by
//! at most 1 unit in 10^5 for limits up to 10^6 per second, as the built bucket's
//! [`accuracy`](limiter_core::Algorithm::accuracy) states:
//!
//! ```
//! use limiter_core::{Algorithm, Limit};
//! use limiter_token_bucket::TokenBucket;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let exact = TokenBucket::new(Limit::per_minute(1000))?;
//! assert!(exact.algorithm().accuracy().is_exact());
//! let from_a_price_list = TokenBucket::new(Limit::per_minute(1009))?;
//! let accuracy = from_a_price_list.algorithm().accuracy();
//! assert!(accuracy.shortfall_per_billion() <= 1, "{accuracy}");
//! # Ok(()) }
//! ```
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
//! let bucket = TokenBucket::with_clock(Limit::per_second(10).with_burst(3), clock.clone())?;
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
//! let per_user = KeyedTokenBucket::<String>::new(Limit::per_minute(100))?;
//! let decision = per_user.check_key("alice")?;
//! assert!(decision.is_allowed());
//! assert_eq!(decision.remaining(), 99);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

mod gcra;
mod reciprocal;

pub use gcra::Gcra;
pub use limiter_core::{
    Clock, Decision, DecisionError, DefaultClock, Limit, LimitError, Limiter, MIN_CLOCK_RANGE,
    ManualClock, MonotonicClock,
};

/// One token bucket: see [`DirectLimiter`](limiter_core::DirectLimiter) for its methods.
pub type TokenBucket<C = DefaultClock> = limiter_core::DirectLimiter<Gcra, C>;

/// A token bucket per key: see [`KeyedLimiter`](limiter_store::KeyedLimiter) for its methods.
pub type KeyedTokenBucket<K, C = DefaultClock, St = limiter_store::ShardedStore<K>> =
    limiter_store::KeyedLimiter<Gcra, K, C, St>;
