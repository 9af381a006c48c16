//! Per-key state for any [`Algorithm`](limiter_core::Algorithm): one lock-free state word per
//! key, created on first use.
//!
//! [`KeyedLimiter`] keeps its keys in a sharded concurrent map. A key whose state is full decides
//! exactly like a key never seen, so [`KeyedLimiter::reclaim_full`] can drop such keys without
//! changing any decision, and calls that write nothing (denials and peeks) never insert a key.
//!
//! # Example
//!
//! ```
//! use limiter_core::{Limit, ManualClock};
//! use limiter_store::KeyedLimiter;
//! use limiter_token_bucket::Gcra;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new();
//! let per_ip = KeyedLimiter::<Gcra, &str, _>::with_clock(Limit::per_second(2)?, clock.clone())?;
//! assert!(per_ip.check_key(&"10.0.0.1")?.is_allowed());
//! assert!(per_ip.check_key(&"10.0.0.1")?.is_allowed());
//! assert!(per_ip.check_key(&"10.0.0.1")?.is_denied());
//! assert!(per_ip.check_key(&"10.0.0.2")?.is_allowed()); // keys are isolated
//!
//! clock.advance(std::time::Duration::from_secs(1));
//! assert_eq!(per_ip.reclaim_full(), 2); // both full again: forgetting them changes nothing
//! assert!(per_ip.is_empty());
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

mod keyed;

pub use keyed::KeyedLimiter;
