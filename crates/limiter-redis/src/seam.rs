//! The Redis stacks behind the workspace's one seam, [`limiter_stack::AsyncLimiter`]: their
//! answers map to an [`Outcome`] once, here, for every adapter (the tower middleware,
//! limiterd), and their errors to the stack's [`CallError`](limiter_stack::CallError).
//!
//! Through the seam a per-call stack takes, records and gives back in one script call each,
//! and as a [`Refunds`] backend takes with a [`RedisGrant`] and refunds it (typed: a grant of
//! another kind of limiter does not compile). A batch whose items
//! are known to be Redis stacks ([`decide_batch`], given each item's stack by type) on one
//! backend is one [`RedisBatch`](crate::RedisBatch) (one script call, all or nothing at one
//! `TIME`); one Redis cannot decide whole (keys across a cluster's slots, a unit refund, stacks
//! on two backends) is decided item by item by the seam's [`decide_all`]. A leased stack
//! decides single calls against its lease and everything else on its per-call stack.

use std::sync::Arc;

use limiter_stack::{
    Ask, AsyncLimiter, BatchAnswer, BatchItem, Charge, Charges, Decide, Failure, Granted,
    LayerAnswers, LayerInfo, Origin, Outcome, Pending, Refunds, Taken, decide_all, undo_with_grant,
};

use crate::{BackendError, BatchError, RedisDecision, RedisGrant, RedisStack, RefundError};

/// The failure behind a policy's answer that names none (never: every such answer carries it).
fn unknown() -> BackendError {
    BackendError::Redis("Redis failed".to_owned())
}

impl From<RedisDecision> for Outcome {
    /// A Redis answer as every adapter reads it: a decision (by Redis, the deny cache or the
    /// local fallback; a call no layer applied to counts as Redis's), or a failure the policy
    /// admitted or refused.
    fn from(answer: RedisDecision) -> Self {
        let failure = || Arc::new(answer.backend_error().cloned().unwrap_or_else(unknown));
        let Some(origin) = answer.origin() else {
            return if answer.is_allowed() {
                Self::FailedOpen(failure())
            } else {
                Self::FailedClosed(failure())
            };
        };
        // A fallback's answer carries the failure that sent it there; no other does.
        let failure = match origin {
            Origin::Fallback => Some(failure() as Failure),
            _ => None,
        };
        Self::Decided {
            decision: *answer.stack(),
            origin,
            at_unix_us: answer.decided_at_micros(),
            failure,
        }
    }
}

impl<R: Sync + 'static> AsyncLimiter<R> for RedisStack<R> {
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
        Decide::Later(Box::pin(async move {
            self.check_n(request, cost).await.map(Outcome::from)
        }))
    }

    fn decide_request_each<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        each: &'a mut LayerAnswers,
    ) -> Decide<'a> {
        each.clear();
        Decide::Later(Box::pin(async move {
            let answer = self.check_n(request, cost).await?;
            *each = *answer.layers();
            Ok(Outcome::from(answer))
        }))
    }

    fn layers(&self) -> Vec<LayerInfo> {
        RedisStack::layers(self)
            .zip(self.key_names())
            .map(|((name, limits), key)| LayerInfo {
                name: name.to_owned(),
                key,
                plans: vec![limits.iter().map(|l| l.limit()).collect()],
            })
            .collect()
    }
}

impl<R: Sync + 'static> Charges<R> for RedisStack<R> {
    fn ask<'a>(&'a self, request: &'a R, ask: Ask) -> Decide<'a> {
        Decide::Later(Box::pin(ask_per_call(self, request, ask)))
    }

    fn take_undoable<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        at: Option<u64>,
    ) -> Decide<'a, Result<Taken<'a>, limiter_stack::CallError>> {
        undo_with_grant(self, request, cost, at)
    }
}

