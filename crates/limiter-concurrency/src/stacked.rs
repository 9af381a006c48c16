//! [`PermitStack`]: a stack of rate limits and a concurrency limit decided as one, all or
//! nothing. A call is admitted only if a permit is free and every rate layer admits it; a call
//! refused for want of a permit takes no rate units, and a call a rate layer denies takes no
//! permit. The admitted call's answer hands back the permit.

use std::fmt;
use std::hash::{BuildHasher, Hash};

use limiter_core::{Clock, DefaultClock, LimitError};
use limiter_stack::{CallError, Stack, StackDecision};
use limiter_store::DefaultHasher;

use crate::keyed::{KeyedConcurrency, Permit, Refused};

/// Rate layers (a [`Stack`]) and at most `count` permits per key, decided together.
///
/// The permit is taken first (the cheaper check, and the one expensive endpoints hit), then the
/// stack decides; a denial releases the permit at once. Between the two a racing call may find
/// that permit held and be refused a moment early; none is ever admitted past either limit.
///
/// ```
/// use limiter_concurrency::{Admission, PermitStack};
/// use limiter_core::{Limit, ManualClock};
/// use limiter_stack::{Kind, Layer, Stack};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Per customer: 5 exports a minute, at most 1 running.
/// let rates: Stack<&str, String, ManualClock> = Stack::builder()
///     .layer(Layer::keyed("customer", |c: &&str| Some(c.to_string()))
///         .limit(Kind::TokenBucket, Limit::per_minute(5)))
///     .clock(ManualClock::new())
///     .build()?;
/// let exports = PermitStack::new(rates, 1, |c: &&str| Some(c.to_string()))?;
/// let Admission::Admitted { permit, .. } = exports.check(&"acme")? else { unreachable!() };
/// // A second export while the first runs: refused, and it took none of the 5 a minute.
/// assert!(matches!(exports.check(&"acme")?, Admission::Busy(_)));
/// drop(permit); // the first export ended
/// let Admission::Admitted { decision, .. } = exports.check(&"acme")? else { unreachable!() };
/// assert_eq!(decision.decision().remaining(), 3);
/// # Ok(()) }
/// ```
pub struct PermitStack<R, K, PK, C = DefaultClock, S = DefaultHasher> {
    stack: Stack<R, K, C>,
    permits: KeyedConcurrency<PK, S>,
    permit_key: PermitKey<R, PK>,
}

/// What takes a request's permit key.
type PermitKey<R, PK> = Box<dyn Fn(&R) -> Option<PK> + Send + Sync>;

impl<R, K, PK, C, S> fmt::Debug for PermitStack<R, K, PK, C, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PermitStack")
            .field("permits", &self.permits)
            .finish_non_exhaustive()
    }
}

/// What a [`PermitStack`] answered.
#[derive(Debug)]
pub enum Admission<'a, PK, S = DefaultHasher>
where
    PK: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync,
{
    /// Admitted: the rate layers took their units, and the call holds `permit` (`None` when
    /// the request has no permit key, so the concurrency limit does not apply) until it is
    /// dropped or released.
    Admitted {
        /// The rate layers' answer.
        decision: StackDecision,
        /// The call's permit.
        permit: Option<Permit<'a, PK, S>>,
    },
    /// A rate layer denied the call: nothing was taken, no permit held.
    Denied(StackDecision),
    /// Every permit of the request's key is held: the rate layers were not asked, nothing
    /// was taken.
    Busy(Refused),
}

impl<R, K, PK, C> PermitStack<R, K, PK, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
    PK: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// `stack`'s rate layers and at most `count` permits per key taken by `permit_key` (a
    /// request it answers `None` for takes no permit).
    pub fn new(
        stack: Stack<R, K, C>,
        count: u64,
        permit_key: impl Fn(&R) -> Option<PK> + Send + Sync + 'static,
    ) -> Result<Self, LimitError> {
        Ok(Self::with_permits(
            stack,
            KeyedConcurrency::new(count)?,
            permit_key,
        ))
    }
}

impl<R, K, PK, C, S> PermitStack<R, K, PK, C, S>
where
    K: Hash + Eq + Clone,
    C: Clock,
    PK: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync,
{
    /// `stack`'s rate layers and `permits` (their count, store and hasher chosen: SipHash for
    /// keys an adversary picks), taken by `permit_key`.
    pub fn with_permits(
        stack: Stack<R, K, C>,
        permits: KeyedConcurrency<PK, S>,
        permit_key: impl Fn(&R) -> Option<PK> + Send + Sync + 'static,
    ) -> Self {
        Self {
            stack,
            permits,
            permit_key: Box::new(permit_key),
        }
    }

    /// Decides one unit of every rate layer and a permit for `request`.
    pub fn check(&self, request: &R) -> Result<Admission<'_, PK, S>, CallError> {
        self.check_n(request, 1)
    }

    /// Decides `cost` units of every rate layer and a permit for `request`, all or nothing. An
    /// error (a cost no layer can ever admit) takes nothing either.
    pub fn check_n(&self, request: &R, cost: u64) -> Result<Admission<'_, PK, S>, CallError> {
        let permit = match (self.permit_key)(request) {
            None => None,
            Some(key) => match self.permits.try_acquire(&key) {
                Ok(permit) => Some(permit),
                Err(refused) => return Ok(Admission::Busy(refused)),
            },
        };
        // On an error or a denial the permit is dropped here: released.
        let decision = self.stack.check_n(request, cost)?;
        Ok(if decision.is_allowed() {
            Admission::Admitted { decision, permit }
        } else {
            Admission::Denied(decision)
        })
    }

    /// The rate layers.
    pub fn stack(&self) -> &Stack<R, K, C> {
        &self.stack
    }

    /// The permits.
    pub fn permits(&self) -> &KeyedConcurrency<PK, S> {
        &self.permits
    }
}
