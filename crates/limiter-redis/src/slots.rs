//! A call whose keys span Redis Cluster slots: a stack tagged by each layer's key (the default
//! on a cluster) whose call names a user layer and a global one, say. Redis runs a script only
//! on keys of one slot, so the call is decided slot by slot, each part (the limits whose keys
//! share a slot) all or nothing in a script of its own, in the order the call's layers first
//! name the slots (the stack's layer order: put per-identifier layers first, and a shared
//! global layer sees only calls its identifiers admitted). When a part denies, the parts
//! already taken are given back (a refund at their grant's instant), so a denied call takes
//! nothing for good:
//!
//! - **Never more than a limit.** Each limit is decided exactly, by the script, on its slot.
//! - **All or nothing, in effect.** An admitted call took its cost on every limit; a denied
//!   one gives back what its earlier parts took. Between the take and the give back (one
//!   round trip per later part), those units are held: another call on the same keys in that
//!   window may be denied where it would have been admitted a moment later, never admitted
//!   beyond a limit. If the give back fails (Redis gone mid-call), the units stay taken: the
//!   limit under-admits by that call's cost, never over-admits.
//! - **Records and peeks** are written on (or read from) every part; nothing to give back.
//! - **Failures**: a part Redis cannot decide gives back what was taken and hands the whole
//!   call to the failure policy.
//!
//! Each part is a round trip, so a call across two slots takes two (three when denied by the
//! second). Batches ([`RedisBatch`](crate::RedisBatch)) stay in one slot, or are refused
//! naming the slots; leased stacks must keep a call in one slot.
#![deny(clippy::arithmetic_side_effects)]

use crate::decision::RedisDecision;
use crate::error::BackendError;
use crate::stack::{Prepared, RedisStack};

impl<R> RedisStack<R> {
    /// Decides `call` (whose keys span slots) part by part; with the script's time (µs) of its
    /// first part when Redis decided it. When Redis fails, what earlier parts took goes back
    /// and the error is the answer (the caller asks the failure policy).
    pub(crate) async fn decide_across(
        &self,
        request: &R,
        call: &Prepared,
    ) -> Result<(RedisDecision, Option<u64>), BackendError> {
        let sent = self.backend().sent();
        // A call that takes units can be undone; a record or a peek has nothing to give back.
        let undoable = !call.record && call.cost > 0;
        let mut layers = Vec::new();
        let mut taken: Vec<(Prepared, u64)> = Vec::new();
        let mut first_us = None;
        for part in call.by_slot() {
            let answered = match self.send(&part).await {
                Ok((now_us, group)) => self
                    .concluded(&part, group, sent, true)
                    .map(|decision| (now_us, decision)),
                Err(e) => Err(e),
            };
            let (now_us, decision) = match answered {
                Ok(answered) => answered,
                Err(e) => {
                    refund_taken(self, request, call.cost, taken).await;
                    return Err(e);
                }
            };
            let decided_at = *first_us.get_or_insert(now_us);
            layers.extend(decision.layers().iter().copied());
            if undoable && decision.is_denied() {
                // Later layers of a denied call are not asked; earlier ones report what they hold
                // once their units are back.
                for peek in refund_taken(self, request, call.cost, taken).await {
                    layers.extend(peek.layers().iter().copied());
                }
                let denied = RedisDecision::from_parts(layers, Some(decided_at));
                return Ok((denied, Some(decided_at)));
            }
            if undoable {
                taken.push((part, now_us));
            }
        }
        Ok((RedisDecision::from_parts(layers, first_us), first_us))
    }
}

/// Gives `cost` back to each part taken (at its instant), one round trip each: what each
/// then holds (a peek), for the parts Redis answered.
async fn refund_taken<R>(
    stack: &RedisStack<R>,
    request: &R,
    cost: u64,
    taken: Vec<(Prepared, u64)>,
) -> Vec<RedisDecision> {
    let mut peeks = Vec::with_capacity(taken.len());
    for (part, granted_us) in taken {
        match stack
            .send_refund_part(request, &part, cost, Some(granted_us))
            .await
        {
            Ok(peek) => peeks.push(peek),
            Err(e) => {
                if let Some(unlogged) = stack.refund_failure_due() {
                    tracing::warn!(
                        target: "limiter_redis::slots",
                        error = %e,
                        keys = ?part.keys,
                        unlogged,
                        "a denied call across slots could not give back what an earlier slot took; \
                         those units stay taken until they refill (one such line every 10 s)"
                    );
                }
            }
        }
    }
    peeks
}
