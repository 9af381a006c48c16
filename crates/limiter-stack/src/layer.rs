//! [`Layer`] and [`Plan`]: what a stack is built from. A layer derives a key from each request
//! (or is global), and enforces one or more limits on it; with several plans, a function picks
//! the plan (the limits) per request.

use std::fmt;
use std::sync::Arc;

use limiter_core::{Algorithm, Limit};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_token_bucket::Gcra;

use crate::algorithms::DynAlgorithm;
use crate::cells::MAX_LIMITS_PER_LAYER;
use crate::error::{BuildError, CallError};
use crate::keyer::Keyer;
use crate::kind::Kind;

/// A named set of limits one layer enforces together on a key, such as `free: 10/s and 100/min`.
pub struct Plan {
    pub(crate) name: String,
    pub(crate) limits: Vec<Box<dyn DynAlgorithm>>,
    /// The first limit its algorithm refused, reported by the stack's `build()`.
    pub(crate) refused: Option<BuildError>,
}

impl Plan {
    /// An empty plan called `name`; add limits with [`limit`](Self::limit).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            limits: Vec::new(),
            refused: None,
        }
    }

    /// Adds `limit`, enforced with the built-in algorithm `kind`. A limit it refuses is
    /// reported once, by the stack's [`build`](crate::StackBuilder::build).
    pub fn limit(self, kind: Kind, limit: Limit) -> Self {
        match kind {
            Kind::TokenBucket => self.limit_with::<Gcra>(limit),
            Kind::SlidingWindow => self.limit_with::<SlidingCounter>(limit),
            Kind::FixedWindow => self.limit_with::<FixedCounter>(limit),
        }
    }

    /// Adds `limit`, enforced with algorithm `A` (one of your own, or a built-in one by type).
    /// A limit `A` refuses is reported once, by the stack's
    /// [`build`](crate::StackBuilder::build).
    pub fn limit_with<A: Algorithm + 'static>(mut self, limit: Limit) -> Self {
        match A::new(limit) {
            Ok(algorithm) => self.limits.push(Box::new(algorithm)),
            Err(source) => {
                self.refused.get_or_insert(BuildError::Limit {
                    owner: format!("plan `{}`", self.name),
                    source,
                });
            }
        }
        self
    }

    /// The plan's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The limits, in the order they were added.
    pub fn limits(&self) -> impl Iterator<Item = &Limit> {
        self.limits.iter().map(|a| a.limit())
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let limits: Vec<String> = self
            .limits
            .iter()
            .map(|a| format!("{} ({})", a.limit(), a.name()))
            .collect();
        f.debug_struct("Plan")
            .field("name", &self.name)
            .field("limits", &limits)
            .finish()
    }
}

type PlanFn<R> = Arc<dyn Fn(&R) -> usize + Send + Sync>;

/// How a layer finds the key a request is limited under.
pub(crate) enum KeySource<R, K> {
    /// One state for every request.
    Global,
    /// A state per key; `None` means the layer does not apply to the request.
    Keyed(Arc<dyn Keyer<R, K>>),
}

/// One layer of a stack: a keyer and the plans it chooses among.
pub struct Layer<R, K> {
    pub(crate) name: String,
    pub(crate) keyer: KeySource<R, K>,
    pub(crate) plans: Vec<Plan>,
    pub(crate) choose: Option<PlanFn<R>>,
}

impl<R, K> Layer<R, K> {
    /// The plan this layer's plan function chooses for `request` (the first with none), or the
    /// error naming the layer when it chooses one that does not exist.
    #[inline]
    pub(crate) fn plan_for(&self, request: &R) -> Result<usize, CallError> {
        let plan = match &self.choose {
            None => 0,
            Some(choose) => choose(request),
        };
        if plan >= self.plans.len() {
            return Err(CallError::NoSuchPlan {
                layer: self.name.clone(),
                chosen: plan,
                plans: self.plans.len(),
            });
        }
        Ok(plan)
    }

    /// A layer with one state per key, the key derived from each request by `keyer` (per user,
    /// per IP, per API key): a closure `|r: &Request| Some(r.user)`, or a [`Keyer`] that reads
    /// a named key (the middleware's `by_key("ip")`). A request for which `keyer` returns
    /// `None` skips the layer.
    pub fn keyed(name: impl Into<String>, keyer: impl Keyer<R, K> + 'static) -> Self {
        Self::with_keyer(name.into(), KeySource::Keyed(Arc::new(keyer)))
    }

