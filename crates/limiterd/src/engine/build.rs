//! A policy's stack for the engine's store (in process, on Redis, or leased), carried over
//! on reload when it can keep its counters, and the stacks of ad-hoc shapes.

use std::sync::Arc;

use limiter_core::{Clock, Limit, LimitError};
use limiter_redis::{Kind, RedisLayer, RedisStack};
use limiter_stack::{Layer, Plan, Stack};

use crate::config::{CheckedLimit, Keying, Policy, PolicyLimit};

use super::*;

/// An in-process layer: `limits` as its first plan, open to [`RELOAD_PLANS`] more (a reload's
/// changed limits), the one a call's `plan` names applied.
pub(super) fn memory_layer(
    name: &str,
    keying: Keying,
    limits: &[&PolicyLimit],
) -> Layer<Call, Arc<str>> {
    let mut layer = match keying {
        Keying::Identifier => Layer::keyed(name, |c: &Call| Some(Arc::clone(&c.identifier))),
        Keying::Global => Layer::global(name),
    };
    for l in limits {
        layer = layer.limit(l.limit.kind(), l.limit.limit());
    }
    layer.open_plans(RELOAD_PLANS, limits.len(), |c: &Call| c.plan)
}

/// Whether two policies' layers have the same shape: the same keyings, in order, with the
/// same number of limits each (what a new plan of the same layers can hold).
pub(super) fn same_shape(a: &Policy, b: &Policy) -> bool {
    let shape = |p: &Policy| -> Vec<(Keying, usize)> {
        groups(p).iter().map(|(k, l)| (*k, l.len())).collect()
    };
    shape(a) == shape(b)
}

pub(super) fn redis_layer(name: &str, keying: Keying, limits: &[&PolicyLimit]) -> RedisLayer<Call> {
    let mut layer = match keying {
        Keying::Identifier => {
            RedisLayer::keyed(name, |c: &Call| Some(c.identifier.as_ref().to_owned()))
        }
        Keying::Global => RedisLayer::global(name),
    };
    for l in limits {
        layer = layer.limit(l.limit.kind(), l.limit.limit());
    }
    layer
}

