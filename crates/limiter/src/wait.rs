//! Waiting instead of refusing (feature `tokio`): `until_ready` on direct limiters,
//! `until_key_ready` on keyed ones and `until_request_ready` on stacks, for clients that
//! throttle themselves (a crawler, a batch job calling a rate-limited API).
//!
//! Each retries after the denial's exact `retry_after`, plus optional [`Jitter`], sleeping on
//! tokio's timer: it never busy-loops, and a cost that can never be admitted (above the burst)
//! is its error at once. Waiting is not a queue: callers racing for the same units are
//! admitted in no particular order. Built on the runtime-free
//! [`until_admitted`](limiter_core::wait::until_admitted).
//!
//! ```
//! use limiter::wait::{Jitter, UntilReady};
//! use limiter::{Limit, TokenBucket};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let bucket = TokenBucket::new(Limit::per_second(1_000))?;
//! for _ in 0..3 {
//!     bucket.until_ready().await?; // returns once the call is admitted
//! }
//! // Ten units at once, spread from other waiters by up to 5 ms.
//! bucket.until_n_ready(10, Jitter::up_to(std::time::Duration::from_millis(5))).await?;
//! # Ok(()) }
//! ```

use std::borrow::Borrow;
use std::future::Future;
use std::hash::Hash;

use limiter_core::wait::until_admitted;
pub use limiter_core::wait::{Admission, Jitter, MIN_WAIT};
use limiter_core::{Algorithm, Clock, Decision, DecisionError, DirectLimiter};
use limiter_stack::{CallError, Stack, StackDecision};
use limiter_store::{KeyedLimiter, Store};

/// Waiting on a direct limiter.
pub trait UntilReady {
    /// Waits until one unit is admitted, and takes it.
    fn until_ready(&self) -> impl Future<Output = Result<Decision, DecisionError>> + Send {
        self.until_n_ready(1, Jitter::none())
    }

    /// Waits until `cost` units are admitted at once (with `jitter` after each denial), and
    /// takes them; a cost above the burst is an error at once.
    fn until_n_ready(
        &self,
        cost: u64,
        jitter: Jitter,
    ) -> impl Future<Output = Result<Decision, DecisionError>> + Send;
}

impl<A, C> UntilReady for DirectLimiter<A, C>
where
    A: Algorithm,
    C: Clock,
{
    fn until_n_ready(
        &self,
        cost: u64,
        jitter: Jitter,
    ) -> impl Future<Output = Result<Decision, DecisionError>> + Send {
        until_admitted(move || self.check_n(cost), jitter, tokio::time::sleep)
    }
}

/// Waiting on a keyed limiter, by key (borrowed: `&str` for `String` keys).
pub trait UntilKeyReady<Q: ?Sized> {
    /// Waits until one unit is admitted for `key`, and takes it.
    fn until_key_ready(
        &self,
        key: &Q,
    ) -> impl Future<Output = Result<Decision, DecisionError>> + Send {
        self.until_key_n_ready(key, 1, Jitter::none())
    }

    /// Waits until `cost` units are admitted for `key` (with `jitter` after each denial), and
    /// takes them; a cost above the burst is an error at once.
    fn until_key_n_ready(
        &self,
        key: &Q,
        cost: u64,
        jitter: Jitter,
    ) -> impl Future<Output = Result<Decision, DecisionError>> + Send;
}

impl<A, K, C, St, Q> UntilKeyReady<Q> for KeyedLimiter<A, K, C, St>
where
    A: Algorithm,
    K: Hash + Eq + Borrow<Q> + Send + Sync,
    C: Clock,
    St: Store<K>,
    Q: Hash + Eq + ToOwned<Owned = K> + Sync + ?Sized,
{
    fn until_key_n_ready(
        &self,
        key: &Q,
        cost: u64,
        jitter: Jitter,
    ) -> impl Future<Output = Result<Decision, DecisionError>> + Send {
        until_admitted(
            move || self.check_key_n(key, cost),
            jitter,
            tokio::time::sleep,
        )
    }
}

/// Waiting on a stack, per request: admitted when every layer admits at once.
pub trait UntilRequestReady<R> {
    /// Waits until `request` is admitted for one unit by every layer, and takes it.
    fn until_request_ready(
        &self,
        request: &R,
    ) -> impl Future<Output = Result<StackDecision, CallError>> + Send {
        self.until_request_n_ready(request, 1, Jitter::none())
    }

    /// Waits until `cost` units are admitted for `request` by every layer (with `jitter` after
    /// each denial), and takes them; a call that can never be decided is an error at once.
    fn until_request_n_ready(
        &self,
        request: &R,
        cost: u64,
        jitter: Jitter,
    ) -> impl Future<Output = Result<StackDecision, CallError>> + Send;
}

impl<R, K, C> UntilRequestReady<R> for Stack<R, K, C>
where
    R: Sync,
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock,
{
    fn until_request_n_ready(
        &self,
        request: &R,
        cost: u64,
        jitter: Jitter,
    ) -> impl Future<Output = Result<StackDecision, CallError>> + Send {
        until_admitted(
            move || self.check_n(request, cost),
            jitter,
            tokio::time::sleep,
        )
    }
}
