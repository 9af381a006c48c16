//! Per-key state for any [`Algorithm`](limiter_core::Algorithm): one lock-free state word per
//! key, created on the first call that writes, and forgotten once it is full again, so memory
//! stays bounded without a background thread.
//!
//! - [`KeyedLimiter`] pairs an algorithm and a clock with a [`Store`].
//! - [`ShardedStore`], the default: unbounded, sharded, inline entries (about 36 bytes per `u64`
//!   key at a million keys), dropping full keys whenever a shard would otherwise grow.
//! - [`BoundedStore`] (feature `bounded`, on by default): at most `max_keys` keys on moka (least recently used evicted first),
//!   dropping full keys as new ones arrive; an eviction of a key that is not full resets it and
//!   is counted in [`StoreStats::evicted`].
//!
//! - [`table::ShardedTable`]: the sharded, self-reclaiming table under `ShardedStore`, for
//!   other per-key structures (a stack's entries).
//!
//! A key whose state is full decides exactly like a key never seen, so dropping it changes no
//! decision; calls that write nothing (denials and peeks) never insert a key, so a flood of
//! denied new keys costs no memory.
//!
//! # Example
//!
//! ```
//! use limiter_core::{Limit, ManualClock};
//! use limiter_store::{BoundedStore, KeyedLimiter};
//! use limiter_token_bucket::Gcra;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new();
//! let per_ip = KeyedLimiter::<Gcra, &str, _>::with_clock(Limit::per_second(2), clock.clone())?;
//! assert!(per_ip.check_key(&"10.0.0.1")?.is_allowed());
//! assert!(per_ip.check_key(&"10.0.0.1")?.is_allowed());
//! assert!(per_ip.check_key(&"10.0.0.1")?.is_denied());
//! assert!(per_ip.check_key(&"10.0.0.2")?.is_allowed()); // keys are isolated
//!
//! clock.advance(std::time::Duration::from_secs(1));
//! assert_eq!(per_ip.reclaim_full(), 2); // both full again: forgetting them changes nothing
//! assert!(per_ip.is_empty());
//!
//! // At most 100,000 keys, whatever the traffic.
//! let bounded = KeyedLimiter::<Gcra, u64, _, _>::with_store(
//!     Limit::per_second(2),
//!     clock.clone(),
//!     BoundedStore::new(100_000)?,
//! )?;
//! assert!(bounded.check_key(&7)?.is_allowed());
//! assert_eq!(bounded.stats().keys, 1);
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

#[cfg(feature = "bounded")]
mod bounded;
mod keyed;
mod sharded;
mod store;
mod sync;
pub mod table;

#[cfg(feature = "bounded")]
pub use bounded::{BoundedStore, StoreError};
pub use keyed::KeyedLimiter;
pub use sharded::ShardedStore;
pub use store::{Store, StoreStats};
pub use table::DefaultHasher;
