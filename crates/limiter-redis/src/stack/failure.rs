//! What a call does when Redis cannot decide ([`OnFailure`]): admit, refuse, or decide on a
//! local stack with the same limits, each node's share of them when a fleet shares Redis.

use std::sync::Arc;

use limiter_core::Limit;
use limiter_stack::{Grant, LayerAnswers};

use super::*;
use crate::backend::RedisBackend;
use limiter_stack::Origin;

use crate::decision::{Answered, RedisDecision};
use crate::error::{BackendError, BuildError, RefundError};

/// What a limiter does when Redis fails, times out, or its circuit breaker is open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnFailure {
    /// Admit the call ([`RedisDecision::failed_open`]).
    Open,
    /// Refuse the call ([`RedisDecision::failed_closed`]); not reported as over the limit.
    Closed,
    /// Decide on a local in-memory stack with the same limits ([`Origin::Fallback`]). By
    /// default each node then enforces the whole limit on its own, so a fleet of `n` admits up
    /// to `n` times it while Redis is out; give the builder the fleet's size
    /// ([`RedisStackBuilder::fleet_size`]) and each node enforces its share, `1/n` of each
    /// limit, so the fleet admits at most the limit between them (plus what Redis had admitted
    /// in the current window or burst before it went out).
    #[default]
    Fallback,
}

/// A Redis layer's keyer, shared with its local fallback layer.
struct SharedKeyer<R>(Keyer<R>);

impl<R> limiter_stack::Keyer<R, String> for SharedKeyer<R> {
    fn key(&self, request: &R) -> Option<String> {
        self.0.key(request)
    }

    fn key_name(&self) -> Option<&'static str> {
        self.0.key_name()
    }
}

/// A node's share of `limit` in a fleet of `fleet`: count and burst divided, rounded down.
pub(super) fn share(stack: &str, limit: Limit, fleet: u64) -> Result<Limit, BuildError> {
    let refused = |reason: String| BuildError::FleetSize {
        stack: stack.to_owned(),
        fleet,
        reason,
    };
    if fleet == 0 {
        return Err(refused("which counts no node; give 1 or more".to_owned()));
    }
    let (count, burst) = (limit.count() / fleet, limit.burst() / fleet);
    if count == 0 || burst == 0 {
        return Err(refused(format!(
            "which leaves each node no unit of {limit}; give a fleet size of at most {}, or a larger limit",
            limit.count().min(limit.burst())
        )));
    }
    Ok(Limit::from_nanos(count, limit.period_nanos()).with_burst(burst))
}

/// The in-memory stack with the same layers (and plans) and each node's share of their
/// limits, on the backend's local clock.
pub(super) fn local_stack<R: 'static>(
    stack: &str,
    layers: &[LayerSpec<R>],
    backend: &RedisBackend,
    fleet: u64,
) -> Result<Fallback<R>, BuildError> {
    let mut builder = limiter_stack::Stack::builder();
    for layer in layers {
        let local = match &layer.keyer {
            Some(keyer) => {
                let keyer = Arc::clone(keyer);
                limiter_stack::Layer::keyed(layer.name.clone(), SharedKeyer(keyer))
            }
            None => limiter_stack::Layer::global(layer.name.clone()),
        };
        let mut plans = Vec::with_capacity(layer.plans.len());
        for (index, limits) in layer.plans.iter().enumerate() {
            let mut plan = limiter_stack::Plan::new(format!("{index}"));
            for limit in limits {
                let shared = share(stack, limit.limit(), fleet)?;
                limit.kind().check(shared).map_err(|e| BuildError::Limit {
                    owner: format!("layer `{}`", layer.name),
                    source: limiter_core::LimitError::Unsupported {
                        algorithm: limit.kind().name(),
                        reason: format!("the local fallback cannot hold it: {e}"),
                    },
                })?;
                plan = plan.limit(limit.kind(), shared);
            }
            plans.push(plan);
        }
        let local = match &layer.choose {
            Some(choose) => {
                let choose = Arc::clone(choose);
                local.plans(plans, move |request: &R| choose(request))
            }
            None => local.plans(plans, |_: &R| 0),
        };
        builder = builder.layer(local);
    }
    builder
        .clock(backend.local_clock())
        .build()
        .map_err(|e| BuildError::NoLimits {
            layer: format!("(local fallback: {e})"),
        })
}

impl<R> RedisStack<R> {
    /// The failure policy's answer for `call`: as [`on_failure`](Self::on_failure) for a
    /// check; for a record, the fallback records on the local stack, and fail open and fail
    /// closed record nothing.
    pub(crate) fn on_failure_of(
        &self,
        request: &R,
        call: &Prepared,
        error: BackendError,
    ) -> RedisDecision {
        if !call.record {
            return self.on_failure(request, call.cost, error);
        }
        match (&self.fallback, self.on_failure) {
            (Some(local), OnFailure::Fallback) => {
                let mut each = LayerAnswers::new();
                let now = local.clock().now();
                match local.record_at_each(request, call.cost, now, &mut each) {
                    Ok(_) => RedisDecision::fell_back(each, error),
                    Err(_) => self.on_failure(request, call.cost, error),
                }
            }
            _ => self.on_failure(request, call.cost, error),
        }
    }

