//! The errors every backend shares: a stack that cannot be built, a call that can never be
//! decided, and a refund that was refused. An in-process [`Stack`](crate::Stack) and a Redis
//! stack answer with these same types; a backend's own failures ride in them (a refund's
//! [`RefundError::Backend`]), and a variant one backend never returns is documented so.

use limiter_core::{DecisionError, LimitError};

/// Why a stack (in process or on a backend) could not be built. Each message names the layer,
/// plan or stack and the fix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A limit the chosen algorithm cannot represent.
    #[error("{owner}: {source}")]
    Limit {
        /// What it was added to: "layer `name`" or "plan `name`".
        owner: String,
        /// Why the algorithm refused it.
        source: LimitError,
    },
    /// A stack with no layers would admit everything.
    #[error(
        "a stack needs at least one layer; add one with `.layer(Layer::keyed(..).limit(Kind::TokenBucket, limit))`"
    )]
    NoLayers,
    /// Two layers share a name, so they would share their state (a backend names its keys by
    /// layer). Backends that name keys by layer refuse it.
    #[error("two layers are named `{layer}`; a layer's name names its keys, so give each its own")]
    DuplicateLayer {
        /// The repeated name.
        layer: String,
    },
    /// A name a backend cannot use as given (a Redis key's part, for one).
    #[error("{what} `{name}` {reason}")]
    BadName {
        /// What was named: "stack", "prefix" or "layer".
        what: &'static str,
        /// The name given.
        name: String,
        /// What is wrong and how to fix it.
        reason: &'static str,
    },
    /// A layer open to plans added while the stack serves, on a backend that takes plans only
    /// when built (Redis: a key keeps its consumption when its plan changes only if every plan
    /// is known up front).
    #[error(
        "layer `{layer}` is open to plans added while serving (`open_plans`), which only an in-process stack takes; on Redis give its plans when building (`plans`): a key keeps its consumption when its plan changes"
    )]
    OpenPlans {
        /// The layer.
        layer: String,
    },
    /// A lease that cannot be kept as asked (the Redis backend's leased stacks).
    #[error("the leased stack `{stack}`: {reason}")]
    Lease {
        /// The stack's name.
        stack: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A leased stack whose keys would not all share one shard (a Redis Cluster slot), so no
    /// one script could take from them together.
    #[error(
        "the Redis stack `{stack}` is leased on a Redis Cluster and tags keys by each layer's own \
         key, but it has {layers} layers, whose keys land in different slots; a lease is taken \
         by one script, which Redis runs only on keys of one slot. Tag by a request field every \
         layer shares (`hash_tag_from`) or by the stack (`tag_by_stack`), or lease a stack of \
         one layer"
    )]
    CrossSlot {
        /// The stack's name.
        stack: String,
        /// How many layers it has.
        layers: usize,
    },
    /// The fleet size a backend's local fallback shares each limit by is 0, or leaves a node
    /// no unit of some limit.
    #[error(
        "the Redis stack `{stack}` shares its limits between a fleet of {fleet} nodes while Redis is out, {reason}"
    )]
    FleetSize {
        /// The stack's name.
        stack: String,
        /// The fleet size given.
        fleet: u64,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A calendar quota that cannot be kept as described.
    #[error("quota `{name}`: {reason}")]
    Quota {
        /// The quota's name.
        name: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// Permits that cannot be kept as described.
    #[error("permits `{name}`: {reason}")]
    Permits {
        /// The permits' name.
        name: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// More layers than a stack holds.
    #[error(
        "a stack holds at most {max} layers, not {layers}; put several limits on one layer (they share its key lookup) or split the stack"
    )]
    TooManyLayers {
        /// Layers given.
        layers: usize,
        /// The most a stack holds.
        max: usize,
    },
    /// A layer, or one of its plans, has no limit.
    #[error("layer `{layer}` has a plan with no limit; add one with `.limit(kind, limit)`")]
    NoLimits {
        /// The layer.
        layer: String,
    },
    /// More limits in one plan than a layer holds.
    #[error(
        "layer `{layer}` has a plan with {limits} limits; a layer holds at most {max}; move the others to another layer with the same keyer"
    )]
    TooManyLimits {
        /// The layer.
        layer: String,
        /// Limits given.
        limits: usize,
        /// The most a layer holds.
        max: usize,
    },
    /// Too many plans in one layer.
    #[error("layer `{layer}` has {plans} plans; a layer holds at most {max}")]
    TooManyPlans {
        /// The layer.
        layer: String,
        /// Plans given.
        plans: usize,
        /// The most a layer holds.
        max: usize,
    },
    /// Plans of one layer with different numbers of limits.
    #[error(
        "layer `{layer}`: plan `{plan}` has {limits} limits but the first plan has {expected}; every plan of a layer has the same number of limits, so consumption carries over from one to another"
    )]
    PlanShape {
        /// The layer.
        layer: String,
        /// The plan that differs.
        plan: String,
        /// Its limits.
        limits: usize,
        /// The first plan's limits.
        expected: usize,
    },
    /// A bound of zero keys would refuse every keyed call.
    #[error("`max_keys` must be at least 1; leave it unset for no bound")]
    ZeroMaxKeys,
    /// A plan added to a layer that takes none while the stack serves.
    #[error(
        "layer `{layer}` takes no plans while the stack serves; build it with `Layer::open_plans(capacity, limits, choose)`"
    )]
    NotOpen {
        /// The layer.
        layer: String,
    },
    /// A calendar limit on a clock that does not keep the wall clock's rate, so its windows
    /// would end early or late by the clock's drift.
    #[error(
        "layer `{layer}` counts by the calendar (plan `{plan}`), which turns the stack's clock readings into Unix time, but the stack's clock does not keep the wall clock's rate (the default clock reads the CPU's time-stamp counter at one calibration's rate: on the development VM a month's window would end half a minute early); build the stack with `.clock(MonotonicClock::new())`"
    )]
    CalendarClock {
        /// The layer.
        layer: String,
        /// Its plan holding the calendar limit.
        plan: String,
    },
    /// A plan added to a layer the stack does not have.
    #[error("the stack has {layers} layers (0 to {}), not layer {layer}", layers.saturating_sub(1))]
    NoSuchLayer {
        /// The index asked for.
        layer: usize,
        /// The stack's layers.
        layers: usize,
    },
    /// An open layer that already holds every plan it has room for.
    #[error(
        "layer `{layer}` already holds the {capacity} plans `Layer::open_plans` made room for; give it more room"
    )]
    PlansFull {
        /// The layer.
        layer: String,
        /// The room it was built with.
        capacity: usize,
    },
}

