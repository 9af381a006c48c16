//! A policy's stack carried over on reload when it can keep its counters, and the stacks of
//! ad-hoc shapes: both through the seam, whatever the store.

use limiter_core::{Clock, Limit, LimitError};
use limiter_stack::{BuildError, Plan};

use crate::config::{CheckedLimit, Keying, Policy, PolicyLimit};
use crate::stacks::groups;

use super::shapes::Found;
use super::*;

/// Whether two policies' layers have the same shape: the same keyings, in order, with the
/// same number of limits each (what a new plan of the same layers can hold).
fn same_shape(a: &Policy, b: &Policy) -> bool {
    let shape = |p: &Policy| -> Vec<(Keying, usize)> {
        groups(p).iter().map(|(k, l)| (*k, l.len())).collect()
    };
    shape(a) == shape(b)
}

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    /// During a reload, the stack and plan `stack_name` had, if its counters can go on under
    /// `policy`: the same stack for the same limits (and the same store settings); for
    /// changed limits, on a store that names keys (Redis) a new stack that finds them, in
    /// process a new plan of its layers if they keep their shape. Records what it did in
    /// [`Carried`].
    pub(super) fn carry_over(
        &mut self,
        name: &str,
        stack_name: &str,
        policy: &Policy,
    ) -> Option<(PolicyStack, usize)> {
        let names_keys = self.stacks.names_keys();
        let previous = self.previous.as_mut()?;
        let carried = &mut previous.carried;
        let Some((spec, stack, plan)) = previous.entries.remove(stack_name) else {
            carried.fresh.push(name.to_owned());
            return None;
        };
        if spec == *policy && !previous.store_changed {
            carried.kept.push(name.to_owned());
            return Some((stack, plan));
        }
        // The same limits (the failure policy or lease changed): the counters are kept.
        let same_limits = spec.limits == policy.limits && spec.concurrency == policy.concurrency;
        if names_keys {
            // Keys are named by stack, layer and place: a new stack finds them in Redis, and
            // the script rescales those written under other limits. (A leased stack's leases
            // stay with the old stack until they expire.)
            if same_limits {
                carried.kept.push(name.to_owned());
            } else {
                carried.rescaled.push(name.to_owned());
            }
            return None;
        }
        if same_limits && !previous.store_changed {
            // In process a stack is its limits alone: the same ones keep it whole.
            carried.kept.push(name.to_owned());
            return Some((stack, plan));
        }
        if groups(policy).is_empty() && groups(&spec).is_empty() {
            // No rate limit before or after: the policy's counters are its permits, which the
            // store holds whatever the count (a new stack of no layer is built).
            carried.rescaled.push(name.to_owned());
            return None;
        }
        if !same_shape(&spec, policy) {
            carried.fresh.push(name.to_owned());
            return None;
        }
        let mut plans = groups(policy)
            .into_iter()
            .enumerate()
            .map(|(i, (_, limits))| {
                let origin = self.stacks.unix_origin_ns();
                let plan = limits
                    .iter()
                    .fold(Plan::new(format!("reload of {name}")), |p, l| {
                        crate::stacks::with_limit(p, l, origin)
                    });
                match stack.open_plans() {
                    Some(open) => open.add_plan(i, plan),
                    None => Err(BuildError::NotOpen {
                        layer: format!("{i} (a stack whose store names its keys)"),
                    }),
                }
            });
        let first = plans.next()?.ok();
        // Every layer gains its plan in step, so one index names them all.
        let lockstep = plans.all(|p| p.ok() == first);
        match first {
            Some(index) if lockstep => {
                carried.rescaled.push(name.to_owned());
                Some((stack, index))
            }
            _ => {
                tracing::warn!(
                    policy = name,
                    "a policy's limits changed more than {RELOAD_PLANS} times: its counters start afresh"
                );
                carried.fresh.push(name.to_owned());
                None
            }
        }
    }

    /// The stack and plan of the ad-hoc shape `limit` per `duration_ms` counted by `kind`:
    /// found, or added (a plan of the one in-process ad-hoc stack, or a stack of its own on
    /// Redis), up to [`MAX_AD_HOC_SHAPES`].
    #[inline]
    pub(super) fn ad_hoc_stack(
        &self,
        kind: Kind,
        limit: u64,
        duration_ms: u64,
    ) -> Result<Found<'_>, DecideError> {
        let shape = (kind, limit, duration_ms);
        let home = self.ad_hoc_home.as_ref();
        match self.ad_hoc.find(&shape, home) {
            Some(found) => Ok(found),
            None => self
                .ad_hoc
                .find_or_add(shape, home, |shapes| self.add_ad_hoc(shape, shapes)),
        }
    }

    /// Makes the ad-hoc shape `shape`'s stack and plan, the engine holding `shapes` shapes.
    fn add_ad_hoc(&self, shape: Shape, shapes: usize) -> Result<AdHocStack, DecideError> {
        let (kind, limit, duration_ms) = shape;
        if shapes >= MAX_AD_HOC_SHAPES {
            return Err(DecideError::TooManyShapes);
        }
        let invalid = |field: &'static str, message: String| {
            DecideError::invalid(field, format!("the ad-hoc limit: {message}"))
        };
        let limit = Limit::new(limit, std::time::Duration::from_millis(duration_ms));
        let checked = CheckedLimit::new(kind, limit, self.store_kind()).map_err(|e| match e {
            LimitError::ZeroPeriod | LimitError::PeriodTooLong { .. } => {
                invalid("duration_ms", e.to_string())
            }
            _ => invalid("limit", e.to_string()),
        })?;
        match &self.ad_hoc_home {
            Some(home) => {
                let name = format!("{} per {duration_ms} ms", checked.limit().count());
                let plan = home
                    .add_shape(Plan::new(name).limit(kind, checked.limit()))
                    .map_err(|e| match e {
                        BuildError::PlansFull { .. } => DecideError::TooManyShapes,
                        other => invalid("limit", other.to_string()),
                    })?;
                Ok((home.stack().clone(), plan))
            }
            None => {
                let policy = Policy {
                    concurrency: None,
                    limits: vec![PolicyLimit {
                        limit: checked,
                        keying: Keying::Identifier,
                    }],
                    on_failure: self.stacks.default_failure(),
                    lease: None,
                };
                let stack = self
                    .stacks
                    .build(AD_HOC_STACK, &policy)
                    .map_err(|e| invalid("limit", e.to_string()))?;
                Ok((stack, 0))
            }
        }
    }
}
