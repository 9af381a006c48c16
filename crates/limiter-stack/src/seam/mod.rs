//! [`AsyncLimiter`]: the one seam adapters decide through. The tower middleware and limiterd
//! take it; an in-process [`Stack`](crate::Stack), a `RedisStack` (limiter-redis), any direct limiter of the
//! core ([`Limiter`](limiter_core::Limiter) with `Key = ()`) and a keyed one with its keyer ([`KeyedBy`]) implement
//! it, so one code path serves them all.
//!
//! It is the asynchronous counterpart of the core's [`Limiter`](limiter_core::Limiter): a remote backend can fail, so
//! an answer is an [`Outcome`] (decided, or failed open or closed by the backend's policy),
//! and it may have to wait. An in-process limiter answers [`Decide::Now`], with no future and
//! no allocation, so an adapter can take its fast path synchronously.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use limiter_core::Limit;

use crate::{BuildError, CallError, Keyer, LayerAnswers, Plan, StackDecision};

mod batch;
mod capabilities;
mod impls;

pub use batch::{Ask, BatchAnswer, BatchItem, Charge, Taken, Undo, decide_all};
pub use capabilities::{
    Charges, Granted, HoldsKeys, HoldsLeases, OpenPlans, Refunds, undo_with_grant,
};
pub use impls::{DEFAULT_LAYER_NAME, KeyedBy};

/// A boxed future of the seam's wider calls (the hot single decision is [`Decide`], with no
/// box when in process).
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Why a backend could not decide, as its failure policy reports it.
pub type Failure = Arc<dyn Error + Send + Sync>;

/// Who decided a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
// A whole word: beside the words of an answer a byte would leave seven of padding, which every
// move of the answer copies in overlapping pieces (loads the preceding stores cannot forward).
#[repr(u64)]
pub enum Origin {
    /// This process's memory.
    InProcess,
    /// The remote store (Redis).
    Remote,
    /// A cache of the remote store's recent denials.
    DenyCache,
    /// The local fallback while the remote store is out.
    Fallback,
    /// A lease of the remote store's budget, spent in this process.
    Lease,
}

/// What a limiter answered for one call.
#[derive(Clone, Debug)]
// An outcome is made and consumed once per call; boxing the decision would cost an allocation
// per call to save a copy.
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    /// The limits decided: allowed iff the decision is.
    Decided {
        /// Every layer's answer.
        decision: StackDecision,
        /// Who decided.
        origin: Origin,
        /// When a remote store decided it, in microseconds since the Unix epoch by the store's
        /// clock (so every node of a fleet reads the same instant); `None` when this process
        /// decided it, at its clock's reading.
        at_unix_us: Option<u64>,
        /// Why the remote store did not decide: the failure a fallback answered for (with
        /// [`Origin::Fallback`], so a caller can log what sent the call there: an outage, or a
        /// key holding what no limiter wrote, named in it); `None` for every other origin.
        failure: Option<Failure>,
    },
    /// The backend failed and its policy is to admit: nothing was counted.
    FailedOpen(Failure),
    /// The backend failed and its policy is to refuse. Not "over the limit": an HTTP adapter
    /// answers 503, never 429.
    FailedClosed(Failure),
}

impl Outcome {
    /// Decided in this process.
    pub fn in_process(decision: StackDecision) -> Self {
        Self::Decided {
            decision,
            origin: Origin::InProcess,
            at_unix_us: None,
            failure: None,
        }
    }
}

/// The future of a decision (or, with another `T`, of a take that can be undone or a grant):
/// ready at once for an in-process limiter, with no future and no allocation; boxed for a
/// remote one.
#[must_use = "a decision does nothing until it is awaited or matched"]
// The in-process answer is the hot path: boxing it would cost an allocation per call.
#[allow(clippy::large_enum_variant)]
pub enum Decide<'a, T = Result<Outcome, CallError>> {
    /// Decided already.
    Now(T),
    /// Decided when awaited. Such a future does nothing until it is first polled (as an `async
    /// fn`'s never does), so an adapter may drop it unpolled and ask again from a future that
    /// owns the request.
    Later(Pin<Box<dyn Future<Output = T> + Send + 'a>>),
}

impl<'a, T: Send + 'a> Decide<'a, T> {
    /// The answer turned by `f`, now or when awaited.
    pub fn map<U>(self, f: impl FnOnce(T) -> U + Send + 'a) -> Decide<'a, U> {
        match self {
            Self::Now(answer) => Decide::Now(f(answer)),
            Self::Later(future) => Decide::Later(Box::pin(async move { f(future.await) })),
        }
    }
}

