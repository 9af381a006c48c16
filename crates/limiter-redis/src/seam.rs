//! The Redis stack behind the workspace's one seam, [`limiter_stack::AsyncLimiter`]: its
//! answers map to an [`Outcome`] once, here, for every adapter (the tower middleware,
//! limiterd), and its errors to the stack's [`CallError`](limiter_stack::CallError).

use std::sync::Arc;

use limiter_core::DecisionError;
use limiter_stack::{AsyncLimiter, Decide, LayerInfo, Origin, Outcome};

use crate::{CallError, RedisDecision, RedisStack, Source};

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
        }
    }
}

impl<R: Sync> AsyncLimiter<R> for RedisStack<R> {
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
        Decide::Later(Box::pin(async move {
            self.check_n(request, cost)
                .await
                .map(Outcome::from)
                .map_err(limiter_stack::CallError::from)
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
