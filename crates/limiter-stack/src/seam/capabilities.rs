//! What only some backends can do, each a trait of its own, so a caller asks for a capability
//! by type and a backend that lacks one is refused when the program is built, not by an error
//! at run time: [`Charges`] (records, unit refunds, decisions at a clock reading and takes that
//! can be undone: what a batch of several items needs), [`Refunds`] (a take's units given back
//! with a typed grant), [`OpenPlans`] (plans added while serving), [`HoldsKeys`] (keys held in
//! this process's memory) and [`HoldsLeases`] (a remote store's budget held here).
//!
//! A wrapper keeps a capability by implementing its trait over the wrapped limiter's.

use super::*;

/// A limiter that can be asked every [`Charge`] at a clock reading, and to take units so that
/// they can be undone: what [`decide_all`] needs of each item. A [`Stack`](crate::Stack), a
/// `RedisStack` and a `LeasedStack` (limiter-redis) have it; a direct or keyed limiter of the
/// core only decides, and is refused where a `Charges` is asked for:
///
/// ```compile_fail
/// use limiter_core::Limit;
/// use limiter_stack::Charges;
///
/// let direct = limiter_token_bucket::TokenBucket::new(Limit::per_second(2)).unwrap();
/// let _: &dyn Charges<()> = &direct; // a direct limiter only decides
/// ```
pub trait Charges<R: ?Sized>: AsyncLimiter<R> {
    /// Takes units, records usage that already happened, or gives units back, at a reading of
    /// the limiter's clock (`ask.at`; `None`: now; a remote store decides by its own clock and
    /// ignores it). In process, the answer is [`Decide::Now`]: no future, no allocation.
    fn ask<'a>(&'a self, request: &'a R, ask: Ask) -> Decide<'a>;

    /// Takes `cost` units for `request` at `at` (as [`ask`](Self::ask)) so that they can be
    /// given back: what [`decide_all`] needs of every take in a batch of several. A backend
    /// with [`Refunds`] answers with [`undo_with_grant`].
    fn take_undoable<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        at: Option<u64>,
    ) -> Decide<'a, Result<Taken<'a>, CallError>>
    where
        R: Sync;
}

/// What [`Refunds::take_with_grant`] answers: the outcome and, when units were taken, the
/// grant to refund them with; now in process, later for a remote store.
pub type Granted<'a, G> = Decide<'a, Result<(Outcome, Option<G>), CallError>>;

/// A backend whose takes can be given back with a grant: the capability, asked for by type
/// (a `Stack`, a `RedisStack`, a `LeasedStack`), with the backend's own grant type, so a grant
/// can only be refunded to its own kind of limiter (a grant of another stack of that kind is
/// refused by the stack).
///
/// ```
/// use limiter_core::{Limit, ManualClock};
/// use limiter_stack::{Kind, Layer, Outcome, Refunds, Stack};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let stack: Stack<&str, String, ManualClock> = Stack::builder()
///     .layer(Layer::keyed("user", |u: &&str| Some(u.to_string()))
///         .limit(Kind::TokenBucket, Limit::per_minute(3)))
///     .clock(ManualClock::new())
///     .build()?;
/// // Ann's call takes 2 units, then turns out cheap: they go back, with the grant.
/// let (_, grant) = at_once(stack.take_with_grant(&"ann", 2, None))?;
/// let after = at_once(Refunds::refund(&stack, &"ann", grant.expect("admitted")))?;
/// let Outcome::Decided { decision, .. } = after else { unreachable!() };
/// assert_eq!(decision.decision().remaining(), 3);
/// # Ok(()) }
/// # fn at_once<T>(f: impl std::future::Future<Output = T>) -> T {
/// #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
/// #     match std::pin::pin!(f).poll(&mut cx) { std::task::Poll::Ready(v) => v, _ => unreachable!() }
/// # }
/// ```
pub trait Refunds<R: ?Sized>: AsyncLimiter<R> {
    /// What an admitted take holds for a refund. Not `Clone`: nothing is given back twice.
    type Grant: Send + Sync + 'static;

    /// Takes `cost` units for `request` at `at` (`None`: now; a remote store decides by its
    /// own clock): the outcome and, when units were taken, the grant to refund them with.
    fn take_with_grant<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        at: Option<u64>,
    ) -> Granted<'a, Self::Grant>;

    /// Gives back what `grant` has left and answers what `request` holds after it. Never more
    /// than was taken, never above full; a store that fails answers its failure policy and
    /// keeps the units counted.
    fn refund<'a>(
        &'a self,
        request: &'a R,
        grant: Self::Grant,
    ) -> Pending<'a, Result<Outcome, CallError>>;
}

/// [`Charges::take_undoable`] for a backend with [`Refunds`]: its `take_with_grant`, the undo
/// refunding the grant, kept typed inside the closure.
pub fn undo_with_grant<'a, R: ?Sized + Sync, L: Refunds<R>>(
    limiter: &'a L,
    request: &'a R,
    cost: u64,
    at: Option<u64>,
) -> Decide<'a, Result<Taken<'a>, CallError>> {
    limiter
        .take_with_grant(request, cost, at)
        .map(move |acquired| {
            acquired.map(|(outcome, grant)| Taken {
                outcome,
                undo: grant
                    .map(|grant| -> Undo<'a> { Box::new(move || limiter.refund(request, grant)) }),
            })
        })
}

/// A limiter whose layers take more plans while serving (see
/// [`Stack::add_plan`](crate::Stack::add_plan)).
pub trait OpenPlans {
    /// Adds `plan` to layer `layer`, returning its index; refused when the layer is not open
    /// or is full.
    fn add_plan(&self, layer: usize, plan: Plan) -> Result<usize, BuildError>;
}

/// A limiter that holds its keys in this process's memory.
pub trait HoldsKeys {
    /// Keys held now.
    fn keys_held(&self) -> u64;
}

/// A limiter that holds part of a remote store's budget in this process (leases), to refund
/// before it is dropped.
pub trait HoldsLeases {
    /// Refunds every lease this process holds to the store, answering the units refunded.
    fn refund_leases(&self) -> Pending<'_, u64>;
}
