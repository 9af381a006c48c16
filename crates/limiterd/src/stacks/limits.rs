//! A policy's limits as a stack's layers and plans, whatever the store: each limit by its
//! algorithm's kind or, for a calendar window, an algorithm built here; and the stack of a
//! policy with no rate limits at all.

use limiter_calendar::CalendarCounter;
use limiter_core::{Algorithm, Limit};
use limiter_stack::{
    Ask, AsyncLimiter, CallError, Charges, Decide, HoldsKeys, Kind, Layer, LayerInfo, OpenPlans,
    Outcome, Plan, StackDecision, Taken,
};

use super::Call;
use crate::config::{Keying, Policy, PolicyLimit};

/// The stack of a policy with no rate limits (a concurrency limit alone): admits every call,
/// counts nothing, holds no key.
#[derive(Debug)]
pub(super) struct NoRateLimits;

impl AsyncLimiter<Call> for NoRateLimits {
    fn decide_request<'a>(&'a self, _: &'a Call, _: u64) -> Decide<'a> {
        Decide::Now(Ok(Outcome::in_process(StackDecision::new())))
    }

    fn layers(&self) -> Vec<LayerInfo> {
        Vec::new()
    }
}

impl Charges<Call> for NoRateLimits {
    fn ask<'a>(&'a self, call: &'a Call, ask: Ask) -> Decide<'a> {
        self.decide_request(call, ask.cost)
    }

    fn take_undoable<'a>(
        &'a self,
        call: &'a Call,
        cost: u64,
        _: Option<u64>,
    ) -> Decide<'a, Result<Taken<'a>, CallError>> {
        self.decide_request(call, cost).map(|answer| {
            answer.map(|outcome| Taken {
                outcome,
                undo: None,
            })
        })
    }
}

impl HoldsKeys for NoRateLimits {
    fn keys_held(&self) -> u64 {
        0
    }
}

impl OpenPlans for NoRateLimits {
    fn add_plan(&self, layer: usize, _: Plan) -> Result<usize, limiter_stack::BuildError> {
        Err(limiter_stack::BuildError::NotOpen {
            layer: format!("{layer} (a policy without rate limits)"),
        })
    }
}

/// One layer of a policy's definition, the same for every store but its key's type: named by
/// its keying, keyed by `key` (or global), with `limits` in order.
pub(super) fn layer<K: 'static>(
    keying: Keying,
    limits: &[&PolicyLimit],
    unix_origin_ns: u64,
    key: impl Fn(&Call) -> Option<K> + Send + Sync + 'static,
) -> Layer<Call, K> {
    let layer = match keying {
        Keying::Identifier => Layer::keyed(keying.layer_name(), key),
        Keying::Global => Layer::global(keying.layer_name()),
    };
    limits
        .iter()
        .fold(layer, |layer, l| with_limit(layer, l, unix_origin_ns))
}

/// What takes a policy's limits: a layer, or a plan of one.
pub(crate) trait TakesLimits: Sized {
    fn limit(self, kind: Kind, limit: Limit) -> Self;
    fn algorithm<A: Algorithm + 'static>(self, algorithm: A) -> Self;
    fn limit_with<A: Algorithm + 'static>(self, limit: Limit) -> Self;
}

impl<K: 'static> TakesLimits for Layer<Call, K> {
    fn limit(self, kind: Kind, limit: Limit) -> Self {
        Layer::limit(self, kind, limit)
    }
    fn algorithm<A: Algorithm + 'static>(self, algorithm: A) -> Self {
        Layer::algorithm(self, algorithm)
    }
    fn limit_with<A: Algorithm + 'static>(self, limit: Limit) -> Self {
        Layer::limit_with::<A>(self, limit)
    }
}

impl TakesLimits for Plan {
    fn limit(self, kind: Kind, limit: Limit) -> Self {
        Plan::limit(self, kind, limit)
    }
    fn algorithm<A: Algorithm + 'static>(self, algorithm: A) -> Self {
        Plan::algorithm(self, algorithm)
    }
    fn limit_with<A: Algorithm + 'static>(self, limit: Limit) -> Self {
        Plan::limit_with::<A>(self, limit)
    }
}

/// `target` with the policy limit `l`: a built-in algorithm by its kind, or a calendar window
/// whose windows start at the clock's reading for their local midnight (the clock's reading 0
/// is `unix_origin_ns`).
pub(crate) fn with_limit<T: TakesLimits>(target: T, l: &PolicyLimit, unix_origin_ns: u64) -> T {
    let Some(spec) = l.limit.calendar() else {
        return target.limit(l.limit.kind(), l.limit.limit());
    };
    let counter = spec
        .calendar()
        .ok()
        .and_then(|c| CalendarCounter::new(l.limit.limit().count(), c, unix_origin_ns).ok());
    match counter {
        Some(counter) => target.algorithm(counter),
        // Checked when the file was read; should it fail now, the stack's build says why.
        None => target.limit_with::<CalendarCounter>(l.limit.limit()),
    }
}

/// The limits of `policy` grouped by keying, identifier first: its layers, in order (a
/// calendar quota on Redis is kept beside the stack, not in a layer).
pub fn groups(policy: &Policy) -> Vec<(Keying, Vec<&PolicyLimit>)> {
    [Keying::Identifier, Keying::Global]
        .into_iter()
        .map(|k| {
            let limits = policy
                .limits
                .iter()
                .filter(|l| l.keying == k && !l.limit.is_quota_beside_stack())
                .collect();
            (k, limits)
        })
        .filter(|(_, limits): &(Keying, Vec<&PolicyLimit>)| !limits.is_empty())
        .collect()
}

/// The calendar quotas of `policy` kept beside its stack on Redis (whose script knows no
/// calendar), in the policy's order: each one's count, keying, calendar, and place among its
/// keying's limits (as the layer holding them all in memory numbers them).
pub(crate) fn quotas_beside(
    policy: &Policy,
    stack_name: &str,
) -> Result<Vec<(u64, Keying, limiter_calendar::Calendar, usize)>, limiter_stack::BuildError> {
    let place = |quota: &PolicyLimit| {
        policy
            .limits
            .iter()
            .filter(|l| l.keying == quota.keying)
            .position(|l| std::ptr::eq(l, quota))
            .unwrap_or(0)
    };
    let beside = policy
        .limits
        .iter()
        .filter(|l| l.limit.is_quota_beside_stack());
    beside
        .filter_map(|l| Some((l, l.limit.calendar()?)))
        .map(|(l, spec)| {
            let calendar = spec
                .calendar()
                .map_err(|e| limiter_stack::BuildError::Quota {
                    name: stack_name.to_owned(),
                    reason: e.to_string(),
                })?;
            Ok((l.limit.limit().count(), l.keying, calendar, place(l)))
        })
        .collect()
}
