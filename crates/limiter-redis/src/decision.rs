//! [`RedisDecision`]: a stacked answer plus where it came from, so a backend failure is never
//! mistaken for "over the limit".

use limiter_core::Decision;
use limiter_stack::{LayerAnswers, LayerDecision, Origin, StackDecision};

use crate::error::BackendError;

/// How a call was answered: decided by the limits (by Redis, the deny cache, a lease or the
/// local fallback: [`Origin`]), or by the failure policy without deciding. Two words, no
/// padding: the policy's two answers are variants of their own, whose tags take values an
/// [`Origin`] (a whole word) never holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answered {
    /// The limits decided, here; with the Redis failure behind a fallback's answer (boxed:
    /// a failure is rare, and every answer carries the room for it).
    Decided(Origin, Option<Box<BackendError>>),
    /// Redis failed and the policy admitted without deciding.
    FailedOpen(Box<BackendError>),
    /// Redis failed and the policy refused without deciding.
    FailedClosed(Box<BackendError>),
}

/// The answer to one call on Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisDecision {
    /// The stacked answer (admitted iff it is, unless a failure policy answered: no `bool`
    /// apart, whose padding every move of the answer would copy in pieces).
    stack: StackDecision,
    /// Each layer's answer where Redis or the local fallback decided (Redis decides them all
    /// in one script, and a call on a cluster combines its parts'); boxed, and none for an
    /// answer made against a lease, which stays a few words.
    layers: Option<Box<LayerAnswers>>,
    answered: Answered,
    /// When Redis decided, in microseconds of its `TIME` (since the Unix epoch): the instant
    /// the waits count from; 0 when not (a word: an `Option`'s tag would be padded).
    at_us: u64,
}

impl RedisDecision {
    #[inline]
    pub(crate) fn new(layers: LayerAnswers, answered: Answered) -> Self {
        Self {
            stack: layers.summary(),
            layers: (!layers.is_empty()).then(|| Box::new(layers)),
            answered,
            at_us: 0,
        }
    }

    /// The answer `layers` say by the stack's rule (admitted iff every layer admits), decided
    /// by `origin`.
    #[inline]
    pub(crate) fn decided(layers: LayerAnswers, origin: Origin) -> Self {
        Self::new(layers, Answered::Decided(origin, None))
    }

    /// The local fallback's answer, `layers` by the stack's rule, while Redis failed with
    /// `error`.
    pub(crate) fn fell_back(layers: LayerAnswers, error: BackendError) -> Self {
        Self {
            answered: Answered::Decided(Origin::Fallback, Some(Box::new(error))),
            ..Self::decided(layers, Origin::Fallback)
        }
    }

    /// The failure policy's answer while Redis failed with `error`: admitted (fail open) or
    /// refused (fail closed), no limit consulted.
    pub(crate) fn by_policy(admitted: bool, error: BackendError) -> Self {
        let error = Box::new(error);
        let answered = if admitted {
            Answered::FailedOpen(error)
        } else {
            Answered::FailedClosed(error)
        };
        Self::new(LayerAnswers::new(), answered)
    }

    /// The answer to a call no layer applied to: admitted, nothing counted (reported as the
    /// store's, whose stack it is).
    pub(crate) fn no_layer() -> Self {
        Self::new(LayerAnswers::new(), Answered::Decided(Origin::Remote, None))
    }

    /// Redis's answer to a call decided in parts (one per cluster slot): their layers stacked
    /// by the stack's rule, decided at the first part's instant (`None`: no part answered).
    pub(crate) fn from_parts(
        layers: impl IntoIterator<Item = LayerDecision>,
        at_us: Option<u64>,
    ) -> Self {
        let answer = Self::decided(LayerAnswers::from_layers(layers), Origin::Remote);
        match at_us {
            Some(at) => answer.at(at),
            None => answer,
        }
    }

    /// This decision, if Redis made it, made at `now_us` (its `TIME`, in microseconds).
    #[inline]
    pub(crate) fn at(mut self, now_us: u64) -> Self {
        if self.answered == Answered::Decided(Origin::Remote, None) {
            self.at_us = now_us;
        }
        self
    }

    /// This decision with `units` more left in each layer (within its burst): Redis's answer
    /// to a call that also leased `units`, which this node holds and may still spend.
    pub(crate) fn with_leased(mut self, units: u64) -> Self {
        let Some(layers) = self.layers.as_deref_mut() else {
            return self;
        };
        let raised = LayerAnswers::from_layers(layers.iter().map(|layer| {
            let d = layer.decision;
            let remaining = d.remaining().saturating_add(units).min(d.limit());
            let decision = if d.is_allowed() {
                Decision::allow(d.limit(), remaining, d.reset_after_nanos())
            } else {
                d
            };
            LayerDecision { decision, ..*layer }
        }));
        *layers = raised;
        self.stack = raised.summary();
        self
    }

