//! Limiters composed transactionally: "10 per second and 100 per minute per customer, 50 reads
//! or 10 writes per second by plan, and a global cap", answered by one call that is all or
//! nothing.
//!
//! A [`Stack`] is a list of [`Layer`]s. Each layer derives a key from the request (per user,
//! per IP, per API key) or is global, and enforces one or more limits on it, of any algorithm.
//! One call decides every layer at one `now`:
//!
//! - it is admitted only if every limit of every layer admits, and a denied call changes no
//!   layer (it writes nothing at all, and inserts no key);
//! - concurrent calls never push any limit past what it admits alone, in whatever order layers
//!   are listed and however often one key appears;
//! - a layer with several [`Plan`]s picks one per request (by customer tier, HTTP method or
//!   route); when a key's plan changes, its consumption carries over as the same fraction of
//!   the new limits, rounded up;
//! - layers on one key ([`Layer::same_key`]) keep their state in one entry, found by one
//!   lookup and written under one lock;
//! - the [`StackDecision`] names the layer that bound the answer and has each layer's own;
//! - an admitted call's [`Grant`] can be refunded, never beyond what was taken, never above full.
//!
//! # Example
//!
//! ```
//! use limiter_core::{Limit, ManualClock};
//! use limiter_stack::{Kind, LayerAnswers, Layer, Plan, Stack};
//!
//! struct Request { customer: u64, pro: bool, write: bool }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new();
//! let stack = Stack::builder()
//!     .layer(
//!         Layer::keyed("per-customer", |r: &Request| Some(r.customer))
//!             .limit(Kind::TokenBucket, Limit::per_second(10))
//!             .limit(Kind::SlidingWindow, Limit::per_minute(100)),
//!     )
//!     .layer(
//!         // Writes are limited by plan; reads skip this layer.
//!         Layer::keyed("writes", |r: &Request| r.write.then_some(r.customer)).plans(
//!             [
//!                 Plan::new("free").limit(Kind::TokenBucket, Limit::per_second(2)),
//!                 Plan::new("pro").limit(Kind::TokenBucket, Limit::per_second(20)),
//!             ],
//!             |r: &Request| usize::from(r.pro),
//!         ),
//!     )
//!     .layer(Layer::global("global").limit(Kind::TokenBucket, Limit::per_second(1_000)))
//!     .clock(clock.clone())
//!     .build()?;
//!
//! let write = Request { customer: 7, pro: false, write: true };
//! assert!(stack.check(&write)?.is_allowed());
//! assert!(stack.check(&write)?.is_allowed());
//! let denied = stack.check(&write)?;
//! assert!(denied.is_denied());
//! let binding = denied.binding().expect("a layer applied");
//! assert_eq!(stack.layer_name(binding.layer), Some("writes"));
//! assert_eq!(denied.decision().retry_after().as_millis(), 500);
//!
//! // The denial changed nothing: the customer's own layer still has 8 of 10.
//! let read = Request { customer: 7, pro: false, write: false };
//! let mut each = LayerAnswers::new(); // every layer's answer, kept when asked for
//! stack.check_each(&read, 0, &mut each)?; // cost 0: a peek
//! assert_eq!(each.get(0).map(|l| l.decision.remaining()), Some(8));
//! # Ok(()) }
//! ```
//!
//! # Guarantees under concurrency
//!
//! Admissions are serialisable: every admitted call locks the entries it writes, in one global
//! order, after checking them again; in a stack with a global layer, it takes that layer's
//! lock alone, which every writing call of the stack takes (one locked instruction per
//! commit, where calls were serialised on the global entry already). A denial takes no lock: it reads each layer once, and is
//! denied only if some limit, at the instant it was read, held a committed state that denies
//! the call; the details of a denial (the other layers' `remaining`) may come from states a few
//! nanoseconds apart. See `stack/locks.rs` for the protocol and `tests/loom.rs` for its models.
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

mod algorithms;
mod cells;
mod decision;
mod error;
mod keyer;
mod kind;
mod layer;
mod lease;
mod seam;
mod stack;
mod sync;

pub use cells::MAX_LIMITS_PER_LAYER;
pub use decision::{Grant, LayerAnswers, LayerDecision, MAX_LAYERS, StackDecision};
pub use error::{BuildError, CallError, RefundError};
pub use keyer::Keyer;
pub use kind::{Kind, UnknownKind};
pub use layer::{Layer, LayerParts, Plan, PlanChooser, PlanParts};
pub use lease::{DEFAULT_LEASE_TTL, LEASE_TTL_RANGE, Lease, Slack};
pub use seam::{
    Ask, AsyncLimiter, BatchAnswer, BatchItem, Charge, Charges, DEFAULT_LAYER_NAME, Decide,
    Failure, Granted, HoldsKeys, HoldsLeases, KeyedBy, LayerInfo, OpenPlans, Origin, Outcome,
    Pending, Refunds, Taken, Undo, decide_all, undo_with_grant,
};
pub use stack::{Stack, StackBuilder};
