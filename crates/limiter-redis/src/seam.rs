//! The Redis stacks behind the workspace's one seam, [`limiter_stack::AsyncLimiter`]: their
//! answers map to an [`Outcome`] once, here, for every adapter (the tower middleware,
//! limiterd), and their errors to the stack's [`CallError`](limiter_stack::CallError).
//!
//! Through the seam a per-call stack takes, holds (a [`RedisGrant`] inside the seam's
//! [`Held`]), records, gives back and refunds in one script call each. A batch whose items
//! are known to be Redis stacks ([`decide_batch`], given each item's stack by type) on one
//! backend is one [`RedisBatch`](crate::RedisBatch) (one script call, all or nothing at one
//! `TIME`); one Redis cannot decide whole (keys across a cluster's slots, a give-back, stacks
//! on two backends) is decided item by item by the seam's [`decide_all`]. A leased stack
//! decides single calls against its lease and everything else on its per-call stack.

use std::sync::Arc;

use limiter_core::DecisionError;
use limiter_stack::{
    Ask, Asked, AsyncLimiter, BatchAnswer, BatchItem, Charge, Decide, Held, LayerAnswers,
    LayerInfo, Origin, Outcome, Pending, decide_all,
};

use crate::{BatchError, CallError, RedisDecision, RedisGrant, RedisStack, RefundError, Source};

impl From<CallError> for limiter_stack::CallError {
    fn from(error: CallError) -> Self {
        match error {
            CallError::CostExceedsBurst {
                layer,
                limit_index,
                cost,
                burst,
            } => Self::Decision {
                layer,
                limit_index,
                source: DecisionError::CostExceedsBurst { cost, burst },
            },
            CallError::NoSuchPlan {
                layer,
                chosen,
                plans,
            } => Self::NoSuchPlan {
                layer,
                chosen,
                plans,
            },
        }
    }
}

impl From<RedisDecision> for Outcome {
    /// A Redis answer as every adapter reads it: a decision (by Redis, the deny cache or the
    /// local fallback; a call no layer applied to counts as Redis's), or a failure the policy
    /// admitted or refused.
    fn from(answer: RedisDecision) -> Self {
        let origin = match answer.source() {
            Source::FailOpen(e) => return Self::FailedOpen(Arc::new(e.clone())),
            Source::FailClosed(e) => return Self::FailedClosed(Arc::new(e.clone())),
            Source::DenyCache => Origin::DenyCache,
            Source::Fallback(_) => Origin::Fallback,
            Source::Lease => Origin::Lease,
            Source::Redis | Source::NoLayer => Origin::Remote,
        };
        Self::Decided {
            decision: *answer.stack(),
            origin,
            at_unix_us: answer.decided_at_micros(),
        }
    }
}

impl<R: Sync + 'static> AsyncLimiter<R> for RedisStack<R> {
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
        Decide::Later(Box::pin(async move {
            self.check_n(request, cost)
                .await
                .map(Outcome::from)
                .map_err(limiter_stack::CallError::from)
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

    fn ask<'a>(
        &'a self,
        request: &'a R,
        ask: Ask,
    ) -> Decide<'a, Result<Asked, limiter_stack::CallError>> {
        Decide::Later(Box::pin(ask_per_call(self, request, ask)))
    }

    fn refund<'a>(
        &'a self,
        request: &'a R,
        held: Held,
    ) -> Pending<'a, Result<Outcome, limiter_stack::CallError>> {
        Box::pin(refund(self, request, held))
    }
}

/// An ask of a per-call stack (a leased stack's takes and refunds go to Redis this way too):
/// each in one script call; a give-back Redis did not take answers the store's failure.
pub(crate) async fn ask_per_call<R>(
    stack: &RedisStack<R>,
    request: &R,
    ask: Ask,
) -> Result<Asked, limiter_stack::CallError> {
    let cost = ask.cost;
    let (decision, held) = match ask.charge {
        Charge::Take => (stack.check_n(request, cost).await?, None),
        Charge::TakeHeld => {
            let (decision, grant) = stack.acquire(request, cost).await?;
            (decision, grant.map(|g| Held::new(g.left(), g)))
        }
        Charge::Record => (stack.record(request, cost).await?, None),
        Charge::GiveBack => match stack.give_back(request, cost).await {
            Ok(decision) => (decision, None),
            Err(e) => {
                return Ok(Asked {
                    outcome: Outcome::FailedClosed(Arc::new(e)),
                    held: None,
                });
            }
        },
    };
    Ok(Asked {
        outcome: Outcome::from(decision),
        held,
    })
}

/// A refund of what a per-call stack's take held, in one script call; a refund Redis did not
/// take answers the store's failure (the units stay counted, never given back twice).
pub(crate) async fn refund<R>(
    stack: &RedisStack<R>,
    request: &R,
    held: Held,
) -> Result<Outcome, limiter_stack::CallError> {
    let refused = |reason: String| limiter_stack::CallError::Refund { reason };
    let Ok(mut grant) = held.into_grant::<RedisGrant>() else {
        return Err(refused(
            "the grant came from another kind of limiter; refund it where it was taken".into(),
        ));
    };
    let units = grant.left();
    match stack.refund(request, &mut grant, units).await {
        Ok(decision) => Ok(Outcome::from(decision)),
        Err(RefundError::Backend(e)) => Ok(Outcome::FailedClosed(Arc::new(e))),
        Err(other) => Err(refused(other.to_string())),
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
        items.len() == stacks.len() && items.iter().all(|item| item.charge != Charge::GiveBack);
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
        Err(BatchError::Call { source, .. }) => Err(source.into()),
        // Keys in several slots of a cluster, or stacks on several backends: no one script
        // call can decide it, so each item in turn, with refunds.
        Err(BatchError::CrossSlot { .. } | BatchError::OtherBackend { .. }) => {
            decide_all(items, at).await
        }
    }
}