    /// A layer with one state shared by every request: a global cap.
    pub fn global(name: impl Into<String>) -> Self {
        Self::with_keyer(name.into(), KeySource::Global)
    }

    fn with_keyer(name: String, keyer: KeySource<R, K>) -> Self {
        Self {
            name,
            keyer,
            plans: Vec::new(),
            choose: None,
        }
    }

    /// Adds `limit` (decided by the built-in algorithm `kind`) to the layer's single plan. Several
    /// limits on one layer (10 per second and 100 per minute) are decided together, all or nothing.
    /// A limit it refuses is reported once, by the stack's
    /// [`build`](crate::StackBuilder::build), naming the layer.
    pub fn limit(self, kind: Kind, limit: Limit) -> Self {
        self.add_to_plan(|plan| plan.limit(kind, limit))
    }

    /// Like [`limit`](Self::limit), with algorithm `A` named by type (one of your own).
    pub fn limit_with<A: Algorithm + 'static>(self, limit: Limit) -> Self {
        self.add_to_plan(|plan| plan.limit_with::<A>(limit))
    }

    /// Adds to the layer's single plan (named after the layer), a refusal naming the layer.
    fn add_to_plan(mut self, add: impl FnOnce(Plan) -> Plan) -> Self {
        let plan = match self.plans.pop() {
            Some(plan) => plan,
            None => Plan::new(self.name.clone()),
        };
        let mut plan = add(plan);
        plan.refused = plan.refused.map(|e| e.in_layer(&self.name));
        self.plans.push(plan);
        self
    }

    /// Replaces the layer's limits with `plans`, one chosen per request by `choose` (an index
    /// into `plans`: by customer tier, by HTTP method, by route). Every plan has the same number
    /// of limits. When the plan chosen for a key changes, the key keeps its consumption, as
    /// the same fraction of each new limit (rounded up).
    pub fn plans(
        mut self,
        plans: impl IntoIterator<Item = Plan>,
        choose: impl Fn(&R) -> usize + Send + Sync + 'static,
    ) -> Self {
        self.plans = plans.into_iter().collect();
        self.choose = Some(Arc::new(choose));
        self
    }

    /// The layer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The layer's plans.
    pub fn plan_list(&self) -> &[Plan] {
        &self.plans
    }

    /// Whether the layer is global.
    pub fn is_global(&self) -> bool {
        matches!(self.keyer, KeySource::Global)
    }

    /// The name of the request key the layer's keyer reads, when it reads one by name
    /// ([`Keyer::key_name`]); `None` for global layers and closures.
    pub fn key_name(&self) -> Option<&'static str> {
        match &self.keyer {
            KeySource::Global => None,
            KeySource::Keyed(keyer) => keyer.key_name(),
        }
    }

    pub(crate) fn validate(&self) -> Result<(), BuildError> {
        let layer = || self.name.clone();
        let Some(first) = self.plans.first() else {
            return Err(BuildError::NoLimits { layer: layer() });
        };
        if self.plans.len() > crate::cells::MAX_PLANS {
            return Err(BuildError::TooManyPlans {
                layer: layer(),
                plans: self.plans.len(),
                max: crate::cells::MAX_PLANS,
            });
        }
        for plan in &self.plans {
            if let Some(refused) = &plan.refused {
                return Err(refused.clone());
            }
            if plan.limits.is_empty() {
                return Err(BuildError::NoLimits { layer: layer() });
            }
            if plan.limits.len() > MAX_LIMITS_PER_LAYER {
                return Err(BuildError::TooManyLimits {
                    layer: layer(),
                    limits: plan.limits.len(),
                    max: MAX_LIMITS_PER_LAYER,
                });
            }
            if plan.limits.len() != first.limits.len() {
                return Err(BuildError::PlanShape {
                    layer: layer(),
                    plan: plan.name.clone(),
                    limits: plan.limits.len(),
                    expected: first.limits.len(),
                });
            }
        }
        Ok(())
    }
}

impl<R, K> fmt::Debug for Layer<R, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Layer")
            .field("name", &self.name)
            .field("global", &self.is_global())
            .field("plans", &self.plans)
            .finish_non_exhaustive()
    }
}
