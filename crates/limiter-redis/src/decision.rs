//! [`RedisDecision`]: a stacked answer plus where it came from, so a backend failure is never
//! mistaken for "over the limit".

use limiter_core::Decision;
use limiter_stack::{LayerAnswers, LayerDecision, StackDecision};

use crate::error::BackendError;

/// Who answered a call.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Source {
    /// Redis decided it, in one script for every layer.
    Redis,
    /// The deny cache: Redis denied this key for this cost or less, and the wait has not passed.
    DenyCache,
    /// No layer applied to the request (every keyer returned `None`): admitted, nothing counted.
    NoLayer,
    /// Redis failed and the policy is to admit.
    FailOpen(BackendError),
    /// Redis failed and the policy is to refuse. This is not "over the limit": an HTTP layer
    /// answers 503, not 429.
    FailClosed(BackendError),
    /// This node decided locally, against units it had leased from Redis
    /// ([`LeasedStack`](crate::LeasedStack)), or a denial Redis had answered for them.
    Lease,
    /// Redis failed and the local in-memory limiter decided, with the same limits on this node.
    Fallback(BackendError),
}

/// The answer to one call on Redis.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisDecision {
    allowed: bool,
    /// The stacked answer.
    stack: StackDecision,
    /// Each layer's answer where Redis or the local fallback decided (Redis decides them all
    /// in one script, and a call on a cluster combines its parts'); boxed, and none for an
    /// answer made against a lease, which stays a few words.
    layers: Option<Box<LayerAnswers>>,
    source: Source,
    /// When Redis decided, in microseconds of its `TIME` (since the Unix epoch): the instant
    /// the waits count from.
    at_us: Option<u64>,
}

impl RedisDecision {
    #[inline]
    pub(crate) fn new(allowed: bool, layers: LayerAnswers, source: Source) -> Self {
        Self {
            allowed,
            stack: layers.summary(),
            layers: (!layers.is_empty()).then(|| Box::new(layers)),
            source,
            at_us: None,
        }
    }

    /// The answer `layers` say by the stack's rule (admitted iff every layer admits), from
    /// `source`.
    #[inline]
    pub(crate) fn decided(layers: LayerAnswers, source: Source) -> Self {
        let stack = layers.summary();
        Self {
            allowed: stack.is_allowed(),
            stack,
            layers: (!layers.is_empty()).then(|| Box::new(layers)),
            source,
            at_us: None,
        }
    }

    /// Redis's answer to a call decided in parts (one per cluster slot): their layers stacked
    /// by the stack's rule, decided at the first part's instant (`None`: no part answered).
    pub(crate) fn from_parts(
        layers: impl IntoIterator<Item = LayerDecision>,
        at_us: Option<u64>,
    ) -> Self {
        let answer = Self::decided(LayerAnswers::from_layers(layers), Source::Redis);
        match at_us {
            Some(at) => answer.at(at),
            None => answer,
        }
    }

    /// This decision, if Redis made it, made at `now_us` (its `TIME`, in microseconds).
    #[inline]
    pub(crate) fn at(mut self, now_us: u64) -> Self {
        if self.source == Source::Redis {
            self.at_us = Some(now_us);
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
        self.at_us = Some(at_us);
        self
    }

    /// A decision made against a lease ([`Source::Lease`]) from its layers' answers (in stack
    /// order), kept compact: each layer's is not kept (the seam's `decide_request_each` asks
    /// for them).
    #[inline]
    pub(crate) fn leased(allowed: bool, layers: impl IntoIterator<Item = LayerDecision>) -> Self {
        let mut stack = StackDecision::new();
        for layer in layers {
            stack.push(layer);
        }
        Self {
            allowed,
            stack,
            layers: None,
            source: Source::Lease,
            at_us: None,
        }
    }

    /// Whether the call was admitted (by the limits, or by a fail-open policy).
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether the call was refused (by the limits, or by a fail-closed policy).
    pub fn is_denied(&self) -> bool {
        !self.allowed
    }

    /// Who answered.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// The Redis failure behind a policy's answer, if there was one.
    pub fn backend_error(&self) -> Option<&BackendError> {
        match &self.source {
            Source::FailOpen(e) | Source::FailClosed(e) | Source::Fallback(e) => Some(e),
            Source::Redis | Source::DenyCache | Source::NoLayer | Source::Lease => None,
        }
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
        self.at_us
    }

    /// The answer as one [`Decision`] (least remaining, longest waits), or `None` when a
    /// fail-open or fail-closed policy answered without consulting any limit.
    pub fn decision(&self) -> Option<Decision> {
        match self.source {
            Source::FailOpen(_) | Source::FailClosed(_) => None,
            _ => Some(self.stack.decision()),
        }
    }
}