    /// This decision, made against a lease, as of `at_us` on Redis's clock.
    #[inline]
    pub(crate) fn leased_at(mut self, at_us: u64) -> Self {
        self.at_us = at_us;
        self
    }

    /// A decision made against a lease ([`Origin::Lease`]) from its layers' answers (in stack
    /// order), kept compact: each layer's is not kept (the seam's `decide_request_each` asks
    /// for them).
    #[inline]
    pub(crate) fn leased(layers: impl IntoIterator<Item = LayerDecision>) -> Self {
        let mut stack = StackDecision::new();
        for layer in layers {
            stack.push(layer);
        }
        Self {
            stack,
            layers: None,
            answered: Answered::Decided(Origin::Lease, None),
            at_us: 0,
        }
    }

    /// Whether the call was admitted (by the limits, or by a fail-open policy).
    pub fn is_allowed(&self) -> bool {
        match self.answered {
            Answered::Decided(..) => self.stack.is_allowed(),
            Answered::FailedOpen(_) => true,
            Answered::FailedClosed(_) => false,
        }
    }

    /// Whether the call was refused (by the limits, or by a fail-closed policy).
    pub fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// Who decided the call: Redis ([`Origin::Remote`], also for a call no layer applied
    /// to), the deny cache, a lease, or the local fallback while Redis failed; `None` when
    /// Redis failed and the failure policy admitted or refused without deciding
    /// ([`failed_open`](Self::failed_open), [`failed_closed`](Self::failed_closed)).
    pub fn origin(&self) -> Option<Origin> {
        match self.answered {
            Answered::Decided(origin, _) => Some(origin),
            Answered::FailedOpen(_) | Answered::FailedClosed(_) => None,
        }
    }

    /// The Redis failure behind a policy's answer (open, closed, or the fallback's), if there
    /// was one.
    pub fn backend_error(&self) -> Option<&BackendError> {
        match &self.answered {
            Answered::Decided(_, error) => error.as_deref(),
            Answered::FailedOpen(error) | Answered::FailedClosed(error) => Some(error),
        }
    }

    /// Whether Redis failed and the policy admitted the call without deciding (nothing was
    /// counted).
    pub fn failed_open(&self) -> bool {
        matches!(self.answered, Answered::FailedOpen(_))
    }

    /// Whether Redis failed and the policy refused the call. Not "over the limit": an HTTP
    /// layer answers 503, not 429.
    pub fn failed_closed(&self) -> bool {
        matches!(self.answered, Answered::FailedClosed(_))
    }

    /// The stacked answer (the binding layer, the least left, the longest waits), combined
    /// from [`layers`](Self::layers). No layer when a fail-open or fail-closed policy answered
    /// (no limit was consulted).
    pub fn stack(&self) -> &StackDecision {
        &self.stack
    }

    /// Each layer's own answer, in stack order (what [`stack`](Self::stack) combines). Empty
    /// when a fail-open or fail-closed policy answered and for an answer made against a lease
    /// (ask the seam's `decide_request_each` for a leased stack's); only the binding layer's
    /// when the deny cache answered.
    pub fn layers(&self) -> &LayerAnswers {
        static NO_LAYERS: LayerAnswers = LayerAnswers::new();
        self.layers.as_deref().unwrap_or(&NO_LAYERS)
    }

    /// When the answer was decided, in microseconds since the Unix epoch by Redis's clock
    /// (`TIME`, or the time a backend injects): the instant its waits count from, so `at +
    /// reset_after` is when the limits are full again, whichever node asks. Set for Redis's
    /// answers and for answers made against a lease (the lease's Redis answer, moved on by the
    /// local clock since); `None` for the deny cache, the fallback and the failure policies,
    /// whose waits count from this node's clock.
    pub fn decided_at_micros(&self) -> Option<u64> {
        (self.at_us != 0).then_some(self.at_us)
    }

    /// The answer as one [`Decision`] (least remaining, longest waits), or `None` when a
    /// fail-open or fail-closed policy answered without consulting any limit.
    pub fn decision(&self) -> Option<Decision> {
        match self.answered {
            Answered::FailedOpen(_) | Answered::FailedClosed(_) => None,
            Answered::Decided(..) => Some(self.stack.decision()),
        }
    }
}