/// The limits of `policy` grouped by keying, identifier first.
pub(super) fn groups(policy: &Policy) -> Vec<(Keying, Vec<&PolicyLimit>)> {
    [Keying::Identifier, Keying::Global]
        .into_iter()
        .map(|k| {
            (
                k,
                policy
                    .limits
                    .iter()
                    .filter(|l| l.keying == k)
                    .collect::<Vec<_>>(),
            )
        })
        .filter(|(_, limits)| !limits.is_empty())
        .collect()
}

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    pub(super) fn build(
        &self,
        stack_name: &str,
        policy: &Policy,
    ) -> Result<Backend<C>, EngineError> {
        let groups = groups(policy);
        let layer_name = |k: Keying| match k {
            Keying::Identifier => "identifier",
            Keying::Global => "global",
        };
        match &self.store {
            StoreHandle::Memory { max_keys } => {
                let mut builder = Stack::builder().clock(self.clock.clone());
                if let Some(max_keys) = max_keys {
                    builder = builder.max_keys(*max_keys);
                }
                for (keying, limits) in &groups {
                    builder = builder.layer(memory_layer(layer_name(*keying), *keying, limits));
                }
                builder
                    .build()
                    .map(Backend::Memory)
                    .map_err(|source| EngineError::Memory {
                        policy: stack_name.to_owned(),
                        source,
                    })
            }
            StoreHandle::Redis(backend, _, fleet) => {
                let mut builder = RedisStack::builder(backend, stack_name)
                    .prefix("limiterd")
                    .on_failure(policy.on_failure)
                    .fleet_size(*fleet);
                for (keying, limits) in &groups {
                    builder = builder.layer(redis_layer(layer_name(*keying), *keying, limits));
                }
                // On a cluster, keys follow each identifier (spread over the masters); a
                // lease takes every limit in one script, so a leased policy of several
                // groups keeps its keys in one slot (leases keep its traffic to Redis low).
                if policy.lease.is_some() && groups.len() > 1 {
                    builder = builder.tag_by_stack();
                }
                let refused = |source| EngineError::Redis {
                    policy: stack_name.to_owned(),
                    source,
                };
                let stack = builder.build().map_err(refused)?;
                match policy.lease {
                    None => Ok(Backend::Redis(stack)),
                    Some(lease) => stack.leased(lease).map(Backend::Leased).map_err(refused),
                }
            }
        }
    }

    /// During a reload, the stack and plan `stack_name` had, if its counters can go on under
    /// `policy`: the same stack for the same limits; in process, a new plan of its layers for
    /// changed limits of the same shape. Records what it did in [`Carried`].
    pub(super) fn carry_over(
        &mut self,
        name: &str,
        stack_name: &str,
        policy: &Policy,
    ) -> Option<(Arc<Backend<C>>, usize)> {
        let previous = self.previous.as_mut()?;
        let Some((spec, backend, plan)) = previous.entries.remove(stack_name) else {
            previous.carried.fresh.push(name.to_owned());
            return None;
        };
        let redis_changed = match (&self.store, backend.as_ref()) {
            (StoreHandle::Redis(..), Backend::Redis(_) | Backend::Leased(_)) => {
                previous.store_changed
            }
            (StoreHandle::Memory { .. }, Backend::Memory(_)) => false,
            _ => true,
        };
        if spec == *policy && !redis_changed {
            previous.carried.kept.push(name.to_owned());
            return Some((backend, plan));
        }
        match backend.as_ref() {
            // Keys are named by stack, layer and place: a new stack finds them in Redis, and
            // the script rescales those written under other limits. (A leased stack's leases
            // stay with the old stack until they expire.)
            Backend::Redis(_) | Backend::Leased(_) => {
                let carried = &mut previous.carried;
                if spec.limits == policy.limits {
                    carried.kept.push(name.to_owned());
                } else {
                    carried.rescaled.push(name.to_owned());
                }
                None
            }
            Backend::Memory(stack) if same_shape(&spec, policy) => {
                let mut plans = groups(policy)
                    .into_iter()
                    .enumerate()
                    .map(|(i, (_, limits))| {
                        let plan = limits
                            .iter()
                            .fold(Plan::new(format!("reload of {name}")), |p, l| {
                                p.limit(l.limit.kind(), l.limit.limit())
                            });
                        stack.add_plan(i, plan)
                    });
                let first = plans.next()?.ok();
                // Every layer gains its plan in step, so one index names them all.
                let lockstep = plans.all(|p| p.ok() == first);
                match first {
                    Some(index) if lockstep => {
                        previous.carried.rescaled.push(name.to_owned());
                        Some((backend, index))
                    }
                    _ => {
                        tracing::warn!(
                            policy = name,
                            "a policy's limits changed more than {RELOAD_PLANS} times: its counters start afresh"
                        );
                        previous.carried.fresh.push(name.to_owned());
                        None
                    }
                }
            }
            Backend::Memory(_) => {
                previous.carried.fresh.push(name.to_owned());
                None
            }
        }
    }

    pub(super) fn ad_hoc_backend(
        &self,
        kind: Kind,
        limit: u64,
        duration_ms: u64,
    ) -> Result<AdHocStack<C>, DecideError> {
        let shape = (kind, limit, duration_ms);
        if let Some(found) = self.ad_hoc.read().ok().and_then(|m| m.get(&shape).cloned()) {
            return Ok(found);
        }
        let mut map = self
            .ad_hoc
            .write()
            .map_err(|_| DecideError::Unavailable("a poisoned lock".into()))?;
        if let Some(found) = map.get(&shape) {
            return Ok(found.clone());
        }
        if map.len() >= MAX_AD_HOC_SHAPES {
            return Err(DecideError::TooManyShapes);
        }
        let invalid = |field: &'static str, message: String| DecideError::Invalid {
            field,
            message: format!("`limit` per `duration_ms`: {message}"),
        };
        let limit = Limit::new(limit, std::time::Duration::from_millis(duration_ms));
        let checked = CheckedLimit::new(kind, limit, self.store_kind()).map_err(|e| match e {
            LimitError::ZeroPeriod | LimitError::PeriodTooLong { .. } => {
                invalid("duration_ms", e.to_string())
            }
            _ => invalid("limit", e.to_string()),
        })?;
        let memory = self.ad_hoc_memory.as_ref().and_then(|m| match m.as_ref() {
            Backend::Memory(stack) => Some((m, stack)),
            Backend::Redis(_) | Backend::Leased(_) => None,
        });
        let found = match memory {
            Some((memory, stack)) => {
                let name = format!("{} per {duration_ms} ms", checked.limit().count());
                let plan = stack
                    .add_plan(0, Plan::new(name).limit(kind, checked.limit()))
                    .map_err(|e| match e {
                        limiter_stack::BuildError::PlansFull { .. } => DecideError::TooManyShapes,
                        other => invalid("limit", other.to_string()),
                    })?;
                (Arc::clone(memory), plan)
            }
            None => {
                let policy = Policy {
                    limits: vec![PolicyLimit {
                        limit: checked,
                        keying: Keying::Identifier,
                    }],
                    on_failure: self.default_failure(),
                    lease: None,
                };
                let backend = self
                    .build(AD_HOC_STACK, &policy)
                    .map_err(|e| invalid("limit", e.to_string()))?;
                (Arc::new(backend), 0)
            }
        };
        map.insert(shape, found.clone());
        Ok(found)
    }
}
