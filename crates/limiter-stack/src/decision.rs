//! [`StackDecision`]: the compact answer of a whole stack, with the layer that bound it;
//! [`LayerAnswers`]: each layer's own answer, kept when asked for; [`Grant`]: the units an
//! admitted call took, for a guarded refund.

use limiter_core::Decision;

/// The most layers a stack holds.
pub const MAX_LAYERS: usize = 8;

/// One layer's part in a stacked answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerDecision {
    /// The layer's position in the stack.
    pub layer: usize,
    /// The plan the layer's plan function chose.
    pub plan: usize,
    /// Which of the plan's limits bound the layer's answer.
    pub limit_index: usize,
    /// The layer's answer: allowed iff all its limits allow; the least remaining and the
    /// longest waits among them.
    pub decision: Decision,
    /// The binding limit's own `reset_after` in nanoseconds: when that limit alone is full
    /// again (`decision`'s is the longest over the layer's limits). What a per-limit report,
    /// such as the IETF `RateLimit` header, says of the binding limit.
    pub limit_reset_after_nanos: u64,
}

/// The answer to one stacked call: allowed only if every layer allowed. Compact (about a
/// hundred bytes, returned by value): what every caller reads, the admission, the binding
/// layer's answer and the answer as one [`Decision`]. Each layer's own answer is kept only
/// when asked for, in a [`LayerAnswers`] ([`Stack::check_each`](crate::Stack::check_each)).
///
/// `remaining` is the least across layers, `retry_after` the longest (the earliest instant at
/// which every layer admits the same cost, if nothing else consumes), `reset_after` the longest.
/// The *binding* layer is the one that set the answer: for a denial, the layer with the longest
/// wait; for an admission, the layer with the fewest units left (the first listed on ties).
/// Layers whose keyer returned `None` take no part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackDecision {
    binding: Option<LayerDecision>,
    least_remaining: u64,
    longest_reset: u64,
    // Whether every layer allowed is not kept apart: a denial binds over every admission, so
    // the binding layer's answer says it (and a `bool` among words is seven bytes of padding,
    // copied in pieces each time the answer moves).
}

impl Default for StackDecision {
    fn default() -> Self {
        Self::new()
    }
}

impl StackDecision {
    /// No layer yet: an admission with nothing binding it. With [`push`](Self::push), how a
    /// backend that decides layers elsewhere builds its answer without keeping each layer's.
    #[inline]
    pub const fn new() -> Self {
        Self {
            binding: None,
            least_remaining: u64::MAX,
            longest_reset: 0,
        }
    }

    /// Takes one more layer's answer into account, by the stack's rule: whether every layer
    /// allows, the least left, the longest reset, and which layer binds (on ties the layer
    /// taken first, so take layers in stack order, each once;
    /// [`from_layers`](Self::from_layers) takes them in any order).
    #[inline(always)]
    pub fn push(&mut self, layer: LayerDecision) {
        let d = &layer.decision;
        self.least_remaining = self.least_remaining.min(d.remaining());
        self.longest_reset = self.longest_reset.max(d.reset_after_nanos());
        let binds = match &self.binding {
            None => true,
            Some(current) => binds_over(d, &current.decision),
        };
        if binds {
            self.binding = Some(layer);
        }
    }

    /// Whether every layer admitted the call.
    #[inline]
    pub fn is_allowed(&self) -> bool {
        match &self.binding {
            Some(binding) => binding.decision.is_allowed(),
            None => true,
        }
    }

    /// Whether some layer denied the call.
    #[inline]
    pub fn is_denied(&self) -> bool {
        !self.is_allowed()
    }

    /// The layer that bound the answer, or `None` if no layer applied to the request.
    #[inline]
    pub fn binding(&self) -> Option<&LayerDecision> {
        self.binding.as_ref()
    }

    /// The answer as one [`Decision`]: the binding layer's limit, the least `remaining`, the
    /// longest `retry_after` and `reset_after`. With no layer applying, an admission with
    /// `u64::MAX` remaining.
    #[inline]
    pub fn decision(&self) -> Decision {
        let Some(binding) = &self.binding else {
            return Decision::allow(u64::MAX, u64::MAX, 0);
        };
        let limit = binding.decision.limit();
        if binding.decision.is_allowed() {
            Decision::allow(limit, self.least_remaining, self.longest_reset)
        } else {
            // A denial binds over every admission and the longest wait over a shorter one, so
            // the binding layer's wait is the longest.
            let wait = binding.decision.retry_after_nanos().max(1);
            Decision::deny(limit, self.least_remaining, wait, self.longest_reset)
        }
    }