    /// Says, at debug level, that the failure policy answers for `error`.
    fn log_failure(&self, error: &BackendError) {
        tracing::debug!(
            target: "limiter_redis::stack",
            stack = %self.name,
            policy = ?self.on_failure,
            error = %error,
            "Redis could not decide: the failure policy answers"
        );
    }

    /// The failure policy's answer (a fallback's grant not kept: what it took stays taken).
    pub(crate) fn on_failure(&self, request: &R, cost: u64, error: BackendError) -> RedisDecision {
        self.on_failure_granted(request, cost, error).0
    }

    /// The failure policy's answer for one member of an all-or-nothing batch, at the local
    /// clock reading `now`: a fallback decision keeps its [`Grant`], so a batch another member
    /// denied can give it back.
    pub(crate) fn on_failure_held(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        error: BackendError,
    ) -> (RedisDecision, Option<Grant>) {
        let mut each = LayerAnswers::new();
        match (&self.fallback, self.on_failure) {
            (Some(local), OnFailure::Fallback) => {
                match local.decide_at_each(request, cost, now, &mut each) {
                    Ok((_, grant)) => (RedisDecision::fell_back(each, error), grant),
                    Err(_) => (RedisDecision::by_policy(false, error), None),
                }
            }
            (_, OnFailure::Open) => (RedisDecision::by_policy(true, error), None),
            _ => (RedisDecision::by_policy(false, error), None),
        }
    }

    /// The failure policy's answer to a take of `cost` units Redis could not decide, now by
    /// the local clock: as [`on_failure`](Self::on_failure), with the fallback's [`Grant`]
    /// when it took the units, so they can come back (see [`RedisStack::acquire`]).
    pub(crate) fn on_failure_granted(
        &self,
        request: &R,
        cost: u64,
        error: BackendError,
    ) -> (RedisDecision, Option<Grant>) {
        self.log_failure(&error);
        let now = self
            .fallback
            .as_ref()
            .map_or(0, |local| local.clock().now());
        self.on_failure_held(request, cost, now, error)
    }

    /// Gives back `units` of what the local fallback took under `grant` (it decided because
    /// of `error`) and answers what `request` holds on it after (a peek).
    pub(crate) fn refund_on_fallback(
        &self,
        request: &R,
        grant: &mut Grant,
        units: u64,
        error: &BackendError,
    ) -> Result<RedisDecision, RefundError> {
        let Some(local) = &self.fallback else {
            return Err(RefundError::WrongStack);
        };
        local.refund(request, grant, units).map_err(|e| match e {
            limiter_stack::RefundError::ExceedsGrant { units, left, taken } => {
                RefundError::ExceedsGrant { units, left, taken }
            }
            limiter_stack::RefundError::WrongStack => RefundError::WrongStack,
            limiter_stack::RefundError::Call(e) => RefundError::Call(e),
            // An in-process stack's refund has no backend to fail; any kind added later is
            // reported, not dropped.
            other => RefundError::Backend(BackendError::BadReply(format!(
                "the local fallback refused the refund: {other}"
            ))),
        })?;
        let mut each = LayerAnswers::new();
        local.check_each(request, 0, &mut each)?;
        Ok(RedisDecision::fell_back(each, error.clone()))
    }

    /// Gives back everything `grant` holds on the local fallback (a fallback batch another
    /// member denied).
    pub(crate) fn refund_fallback(&self, request: &R, mut grant: Grant) {
        if let Some(local) = &self.fallback {
            let units = grant.left();
            // A grant from this very stack, with its own units: the refund cannot fail.
            let _ = local.refund(request, &mut grant, units);
        }
    }

    /// Replaces a fallback decision by what `request` holds on the local fallback at `now` (a
    /// peek), once a denied batch's grants are back.
    pub(crate) fn peek_fallback(&self, request: &R, now: u64, decision: &mut RedisDecision) {
        if let (Some(local), Some(Origin::Fallback), Some(e)) =
            (&self.fallback, decision.origin(), decision.backend_error())
            && let mut each = LayerAnswers::new()
            && let Ok(_) = local.decide_at_each(request, 0, now, &mut each)
        {
            let fallback = Answered::Decided(Origin::Fallback, Some(Box::new(e.clone())));
            *decision = RedisDecision::new(each, fallback);
        }
    }

    pub(super) fn on_failure_without_request(&self) -> RedisDecision {
        let error = BackendError::BadReply("the batch lost a call".to_owned());
        RedisDecision::by_policy(false, error)
    }
}