impl BuildError {
    pub(crate) fn in_layer(self, layer: &str) -> Self {
        match self {
            Self::Limit { source, .. } => Self::Limit {
                owner: format!("layer `{layer}`"),
                source,
            },
            other => other,
        }
    }
}

/// A stacked call that can never be decided. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CallError {
    /// A [`Decide`](crate::Decide) future was polled again after it had answered (a bug in
    /// the adapter driving it).
    #[error(
        "a decision's future was polled after it had answered; poll each decision to completion once"
    )]
    PolledAfterCompletion,
    /// One layer's limit can never decide the call (its cost exceeds that limit's burst, or
    /// the clock is past the limit's range).
    #[error("layer `{layer}`, limit {limit_index}: {source}")]
    Decision {
        /// The layer.
        layer: String,
        /// Which of the layer's limits (0-based).
        limit_index: usize,
        /// Why.
        source: DecisionError,
    },
    /// The stack holds as many keys as it was built for ([`max_keys`]) and none of them is
    /// full, so a new key cannot be taken in without forgetting another's consumption. Calls
    /// for keys already held go on; new keys get in as held ones become full again.
    ///
    /// [`max_keys`]: crate::StackBuilder::max_keys
    #[error(
        "layer `{layer}`: the stack already holds its {max_keys} keys and none is full again \
         yet; raise `max_keys`, or retry once some keys have refilled"
    )]
    Full {
        /// The layer whose new key did not fit.
        layer: String,
        /// The stack's bound.
        max_keys: usize,
    },
    /// A refund through the seam was refused (a grant of another limiter, or more units than
    /// it has left); nothing was given back.
    #[error("refund refused: {reason}")]
    Refund {
        /// Why.
        reason: String,
    },
    /// The layer's plan function chose a plan that does not exist.
    #[error("layer `{layer}`: the plan function chose plan {chosen}, but the layer has {plans} plans (0 to {}); fix the function passed to `Layer::plans`", plans.saturating_sub(1))]
    NoSuchPlan {
        /// The layer.
        layer: String,
        /// The index the function returned.
        chosen: usize,
        /// How many plans the layer has.
        plans: usize,
    },
}

/// A refund that was refused: the grant's units are unchanged, except after
/// [`Backend`](Self::Backend), whose units the grant no longer holds.
///
/// One type for every backend: `E` is the backend's own failure (an in-process stack has none,
/// so its refunds are `RefundError<Infallible>`, the default; the Redis backend's are
/// `RefundError<BackendError>`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefundError<E = std::convert::Infallible> {
    /// More units than the grant has left.
    #[error("cannot refund {units} units: the grant has {left} left of the {taken} it took")]
    ExceedsGrant {
        /// Units asked back.
        units: u64,
        /// Units the grant can still give back.
        left: u64,
        /// Units the grant took.
        taken: u64,
    },
    /// The grant came from another stack.
    #[error("this grant was taken from another stack; refund it to the stack that granted it")]
    WrongStack,
    /// The call itself cannot be decided.
    #[error(transparent)]
    Call(#[from] CallError),
    /// The backend failed (or refused) during the refund. Its units are no longer held by the
    /// grant, so a lost reply can never give them back twice; if the backend did not apply
    /// the refund they stay counted until they refill.
    #[error("the refund did not reach the backend ({0}); its units stay counted until they refill")]
    Backend(E),
}