impl<T: fmt::Debug> fmt::Debug for Decide<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Now(answer) => f.debug_tuple("Now").field(answer).finish(),
            Self::Later(_) => f.write_str("Later(..)"),
        }
    }
}

impl<T: Unpin> Future for Decide<'_, Result<T, CallError>> {
    type Output = Result<T, CallError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Self::Now(answer) => Poll::Ready(std::mem::replace(
                answer,
                Err(CallError::PolledAfterCompletion),
            )),
            Self::Later(future) => future.as_mut().poll(cx),
        }
    }
}

/// One layer as adapters describe it (the middleware's `RateLimit-Policy` header, limiterd's
/// configuration view): its name, the request key it reads, and per plan its limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerInfo {
    /// The layer's name.
    pub name: String,
    /// The name of the request key the layer reads (its keyer's
    /// [`key_name`](Keyer::key_name)), checked by adapters that extract named keys; `None`
    /// for global layers and closures.
    pub key: Option<&'static str>,
    /// Per plan (in plan order), the plan's limits (in limit order).
    pub plans: Vec<Vec<Limit>>,
}

/// A limiter an adapter can ask, in process or remote: decides `cost` units for a request of
/// type `R`, all or nothing across its layers, and describes its layers once.
///
/// # Example
///
/// One function serves a stack, a direct limiter and (with limiter-redis) a Redis stack:
///
/// ```
/// use limiter_core::Limit;
/// use limiter_stack::{AsyncLimiter, Decide, Kind, Layer, Outcome, Stack};
/// use limiter_token_bucket::TokenBucket;
///
/// fn admits<R>(limiter: &impl AsyncLimiter<R>, request: &R) -> bool {
///     match limiter.decide_request(request, 1) {
///         Decide::Now(Ok(Outcome::Decided { decision, .. })) => decision.is_allowed(),
///         Decide::Now(Ok(Outcome::FailedOpen(_))) => true,
///         _ => false, // failed closed, an error, or a remote answer to await
///     }
/// }
///
/// let stack: Stack<&str, String> = Stack::builder()
///     .layer(Layer::keyed("per-user", |u: &&str| Some(u.to_string()))
///         .limit(Kind::TokenBucket, Limit::per_second(1)))
///     .build()?;
/// assert!(admits(&stack, &"ann"));
/// assert!(!admits(&stack, &"ann"));
///
/// let direct = TokenBucket::new(Limit::per_second(1))?;
/// assert!(admits(&direct, &"anything"));
/// assert!(!admits(&direct, &"anything"));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait AsyncLimiter<R: ?Sized>: Send + Sync {
    /// Decides `cost` units for `request`; cost 0 only reports. A denial changes nothing.
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a>;

    /// Decides as [`decide_request`](Self::decide_request) does and keeps each layer's own
    /// answer in `each` (cleared first), for a per-layer report (the IETF `RateLimit` header).
    /// The compact answer alone is cheaper: ask for this only where every layer is read. The
    /// default keeps the binding layer's answer alone (exact for a one-layer limiter); a
    /// [`Stack`](crate::Stack) and a Redis stack keep every layer's.
    fn decide_request_each<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        each: &'a mut LayerAnswers,
    ) -> Decide<'a> {
        each.clear();
        match self.decide_request(request, cost) {
            Decide::Now(answer) => {
                keep_binding(&answer, each);
                Decide::Now(answer)
            }
            Decide::Later(future) => Decide::Later(Box::pin(async move {
                let answer = future.await;
                keep_binding(&answer, each);
                answer
            })),
        }
    }

    /// Every layer in order, as a [`LayerDecision`](crate::LayerDecision) refers to them (by
    /// layer, plan and limit index).
    fn layers(&self) -> Vec<LayerInfo>;
}

