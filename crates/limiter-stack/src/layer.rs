//! [`Layer`] and [`Plan`]: what a stack is built from. A layer derives a key from each request
//! (or is global), and enforces one or more limits on it; with several plans, a function picks
//! the plan (the limits) per request. An open layer also takes plans while the stack serves
//! ([`Layer::open_plans`], [`Stack::add_plan`](crate::Stack::add_plan)): limits that callers
//! name at run time, each key keeping its consumption when its plan changes.

use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use limiter_core::{Algorithm, Limit, LimitError};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_token_bucket::Gcra;

use crate::algorithms::{DynAlgorithm, PlanLimit};
use crate::cells::MAX_LIMITS_PER_LAYER;
use crate::error::{BuildError, CallError};
use crate::keyer::Keyer;
use crate::kind::Kind;

/// A named set of limits one layer enforces together on a key, such as `free: 10/s and 100/min`.
pub struct Plan {
    pub(crate) name: String,
    pub(crate) limits: Vec<PlanLimit>,
    /// Every limit added, with its built-in algorithm (`None`: one named by type), refused
    /// ones included: what another backend builds the plan from ([`Layer::into_parts`]).
    pub(crate) specs: Vec<(Option<Kind>, Limit)>,
    /// The first limit its algorithm refused, reported by the stack's `build()`.
    pub(crate) refused: Option<BuildError>,
}

impl Plan {
    /// Refused, naming `layer`, where a limit counts by the calendar and the stack's clock does
    /// not keep the wall clock's rate (`wall_rate`).
    fn check_clock(&self, layer: &str, wall_rate: bool) -> Result<(), BuildError> {
        if wall_rate || !self.limits.iter().any(DynAlgorithm::reads_unix_time) {
            return Ok(());
        }
        Err(BuildError::CalendarClock {
            layer: layer.to_owned(),
            plan: self.name.clone(),
        })
    }

