//! Each layer's own answer, kept in a caller's [`LayerAnswers`] when asked for: the same calls
//! as the compact ones ([`Stack::check_n`], [`Stack::decide_at`], [`Stack::record_at`]), for a
//! per-layer report (the IETF `RateLimit` header, a backend's fallback, debugging).

use std::hash::Hash;

use limiter_core::Clock;

use super::Stack;
use crate::decision::{Answer, Grant, LayerAnswers, StackDecision};
use crate::error::CallError;

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides `cost` units for `request` now, as [`check_n`](Self::check_n) does, and keeps
    /// each layer's own answer in `each` (cleared first): what a per-layer report reads. The
    /// compact answer alone is cheaper; ask for this only where every layer is read.
    ///
    /// ```
    /// use limiter_core::{Limit, ManualClock};
    /// use limiter_stack::{Kind, LayerAnswers, Layer, Stack};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let stack = Stack::builder()
    ///     .layer(Layer::keyed("per-user", |u: &u64| Some(*u)).limit(Kind::TokenBucket, Limit::per_second(5)))
    ///     .layer(Layer::global("all").limit(Kind::TokenBucket, Limit::per_second(100)))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// let mut each = LayerAnswers::new();
    /// let decision = stack.check_each(&7, 1, &mut each)?;
    /// assert!(decision.is_allowed());
    /// let left: Vec<u64> = each.iter().map(|l| l.decision.remaining()).collect();
    /// assert_eq!(left, [4, 99]);
    /// assert_eq!(decision.decision().remaining(), 4); // the least, the binding layer's
    /// # Ok(()) }
    /// ```
    #[inline]
    pub fn check_each(
        &self,
        request: &R,
        cost: u64,
        each: &mut LayerAnswers,
    ) -> Result<StackDecision, CallError> {
        self.decide_at_each(request, cost, self.clock.now(), each)
            .map(|(decision, _)| decision)
    }

    /// Decides `cost` units for `request` at `now`, as [`decide_at`](Self::decide_at) does,
    /// keeping each layer's answer in `each` (cleared first).
    #[inline]
    pub fn decide_at_each(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        each: &mut LayerAnswers,
    ) -> Result<(StackDecision, Option<Grant>), CallError> {
        let mut out = Answer::new(Some(each));
        self.decide_into(request, cost, now, &mut out)?;
        Ok((out.decision, self.grant_for(&out.decision, cost, now)))
    }

    /// Records `cost` units for `request` at `now`, as [`record_at`](Self::record_at) does,
    /// keeping each layer's answer in `each` (cleared first).
    pub fn record_at_each(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        each: &mut LayerAnswers,
    ) -> Result<StackDecision, CallError> {
        let mut out = Answer::new(Some(each));
        self.decide_from_scratch(request, cost, now, true, &mut out)?;
        Ok(out.decision)
    }
}
