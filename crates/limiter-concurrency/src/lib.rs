//! Concurrency limits: at most `count` requests in flight per key (a customer's exports, its
//! LLM calls), where a rate limit says how many per period. A permit is taken before the work
//! and released when its guard is dropped (the work ended, failed or was cancelled), or
//! explicitly.
//!
//! [`KeyedConcurrency`] keeps each key's permits in one word of the workspace's
//! [`ShardedStore`](limiter_store::ShardedStore), updated by compare-and-swap; the word's
//! transitions are [`PermitCount`] (an [`Algorithm`](limiter_core::Algorithm), so the store's
//! reclamation, proven for every algorithm, forgets a key once it holds none, here after a
//! grace of about a second so a key whose permits come and go is not inserted again at every
//! sweep) and [`Releasing`]. A [`PermitStack`] decides a stack of rate limits and a concurrency limit as
//! one, all or nothing.
//!
//! ```
//! use limiter_concurrency::KeyedConcurrency;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let reports = KeyedConcurrency::<String>::new(1)?;
//! let running = reports.try_acquire("acme")?;
//! assert!(reports.try_acquire("acme").is_err()); // one report at a time per customer
//! drop(running);
//! assert!(reports.try_acquire("acme").is_ok());
//! # Ok(()) }
//! ```
//!
//! Guarantees, each checked: the permits a key holds never exceed `count`, whatever the
//! threads (`tests/integration/stress.rs`, and `tests/loom.rs` for acquires and releases racing each other
//! and the store's reclamation); a release gives back exactly what its permit took, once
//! (`tests/integration/model.rs`, against a reference model).
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

mod keyed;
mod permits;
mod stacked;
mod sync;

pub use keyed::{Held, KeyedConcurrency, OwnedPermit, Permit, Refused};
pub use permits::{MAX_PERMITS, PermitCount, Releasing};
pub use stacked::{Admission, PermitStack};