impl<R: Sync + 'static> Refunds<R> for RedisStack<R> {
    type Grant = RedisGrant;

    /// One script call; Redis decides by its own clock (`at` is not read).
    fn take_with_grant<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        _at: Option<u64>,
    ) -> Granted<'a, RedisGrant> {
        Decide::Later(Box::pin(async move {
            let (decision, grant) = self.acquire(request, cost).await?;
            Ok((Outcome::from(decision), grant))
        }))
    }

    fn refund<'a>(
        &'a self,
        request: &'a R,
        grant: RedisGrant,
    ) -> Pending<'a, Result<Outcome, limiter_stack::CallError>> {
        Box::pin(refund(self, request, grant))
    }
}

/// An ask of a per-call stack (a leased stack's records and unit refunds go to Redis this way
/// too): each in one script call; a unit refund Redis did not take answers the store's failure.
pub(crate) async fn ask_per_call<R>(
    stack: &RedisStack<R>,
    request: &R,
    ask: Ask,
) -> Result<Outcome, limiter_stack::CallError> {
    let cost = ask.cost;
    let decision = match ask.charge {
        Charge::Take => stack.check_n(request, cost).await?,
        Charge::Record => stack.record(request, cost).await?,
        Charge::Refund => match stack.refund_units(request, cost).await {
            Ok(decision) => decision,
            Err(e) => return Ok(Outcome::FailedClosed(Arc::new(e))),
        },
    };
    Ok(Outcome::from(decision))
}

/// A refund of what a per-call stack's take granted, in one script call; a refund Redis did
/// not take answers the store's failure (the units stay counted, never given back twice).
pub(crate) async fn refund<R>(
    stack: &RedisStack<R>,
    request: &R,
    mut grant: RedisGrant,
) -> Result<Outcome, limiter_stack::CallError> {
    let units = grant.left();
    match stack.refund(request, &mut grant, units).await {
        Ok(decision) => Ok(Outcome::from(decision)),
        Err(RefundError::Backend(e)) => Ok(Outcome::FailedClosed(Arc::new(e))),
        Err(other) => Err(limiter_stack::CallError::Refund {
            reason: other.to_string(),
        }),
    }
}

/// Decides `items` all or nothing, item `i` on the per-call Redis stack `stacks[i]` (a
/// leased stack's is [`LeasedStack::stack`](crate::LeasedStack::stack): a batch is decided on
/// Redis, never against a lease): in one script call when every item is a take or a record on
/// one backend and one slot; otherwise item by item with refunds ([`decide_all`], through each
/// item's own limiter). The caller knows its stacks by type, so nothing is found by looking
/// behind a limiter; `stacks` shorter or longer than `items` is decided item by item too.
pub async fn decide_batch<R: Sync>(
    items: &[BatchItem<'_, R>],
    stacks: &[&RedisStack<R>],
    at: Option<u64>,
) -> Result<BatchAnswer, limiter_stack::CallError> {
    let together =
        items.len() == stacks.len() && items.iter().all(|item| item.charge != Charge::Refund);
    let (true, Some(first)) = (together, stacks.first()) else {
        return decide_all(items, at).await;
    };
    let backend = first.backend();
    let mut batch = backend.batch();
    for (item, &stack) in items.iter().zip(stacks) {
        if item.charge == Charge::Record {
            batch.add_record(stack, item.request, item.cost);
        } else if item.shadow {
            batch.add_shadow(stack, item.request, item.cost);
        } else {
            batch.add(stack, item.request, item.cost);
        }
    }
    match batch.decide().await {
        Ok(decided) => Ok(BatchAnswer {
            admitted: decided.is_admitted(),
            outcomes: decided
                .into_decisions()
                .into_iter()
                .map(Outcome::from)
                .collect(),
        }),
        Err(BatchError::Call { source, .. }) => Err(source),
        // Keys in several slots of a cluster, or stacks on several backends: no one script
        // call can decide it, so each item in turn, with refunds.
        Err(BatchError::CrossSlot { .. } | BatchError::OtherBackend { .. }) => {
            decide_all(items, at).await
        }
    }
}