    /// A stacked answer from layers decided elsewhere, each kept at its `layer` position (those
    /// at [`MAX_LAYERS`] or beyond are left out; of two at one position, the later), with the
    /// same binding rule as a [`Stack`]'s.
    ///
    /// [`Stack`]: crate::Stack
    #[inline]
    pub fn from_layers(layers: impl IntoIterator<Item = LayerDecision>) -> Self {
        LayerAnswers::from_layers(layers).summary()
    }
}

/// Every layer's own answer to one stacked call, in stack order, beside the compact
/// [`StackDecision`]: what a per-layer report reads (the IETF `RateLimit` header, debugging).
/// Filled only when asked for ([`Stack::check_each`](crate::Stack::check_each), the seam's
/// [`decide_request_each`](crate::AsyncLimiter::decide_request_each)); it is about 600 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerAnswers {
    layers: [Option<LayerDecision>; MAX_LAYERS],
}

impl Default for LayerAnswers {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerAnswers {
    /// No layer's answer.
    #[inline]
    pub const fn new() -> Self {
        Self {
            layers: [None; MAX_LAYERS],
        }
    }

    /// Forgets every layer's answer, for the next call.
    #[inline]
    pub fn clear(&mut self) {
        self.layers = [None; MAX_LAYERS];
    }

    /// Keeps `layer`'s answer at its position (the later of two at one position; none at
    /// [`MAX_LAYERS`] or beyond).
    #[inline]
    pub fn set(&mut self, layer: LayerDecision) {
        if let Some(slot) = self.layers.get_mut(layer.layer) {
            *slot = Some(layer);
        }
    }

    /// Answers from layers decided elsewhere (see [`StackDecision::from_layers`]).
    #[inline]
    pub fn from_layers(layers: impl IntoIterator<Item = LayerDecision>) -> Self {
        let mut answers = Self::new();
        for layer in layers {
            answers.set(layer);
        }
        answers
    }

    /// Every layer that took part, in stack order.
    pub fn iter(&self) -> impl Iterator<Item = &LayerDecision> {
        self.layers.iter().flatten()
    }

    /// The answer of the layer at position `layer`, if it took part.
    pub fn get(&self, layer: usize) -> Option<&LayerDecision> {
        self.layers.get(layer).and_then(Option::as_ref)
    }

    /// Whether no layer took part.
    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// The stacked answer of these layers, by the stack's rule (layers taken in stack order).
    #[inline]
    pub fn summary(&self) -> StackDecision {
        let mut decision = StackDecision::new();
        for layer in self.iter() {
            decision.push(*layer);
        }
        decision
    }
}

/// Where a call's answer is built: the compact decision, and each layer's answer when the
/// caller asked for them.
pub(crate) struct Answer<'a> {
    pub(crate) decision: StackDecision,
    pub(crate) each: Option<&'a mut LayerAnswers>,
}

impl<'a> Answer<'a> {
    /// A new answer, keeping each layer's in `each` (cleared) if given.
    #[inline(always)]
    pub(crate) fn new(mut each: Option<&'a mut LayerAnswers>) -> Self {
        if let Some(each) = &mut each {
            each.clear();
        }
        Self {
            decision: StackDecision::new(),
            each,
        }
    }

    /// Takes layer `layer`'s answer (see [`StackDecision::push`]).
    #[inline(always)]
    pub(crate) fn take(&mut self, layer: LayerDecision) {
        self.decision.push(layer);
        if let Some(each) = &mut self.each {
            each.set(layer);
        }
    }

    /// Takes the general path's answer as it stands: `decision`, and `layers` if kept.
    #[inline]
    pub(crate) fn replace(&mut self, decision: StackDecision, layers: &LayerAnswers) {
        self.decision = decision;
        if let Some(each) = &mut self.each {
            **each = *layers;
        }
    }
}