    /// An empty plan called `name`; add limits with [`limit`](Self::limit).
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            limits: Vec::new(),
            specs: Vec::new(),
            refused: None,
        }
    }

    /// Adds `limit`, enforced with the built-in algorithm `kind`. A limit it refuses is
    /// reported once, by the stack's [`build`](crate::StackBuilder::build).
    pub fn limit(mut self, kind: Kind, limit: Limit) -> Self {
        self.specs.push((Some(kind), limit));
        match kind {
            Kind::TokenBucket => self.add(Gcra::new(limit), PlanLimit::TokenBucket),
            Kind::SlidingWindow => self.add(SlidingCounter::new(limit), PlanLimit::SlidingWindow),
            Kind::FixedWindow => self.add(FixedCounter::new(limit), PlanLimit::FixedWindow),
        }
    }

    /// Adds `limit`, enforced with algorithm `A` (one of your own, or a built-in one by type).
    /// A limit `A` refuses is reported once, by the stack's
    /// [`build`](crate::StackBuilder::build). (Only limits named by [`Kind`] run on Redis.)
    pub fn limit_with<A: Algorithm + 'static>(mut self, limit: Limit) -> Self {
        self.specs.push((None, limit));
        self.add(A::new(limit), |a| PlanLimit::Other(Box::new(a)))
    }

    /// Adds `algorithm`, already built (one that takes more than a [`Limit`], such as a
    /// calendar window of `limiter-calendar`). It runs in process only: a Redis stack refuses
    /// a plan holding one.
    pub fn algorithm<A: Algorithm + 'static>(mut self, algorithm: A) -> Self {
        self.specs.push((None, *algorithm.limit()));
        self.add(Ok(algorithm), |a| PlanLimit::Other(Box::new(a)))
    }

    /// Adds the limit `built` holds, as `hold` keeps it, or the refusal.
    fn add<A>(mut self, built: Result<A, LimitError>, hold: impl FnOnce(A) -> PlanLimit) -> Self {
        match built {
            Ok(algorithm) => self.limits.push(hold(algorithm)),
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

/// A layer's plan function: the index of the plan a request is decided under.
pub type PlanChooser<R> = Arc<dyn Fn(&R) -> usize + Send + Sync>;
type PlanFn<R> = PlanChooser<R>;

/// A plan no layer has: what [`Layer::plan`] returns for an index no call can hold.
static NO_PLAN: Plan = Plan {
    name: String::new(),
    limits: Vec::new(),
    specs: Vec::new(),
    refused: None,
};

/// The room an open layer keeps for plans added while the stack serves: each slot is filled
/// once, in order, and never changes after, so a call reads it without a lock.
pub(crate) struct OpenPlans {
    slots: Box<[OnceLock<Plan>]>,
    /// Limits in every plan.
    limits: usize,
    /// Slots filled; taken by an adding call only.
    filled: Mutex<usize>,
}

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
    /// Room for plans added while the stack serves, after `plans`.
    pub(crate) open: Option<OpenPlans>,
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
        if plan >= self.plans.len() && self.added(plan).is_none() {
            return Err(CallError::NoSuchPlan {
                layer: self.name.clone(),
                chosen: plan,
                plans: self.plan_count(),
            });
        }
        Ok(plan)
    }

    /// Plan `index`. Every index a call holds was checked by [`plan_for`](Self::plan_for), and
    /// a plan never goes away, so the fallback (a plan with no limits) is never reached.
    #[inline]
    pub(crate) fn plan(&self, index: usize) -> &Plan {
        match self.plans.get(index) {
            Some(plan) => plan,
            None => self.added(index).unwrap_or(&NO_PLAN),
        }
    }

    /// Plan `index` among those added while the stack serves, once it is there.
    #[cold]
    fn added(&self, index: usize) -> Option<&Plan> {
        let open = self.open.as_ref()?;
        open.slots.get(index.checked_sub(self.plans.len())?)?.get()
    }

    /// Plans the layer holds now: those it was built with, then those added since.
    pub fn plan_count(&self) -> usize {
        let added = self.open.as_ref().map_or(0, |open| {
            open.slots.iter().take_while(|s| s.get().is_some()).count()
        });
        self.plans.len() + added
    }

    /// Every plan the layer holds now, in index order.
    pub fn all_plans(&self) -> impl Iterator<Item = &Plan> {
        let added = self
            .open
            .iter()
            .flat_map(|open| open.slots.iter().map_while(OnceLock::get));
        self.plans.iter().chain(added)
    }

    /// Refused where a plan of the layer counts by the calendar and the stack's clock does not
    /// keep the wall clock's rate (`wall_rate`).
    pub(crate) fn check_clock(&self, wall_rate: bool) -> Result<(), BuildError> {
        self.all_plans()
            .try_for_each(|plan| plan.check_clock(&self.name, wall_rate))
    }

    /// Adds `plan` to an open layer; its index, which the plan function then returns for
    /// the requests it applies to (`wall_rate`: whether the stack's clock keeps the wall
    /// clock's rate, which a calendar limit needs).
    pub(crate) fn add_plan(&self, plan: Plan, wall_rate: bool) -> Result<usize, BuildError> {
        let layer = || self.name.clone();
        let Some(open) = &self.open else {
            return Err(BuildError::NotOpen { layer: layer() });
        };
        plan.check_clock(&self.name, wall_rate)?;
        if let Some(refused) = plan.refused {
            return Err(refused.in_layer(&self.name));
        }
        if plan.limits.len() != open.limits {
            return Err(BuildError::PlanShape {
                layer: layer(),
                plan: plan.name,
                limits: plan.limits.len(),
                expected: open.limits,
            });
        }
        // A poisoned count is still the count: it only moves after its slot is filled.
        let mut filled = open.filled.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(slot) = open.slots.get(*filled) else {
            return Err(BuildError::PlansFull {
                layer: layer(),
                capacity: open.slots.len(),
            });
        };
        if slot.set(plan).is_err() {
            // Filled only here, under the lock, one slot after another.
            return Err(BuildError::PlansFull {
                layer: layer(),
                capacity: open.slots.len(),
            });
        }
        let index = self.plans.len() + *filled;
        *filled += 1;
        Ok(index)
    }

    /// Limits in each of the layer's plans.
    pub(crate) fn limits_per_plan(&self) -> usize {
        match (self.plans.first(), &self.open) {
            (Some(first), _) => first.limits.len(),
            (None, Some(open)) => open.limits,
            (None, None) => 0,
        }
    }

    /// A layer with one state per key, the key derived from each request by `keyer` (per user,
    /// per IP, per API key): a closure `|r: &Request| Some(r.user)`, or a [`Keyer`] that reads
    /// a named key (the middleware's `by_key("ip")`). A request for which `keyer` returns
    /// `None` skips the layer.
    pub fn keyed(name: impl Into<String>, keyer: impl Keyer<R, K> + 'static) -> Self {
        Self::with_keyer(name.into(), KeySource::Keyed(Arc::new(keyer)))
    }

    /// Another keyed layer on this layer's key (its keyer, shared), called `name`, with no
    /// limits yet: per customer, a per-second and a per-minute limit as two layers, each with
    /// its own name, plans and answer. In one stack, layers on one key keep their state in one
    /// entry per key, found by one lookup and written under one lock, so the second layer costs
    /// little more than a second limit. (Layers whose keyers read the same named key, such as
    /// the middleware's `by_key("ip")`, share an entry too.) On a global layer: another
    /// global layer, with its own state.
    ///
    /// ```
    /// use limiter_core::{Limit, ManualClock};
    /// use limiter_stack::{Kind, Layer, Stack};
    ///
    /// struct Request { customer: u64 }
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let per_second = Layer::keyed("per-second", |r: &Request| Some(r.customer))
    ///     .limit(Kind::TokenBucket, Limit::per_second(2));
    /// let per_minute = per_second.same_key("per-minute").limit(Kind::TokenBucket, Limit::per_minute(3));
    /// let stack = Stack::builder()
    ///     .layer(per_second)
    ///     .layer(per_minute)
    ///     .layer(Layer::global("everyone").limit(Kind::TokenBucket, Limit::per_second(1_000)))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// assert!(stack.check(&Request { customer: 7 })?.is_allowed());
    /// assert!(stack.check(&Request { customer: 7 })?.is_allowed());
    /// let third = stack.check(&Request { customer: 7 })?;
    /// assert_eq!(third.binding().map(|l| stack.layers()[l.layer].name()), Some("per-second"));
    /// assert_eq!(stack.len(), 1); // one entry holds both of customer 7's layers
    /// # Ok(()) }
    /// ```
    pub fn same_key(&self, name: impl Into<String>) -> Self {
        let keyer = match &self.keyer {
            KeySource::Global => KeySource::Global,
            KeySource::Keyed(keyer) => KeySource::Keyed(Arc::clone(keyer)),
        };
        Self::with_keyer(name.into(), keyer)
    }

    /// Whether both layers are keyed and derive one key from every request: one keyer, or
    /// keyers that read the same named key.
    pub(crate) fn shares_key_with(&self, other: &Self) -> bool {
        match (&self.keyer, &other.keyer) {
            (KeySource::Keyed(a), KeySource::Keyed(b)) => {
                Arc::ptr_eq(a, b) || a.key_name().is_some_and(|name| b.key_name() == Some(name))
            }
            _ => false,
        }
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
            open: None,
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

    /// Like [`limit`](Self::limit), with an algorithm already built (see [`Plan::algorithm`]).
    pub fn algorithm<A: Algorithm + 'static>(self, algorithm: A) -> Self {
        self.add_to_plan(|plan| plan.algorithm(algorithm))
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

    /// Opens the layer to plans added while the stack serves, with
    /// [`Stack::add_plan`](crate::Stack::add_plan): room for `capacity` of them, each of
    /// `limits` limits (as any plans the layer was built with), one chosen per request by
    /// `choose` (the index `add_plan` returned, or a built plan's). This is for limits callers
    /// name at run time, such as a service's ad-hoc limits: a key keeps its consumption when
    /// the plan chosen for it changes, as the same fraction of each new limit (rounded up), so
    /// a caller cannot reset its budget by naming another limit. A global layer needs a plan
    /// to start from, built with it.
    ///
    /// # Example
    ///
    /// ```
    /// use std::time::Duration;
    /// use limiter_core::{Limit, ManualClock};
    /// use limiter_stack::{Kind, Layer, Plan, Stack};
    ///
    /// // (user, plan): the plan is the index `add_plan` returned for the limit the user named.
    /// let clock = ManualClock::new();
    /// let stack: Stack<(u32, usize), u32, ManualClock> = Stack::builder()
    ///     .clock(clock.clone())
    ///     .layer(Layer::keyed("user", |r: &(u32, usize)| Some(r.0))
    ///         .open_plans(100, 1, |r: &(u32, usize)| r.1))
    ///     .build()?;
    /// let ten = stack.add_plan(0, Plan::new("10/min").limit(Kind::FixedWindow, Limit::per_minute(10)))?;
    /// let twenty = stack.add_plan(0, Plan::new("20/min").limit(Kind::FixedWindow, Limit::per_minute(20)))?;
    /// for _ in 0..5 {
    ///     assert!(stack.check(&(7, ten))?.is_allowed());
    /// }
    /// // Half of 10 in use is half of 20: 10 left, not 20.
    /// assert_eq!(stack.check_n(&(7, twenty), 0)?.decision().remaining(), 10);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_plans(
        mut self,
        capacity: usize,
        limits: usize,
        choose: impl Fn(&R) -> usize + Send + Sync + 'static,
    ) -> Self {
        self.open = Some(OpenPlans {
            slots: (0..capacity).map(|_| OnceLock::new()).collect(),
            limits,
            filled: Mutex::new(0),
        });
        self.choose = Some(Arc::new(choose));
        self
    }

    /// The layer's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The plans the layer was built with (see [`all_plans`](Self::all_plans) for those added
    /// since).
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
        // A refused limit first: it is why its plan looks short.
        if let Some(refused) = self.plans.iter().find_map(|plan| plan.refused.as_ref()) {
            return Err(refused.clone());
        }
        let room = self.open.as_ref().map_or(0, |open| open.slots.len());
        let expected = self.limits_per_plan();
        if (self.plans.is_empty() && (self.open.is_none() || self.is_global())) || expected == 0 {
            return Err(BuildError::NoLimits { layer: layer() });
        }
        if expected > MAX_LIMITS_PER_LAYER {
            return Err(BuildError::TooManyLimits {
                layer: layer(),
                limits: expected,
                max: MAX_LIMITS_PER_LAYER,
            });
        }
        let plans = self.plans.len().saturating_add(room);
        if plans > crate::cells::MAX_PLANS {
            return Err(BuildError::TooManyPlans {
                layer: layer(),
                plans,
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
            if plan.limits.len() != expected {
                return Err(BuildError::PlanShape {
                    layer: layer(),
                    plan: plan.name.clone(),
                    limits: plan.limits.len(),
                    expected,
                });
            }
        }
        Ok(())
    }
}

/// A layer's definition taken apart, for a backend that decides it its own way (limiter-redis
/// builds a Redis stack from the same [`Layer`]s a [`Stack`](crate::Stack) is built from).
pub struct LayerParts<R, K> {
    /// The layer's name.
    pub name: String,
    /// Its keyer; `None` for a global layer.
    pub keyer: Option<Arc<dyn Keyer<R, K>>>,
    /// Its plans, in index order.
    pub plans: Vec<PlanParts>,
    /// The plan function; `None`: the first plan, always.
    pub choose: Option<PlanChooser<R>>,
    /// Whether the layer is open to plans added while a stack serves (in process only).
    pub open: bool,
}

/// A plan taken apart: its name and its limits, each with its built-in algorithm (`None`: an
/// algorithm named by type, which only an in-process stack decides).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanParts {
    /// The plan's name.
    pub name: String,
    /// Its limits, in the order they were added.
    pub limits: Vec<(Option<Kind>, Limit)>,
}

impl<R, K> fmt::Debug for LayerParts<R, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LayerParts")
            .field("name", &self.name)
            .field("global", &self.keyer.is_none())
            .field("plans", &self.plans)
            .field("open", &self.open)
            .finish_non_exhaustive()
    }
}

impl<R, K> Layer<R, K> {
    /// The layer taken apart (see [`LayerParts`]), for another backend to build.
    pub fn into_parts(self) -> LayerParts<R, K> {
        LayerParts {
            keyer: match self.keyer {
                KeySource::Global => None,
                KeySource::Keyed(keyer) => Some(keyer),
            },
            plans: self
                .plans
                .into_iter()
                .map(|plan| PlanParts {
                    name: plan.name,
                    limits: plan.specs,
                })
                .collect(),
            choose: self.choose,
            open: self.open.is_some(),
            name: self.name,
        }
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