/// Keeps the binding layer's answer of a decided `answer` in `each`.
fn keep_binding(answer: &Result<Outcome, CallError>, each: &mut LayerAnswers) {
    if let Ok(Outcome::Decided { decision, .. }) = answer
        && let Some(binding) = decision.binding()
    {
        each.set(*binding);
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::task::Waker;

    use limiter_core::{DecisionError, ManualClock};
    use limiter_token_bucket::{KeyedTokenBucket, TokenBucket};

    use super::*;

    fn now<R>(
        limiter: &impl AsyncLimiter<R>,
        request: &R,
        cost: u64,
    ) -> Result<Outcome, CallError> {
        match limiter.decide_request(request, cost) {
            Decide::Now(answer) => answer,
            Decide::Later(_) => panic!("an in-process limiter answers now"),
        }
    }

    fn allowed(outcome: &Result<Outcome, CallError>) -> Option<bool> {
        match outcome {
            Ok(Outcome::Decided {
                decision, origin, ..
            }) => {
                assert_eq!(*origin, Origin::InProcess);
                Some(decision.is_allowed())
            }
            _ => None,
        }
    }

    #[test]
    fn a_direct_limiter_is_a_one_layer_stack_and_names_its_errors() {
        let direct = TokenBucket::with_clock(Limit::per_second(2), ManualClock::new()).unwrap();
        assert_eq!(allowed(&now(&direct, &(), 2)), Some(true));
        assert_eq!(allowed(&now(&direct, &(), 1)), Some(false));
        let layers = AsyncLimiter::<()>::layers(&direct);
        assert_eq!(layers.len(), 1);
        assert_eq!(layers[0].name, DEFAULT_LAYER_NAME);
        assert_eq!(layers[0].plans, vec![vec![Limit::per_second(2)]]);
        assert_eq!(
            now(&direct, &(), 3).unwrap_err(),
            CallError::Decision {
                layer: DEFAULT_LAYER_NAME.to_owned(),
                limit_index: 0,
                source: DecisionError::CostExceedsBurst { cost: 3, burst: 2 },
            }
        );
    }

    #[test]
    fn a_keyed_limiter_counts_per_key_and_skips_requests_without_one() {
        let keyed = KeyedBy::new(
            "per-user",
            KeyedTokenBucket::<String, ManualClock>::with_clock(
                Limit::per_minute(1),
                ManualClock::new(),
            )
            .unwrap(),
            |user: &Option<&str>| user.map(str::to_owned),
        );
        assert_eq!(allowed(&now(&keyed, &Some("ann"), 1)), Some(true));
        assert_eq!(allowed(&now(&keyed, &Some("ann"), 1)), Some(false));
        assert_eq!(allowed(&now(&keyed, &Some("bob"), 1)), Some(true));
        // No key: no layer applied, nothing counted, admitted.
        let Ok(Outcome::Decided { decision, .. }) = now(&keyed, &None, 1) else {
            panic!("decided");
        };
        assert!(decision.is_allowed() && decision.binding().is_none());
        assert_eq!(
            AsyncLimiter::<Option<&str>>::layers(&keyed)[0].name,
            "per-user"
        );
    }

    /// A wrapper that only decides, as a decorator might: the seam's default keeps the binding
    /// layer's answer.
    struct OnlyDecides<L>(L);

    impl<R, L: AsyncLimiter<R>> AsyncLimiter<R> for OnlyDecides<L> {
        fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
            self.0.decide_request(request, cost)
        }

        fn layers(&self) -> Vec<LayerInfo> {
            self.0.layers()
        }
    }

    #[test]
    fn each_layers_answer_is_kept_by_a_stack_and_the_binding_ones_by_the_default() {
        use crate::{Kind, Layer, Stack};
        let stack: Stack<u64, u64, ManualClock> = Stack::builder()
            .layer(
                Layer::keyed("user", |u: &u64| Some(*u))
                    .limit(Kind::TokenBucket, Limit::per_second(5)),
            )
            .layer(Layer::global("all").limit(Kind::TokenBucket, Limit::per_second(100)))
            .clock(ManualClock::new())
            .build()
            .unwrap();
        let mut each = LayerAnswers::new();
        let Decide::Now(Ok(Outcome::Decided { decision, .. })) =
            stack.decide_request_each(&1, 1, &mut each)
        else {
            panic!("decided now");
        };
        let left: Vec<u64> = each.iter().map(|l| l.decision.remaining()).collect();
        assert_eq!(left, [4, 99]);
        assert_eq!(each.summary(), decision);
        let wrapped = OnlyDecides(stack);
        let Decide::Now(Ok(Outcome::Decided { decision, .. })) =
            wrapped.decide_request_each(&1, 1, &mut each)
        else {
            panic!("decided now");
        };
        assert_eq!(
            each.iter().collect::<Vec<_>>(),
            [decision.binding().unwrap()]
        );
        assert_eq!(decision.decision().remaining(), 3);
    }

    #[test]
    fn an_answer_polled_again_is_an_error_not_a_second_decision() {
        let direct = TokenBucket::with_clock(Limit::per_second(1), ManualClock::new()).unwrap();
        let mut future = pin!(direct.decide_request(&(), 1));
        let mut cx = Context::from_waker(Waker::noop());
        assert!(matches!(
            future.as_mut().poll(&mut cx),
            Poll::Ready(Ok(Outcome::Decided { .. }))
        ));
        assert!(matches!(
            future.as_mut().poll(&mut cx),
            Poll::Ready(Err(CallError::PolledAfterCompletion))
        ));
    }
}