impl LayerDecision {
    /// The answer of layer `layer` under `plan`, whose plan has one limit: that limit's answer
    /// is the layer's.
    #[inline(always)]
    pub fn from_one(layer: usize, plan: usize, decision: Decision) -> Self {
        Self {
            layer,
            plan,
            limit_index: 0,
            limit_reset_after_nanos: decision.reset_after_nanos(),
            decision,
        }
    }

    /// A layer's answer from its limits' answers, in limit order, by the stack's own rule:
    /// allowed iff every limit allows; the least remaining and the longest waits; the binding
    /// limit is the one with the longest wait (denied) or the fewest left (allowed), the first
    /// on ties. `None` when `limits` is empty. For backends that decide layers elsewhere (the
    /// Redis backend decides them in one script).
    #[inline]
    pub fn from_limits(layer: usize, plan: usize, limits: &[Decision]) -> Option<Self> {
        if let [only] = limits {
            // The usual layer: its one limit's answer is the layer's (a denial's wait is
            // already at least 1 ns), with nothing to combine.
            return Some(Self {
                layer,
                plan,
                limit_index: 0,
                decision: *only,
                limit_reset_after_nanos: only.reset_after_nanos(),
            });
        }
        let first = limits.first()?;
        let mut binding = 0;
        for (j, d) in limits.iter().enumerate().skip(1) {
            if binds_over(d, &limits[binding]) {
                binding = j;
            }
        }
        let allowed = limits.iter().all(Decision::is_allowed);
        let bound = limits.get(binding).unwrap_or(first);
        Some(Self {
            layer,
            plan,
            limit_index: binding,
            decision: combine(allowed, bound.limit(), limits.iter().copied()),
            limit_reset_after_nanos: bound.reset_after_nanos(),
        })
    }
}

/// Whether `candidate` binds over `current`: a longer wait, or (both allowed) fewer left.
#[inline]
pub(crate) fn binds_over(candidate: &Decision, current: &Decision) -> bool {
    match (candidate.is_denied(), current.is_denied()) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => candidate.retry_after_nanos() > current.retry_after_nanos(),
        (false, false) => candidate.remaining() < current.remaining(),
    }
}

/// Allowed iff `allowed`; the least remaining and the longest waits of `parts`.
#[inline]
pub(crate) fn combine(
    allowed: bool,
    limit: u64,
    parts: impl Iterator<Item = Decision>,
) -> Decision {
    let (remaining, retry, reset) = parts.fold((u64::MAX, 0, 0), |(rem, retry, reset), d| {
        (
            rem.min(d.remaining()),
            retry.max(d.retry_after_nanos()),
            reset.max(d.reset_after_nanos()),
        )
    });
    if allowed {
        Decision::allow(limit, remaining, reset)
    } else {
        Decision::deny(limit, remaining, retry.max(1), reset)
    }
}

/// The units an admitted call took from a stack, which may be given back (a request that turned
/// out cheap, or was cancelled) with [`Stack::refund`](crate::Stack::refund).
///
/// A grant cannot be cloned, and each refund takes its units off it, so no more than was taken
/// is ever given back.
#[derive(Debug, PartialEq, Eq)]
pub struct Grant {
    pub(crate) stack: u64,
    pub(crate) taken: u64,
    pub(crate) left: u64,
    pub(crate) at: u64,
}

impl Grant {
    /// Units the call took.
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// Units that may still be given back.
    pub fn left(&self) -> u64 {
        self.left
    }

    /// The clock reading the units were taken at.
    pub fn taken_at(&self) -> u64 {
        self.at
    }
}

