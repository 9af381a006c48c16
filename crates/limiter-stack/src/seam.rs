//! [`AsyncLimiter`]: the one seam adapters decide through. The tower middleware and limiterd
//! take it; an in-process [`Stack`], a `RedisStack` (limiter-redis), any direct limiter of the
//! core ([`Limiter`] with `Key = ()`) and a keyed one with its keyer ([`KeyedBy`]) implement
//! it, so one code path serves them all.
//!
//! It is the asynchronous counterpart of the core's [`Limiter`]: a remote backend can fail, so
//! an answer is an [`Outcome`] (decided, or failed open or closed by the backend's policy),
//! and it may have to wait. An in-process limiter answers [`Decide::Now`], with no future and
//! no allocation, so an adapter can take its fast path synchronously.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use limiter_core::{Clock, Limit, Limiter};

use crate::{CallError, Keyer, LayerDecision, Stack, StackDecision};

/// Why a backend could not decide, as its failure policy reports it.
pub type Failure = Arc<dyn Error + Send + Sync>;

/// Who decided a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
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
        }
    }
}

/// The future of a decision: ready at once for an in-process limiter, boxed for a remote one.
#[must_use = "a decision does nothing until it is awaited or matched"]
// The in-process answer is the hot path: boxing it would cost an allocation per call.
#[allow(clippy::large_enum_variant)]
pub enum Decide<'a> {
    /// Decided already.
    Now(Result<Outcome, CallError>),
    /// Decided when awaited. Such a future does nothing until it is first polled (as an `async
    /// fn`'s never does), so an adapter may drop it unpolled and ask again from a future that
    /// owns the request.
    Later(Pin<Box<dyn Future<Output = Result<Outcome, CallError>> + Send + 'a>>),
}

impl fmt::Debug for Decide<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Now(answer) => f.debug_tuple("Now").field(answer).finish(),
            Self::Later(_) => f.write_str("Later(..)"),
        }
    }
}

impl Future for Decide<'_> {
    type Output = Result<Outcome, CallError>;

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

    /// Every layer in order, as a [`LayerDecision`] refers to them (by layer, plan and limit
    /// index).
    fn layers(&self) -> Vec<LayerInfo>;
}

impl<R, K, C> AsyncLimiter<R> for Stack<R, K, C>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + Send + Sync,
    Self: Send + Sync,
{
    #[inline]
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
        // Built in place: the decision is hundreds of bytes, and each move would copy it.
        let mut answer = Decide::Now(Ok(Outcome::in_process(StackDecision::from_layers([]))));
        if let Decide::Now(Ok(Outcome::Decided { decision, .. })) = &mut answer
            && let Err(e) = self.check_into(request, cost, decision)
        {
            answer = Decide::Now(Err(e));
        }
        answer
    }

    fn layers(&self) -> Vec<LayerInfo> {
        Stack::layers(self)
            .iter()
            .map(|layer| LayerInfo {
                name: layer.name().to_owned(),
                key: layer.key_name(),
                plans: layer
                    .all_plans()
                    .map(|plan| plan.limits().copied().collect())
                    .collect(),
            })
            .collect()
    }
}

/// The name a direct or keyed limiter's one layer reports when it was given none.
pub const DEFAULT_LAYER_NAME: &str = "limit";

fn one_layer(limit: &Limit, name: &str, key: Option<&'static str>) -> Vec<LayerInfo> {
    vec![LayerInfo {
        name: name.to_owned(),
        key,
        plans: vec![vec![*limit]],
    }]
}

fn as_layer(
    name: &str,
    decided: Result<limiter_core::Decision, limiter_core::DecisionError>,
) -> Result<Outcome, CallError> {
    match decided {
        Ok(decision) => Ok(Outcome::in_process(StackDecision::from_layers(
            LayerDecision::from_limits(0, 0, &[decision]),
        ))),
        Err(source) => Err(CallError::Decision {
            layer: name.to_owned(),
            limit_index: 0,
            source,
        }),
    }
}

/// A direct limiter (one state for every call) decides any request as a one-layer stack named
/// [`DEFAULT_LAYER_NAME`].
impl<R: ?Sized, L: Limiter<Key = ()>> AsyncLimiter<R> for L {
    #[inline]
    fn decide_request<'a>(&'a self, _: &'a R, cost: u64) -> Decide<'a> {
        Decide::Now(as_layer(
            DEFAULT_LAYER_NAME,
            Limiter::decide(self, &(), cost),
        ))
    }

    fn layers(&self) -> Vec<LayerInfo> {
        one_layer(self.limit(), DEFAULT_LAYER_NAME, None)
    }
}

/// A keyed limiter and the keyer that names a request's key: a one-layer stack to adapters. A
/// request the keyer returns `None` for is admitted with nothing counted (no layer applied).
#[derive(Clone, Debug)]
pub struct KeyedBy<L, F> {
    name: String,
    limiter: L,
    keyer: F,
}

impl<L, F> KeyedBy<L, F> {
    /// `limiter`, keyed by `keyer`, reported as a layer named `name`.
    pub fn new(name: impl Into<String>, limiter: L, keyer: F) -> Self {
        Self {
            name: name.into(),
            limiter,
            keyer,
        }
    }

    /// The keyed limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<R, L, F> AsyncLimiter<R> for KeyedBy<L, F>
where
    L: Limiter,
    L::Key: Sized,
    F: Keyer<R, L::Key> + Send + Sync,
{
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
        let Some(key) = self.keyer.key(request) else {
            return Decide::Now(Ok(Outcome::in_process(StackDecision::from_layers([]))));
        };
        Decide::Now(as_layer(
            &self.name,
            Limiter::decide(&self.limiter, &key, cost),
        ))
    }

    fn layers(&self) -> Vec<LayerInfo> {
        one_layer(self.limiter.limit(), &self.name, self.keyer.key_name())
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
            Ok(Outcome::Decided { decision, origin }) => {
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
