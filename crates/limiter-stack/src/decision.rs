//! [`StackDecision`]: the answer of a whole stack, with the layer that bound it and each
//! layer's own answer; [`Grant`]: the units an admitted call took, for a guarded refund.

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

/// The answer to one stacked call: allowed only if every layer allowed.
///
/// `remaining` is the least across layers, `retry_after` the longest (the earliest instant at
/// which every layer admits the same cost, if nothing else consumes), `reset_after` the longest.
/// The *binding* layer is the one that set the answer: for a denial, the layer with the longest
/// wait; for an admission, the layer with the fewest units left (the first listed on ties).
/// Layers whose keyer returned `None` take no part.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StackDecision {
    layers: [Option<LayerDecision>; MAX_LAYERS],
    binding: Option<usize>,
    allowed: bool,
}

impl StackDecision {
    #[inline]
    pub(crate) fn new() -> Self {
        Self {
            layers: [None; MAX_LAYERS],
            binding: None,
            allowed: true,
        }
    }

    /// Adds the answer of layer `layer` from its limits' answers (see
    /// [`LayerDecision::from_limits`]), built in place.
    #[inline]
    pub(crate) fn push_limits(
        &mut self,
        slot: usize,
        layer: usize,
        plan: usize,
        limits: &[Decision],
    ) {
        if let Some(decided) = LayerDecision::from_limits(layer, plan, limits) {
            self.push(slot, decided);
        }
    }

    /// Adds the answer of layer `layer`, whose plan has one limit, as `decide` writes it: the
    /// limit's answer is the layer's. It is decided in its place, never copied there.
    #[inline]
    pub(crate) fn push_one<E>(
        &mut self,
        slot: usize,
        layer: usize,
        plan: usize,
        decide: impl FnOnce(&mut Decision) -> Result<(), E>,
    ) -> Result<(), E> {
        let entry = self.layers[slot].insert(LayerDecision {
            layer,
            plan,
            limit_index: 0,
            decision: Decision::allow(0, 0, 0),
            limit_reset_after_nanos: 0,
        });
        decide(&mut entry.decision)?;
        entry.limit_reset_after_nanos = entry.decision.reset_after_nanos();
        self.bind(slot);
        Ok(())
    }

    /// Adds a layer's answer, keeping the binding layer up to date.
    #[inline]
    pub(crate) fn push(&mut self, slot: usize, layer: LayerDecision) {
        self.layers[slot] = Some(layer);
        self.bind(slot);
    }

    /// Takes the answer at `slot` into account: whether every layer allows, and which binds.
    #[inline]
    fn bind(&mut self, slot: usize) {
        let Some(new) = &self.layers[slot] else {
            return;
        };
        self.allowed &= new.decision.is_allowed();
        let binds = match self.binding.and_then(|b| self.layers[b].as_ref()) {
            None => true,
            Some(current) => binds_over(&new.decision, &current.decision),
        };
        if binds {
            self.binding = Some(slot);
        }
    }

    /// Whether every layer admitted the call.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// Whether some layer denied the call.
    pub fn is_denied(&self) -> bool {
        !self.allowed
    }

    /// The layer that bound the answer, or `None` if no layer applied to the request.
    pub fn binding(&self) -> Option<&LayerDecision> {
        self.binding.and_then(|b| self.layers[b].as_ref())
    }

    /// Every layer that took part, in stack order.
    pub fn layers(&self) -> impl Iterator<Item = &LayerDecision> {
        self.layers.iter().flatten()
    }

    /// The answer as one [`Decision`]: the binding layer's limit, the least `remaining`, the
    /// longest `retry_after` and `reset_after`. With no layer applying, an admission with
    /// `u64::MAX` remaining.
    pub fn decision(&self) -> Decision {
        let Some(binding) = self.binding() else {
            return Decision::allow(u64::MAX, u64::MAX, 0);
        };
        combine(
            self.allowed,
            binding.decision.limit(),
            self.layers().map(|l| l.decision),
        )
    }
}

impl LayerDecision {
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

impl StackDecision {
    /// A stacked answer from layers decided elsewhere, each kept at its `layer` position (those
    /// at [`MAX_LAYERS`] or beyond are left out; of two at one position, the later), with the
    /// same binding rule as a [`Stack`]'s.
    ///
    /// [`Stack`]: crate::Stack
    #[inline]
    pub fn from_layers(layers: impl IntoIterator<Item = LayerDecision>) -> Self {
        let mut decision = Self::new();
        for layer in layers {
            if layer.layer < MAX_LAYERS {
                decision.push(layer.layer, layer);
            }
        }
        decision
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
        assert_eq!(decision.layers().count(), 2);
        assert_eq!(decision.binding().map(|b| b.decision.remaining()), Some(5));
        assert_eq!(decision.decision().remaining(), 5);
    }
}