impl limiter_core::wait::Admission for StackDecision {
    /// The longest wait of the layers that denied, as [`decision`](Self::decision) reports it.
    fn wait(&self) -> Option<std::time::Duration> {
        self.is_denied().then(|| self.decision().retry_after())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(layer: usize, decision: Decision) -> LayerDecision {
        LayerDecision {
            layer,
            plan: 0,
            limit_index: 0,
            decision,
            limit_reset_after_nanos: decision.reset_after_nanos(),
        }
    }

    #[test]
    fn answers_from_elsewhere_bind_by_the_stacks_rule() {
        // Admitted: the fewest left binds, the first listed on ties.
        let allowed = StackDecision::from_layers([
            layer(0, Decision::allow(10, 5, 0)),
            layer(1, Decision::allow(10, 2, 0)),
            layer(2, Decision::allow(10, 2, 0)),
        ]);
        assert!(allowed.is_allowed());
        assert_eq!(allowed.binding().map(|b| b.layer), Some(1));

        // Denied: any denial binds over an admission, the longest wait over a shorter one.
        let denied = StackDecision::from_layers([
            layer(0, Decision::deny(10, 0, 10, 10)),
            layer(1, Decision::allow(10, 0, 0)),
            layer(2, Decision::deny(10, 0, 30, 30)),
        ]);
        assert!(denied.is_denied());
        assert_eq!(denied.binding().map(|b| b.layer), Some(2));
    }

    #[test]
    fn of_two_answers_at_one_position_the_later_stands_and_binds_as_stored() {
        let decision = StackDecision::from_layers([
            layer(0, Decision::allow(10, 1, 0)),
            layer(0, Decision::allow(10, 9, 0)),
            layer(1, Decision::allow(10, 5, 0)),
        ]);
        assert_eq!(decision.binding().map(|b| b.decision.remaining()), Some(5));
        assert_eq!(decision.decision().remaining(), 5);
        let each = LayerAnswers::from_layers([
            layer(0, Decision::allow(10, 1, 0)),
            layer(0, Decision::allow(10, 9, 0)),
            layer(1, Decision::allow(10, 5, 0)),
        ]);
        assert_eq!(each.iter().count(), 2);
        assert_eq!(each.summary(), decision);
    }

    #[test]
    fn a_stacked_answer_admits_iff_every_layer_admits_in_any_order() {
        // The admission is read from the binding layer (no flag kept apart): every mix of up
        // to four layers, admitted or denied with waits that tie or differ, in every order
        // of pushing them.
        let answers = [
            Decision::allow(10, 3, 5),
            Decision::allow(10, 0, 9),
            Decision::deny(10, 0, 7, 7),
            Decision::deny(10, 2, 7, 9),
            Decision::deny(10, 0, 1, 1),
        ];
        let n = answers.len();
        for count in 0..=4u32 {
            for pick in 0..n.pow(count) {
                let layers: Vec<LayerDecision> = (0..count as usize)
                    .map(|i| layer(i, answers[pick / n.pow(i as u32) % n]))
                    .collect();
                let every = layers.iter().all(|l| l.decision.is_allowed());
                let mut pushed = StackDecision::new();
                for l in layers.iter().rev() {
                    pushed.push(*l);
                }
                let summary = StackDecision::from_layers(layers.iter().copied());
                for d in [pushed, summary] {
                    assert_eq!(d.is_allowed(), every, "{layers:?}");
                    assert_eq!(d.is_denied(), !every);
                    assert_eq!(d.decision().is_allowed(), every);
                }
            }
        }
    }

    #[test]
    fn the_compact_answer_is_a_few_words_and_combines_as_the_layers_do() {
        // What every call returns is small and whole words (no padding to copy in pieces when
        // it moves); each layer's answer is kept only when asked for.
        use std::mem::size_of;
        assert_eq!(
            size_of::<Option<LayerDecision>>(),
            size_of::<LayerDecision>()
        );
        assert_eq!(size_of::<LayerDecision>(), size_of::<Decision>() + 4 * 8);
        assert_eq!(
            size_of::<StackDecision>(),
            size_of::<LayerDecision>() + 2 * 8
        );
        let denied = StackDecision::from_layers([
            layer(0, Decision::allow(10, 1, 40)),
            layer(1, Decision::deny(10, 0, 30, 90)),
            layer(2, Decision::deny(20, 3, 70, 70)),
        ]);
        let d = denied.decision();
        assert!(d.is_denied());
        assert_eq!(denied.binding().map(|b| b.layer), Some(2));
        assert_eq!(
            (
                d.limit(),
                d.remaining(),
                d.retry_after_nanos(),
                d.reset_after_nanos()
            ),
            (20, 0, 70, 90)
        );
        let none = StackDecision::from_layers([]);
        assert!(none.is_allowed() && none.binding().is_none());
        assert_eq!(none.decision().remaining(), u64::MAX);
    }
}
