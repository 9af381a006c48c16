//! The decision engine behind the API: one stack per configured policy (layers: the limits
//! keyed by identifier, then the global ones), in process or on Redis, and ad-hoc limits
//! (`limit` per `duration_ms`, keyed by namespace and identifier).
//!
//! An ad-hoc counter is named by what the caller names (namespace and identifier), never by the
//! limit it sends: a caller that changes the limit keeps its consumption, rescaled as the same
//! fraction of the new limit (rounded up), so it cannot reset its budget by sending another
//! limit. In process every ad-hoc limit is a plan of one open layer
//! ([`Layer::open_plans`]), added on first use; on Redis each shape's stack names the same
//! keys, and the script rescales a key written under another limit.
//!
//! # Reloading
//!
//! [`Engine::reloaded`] builds the engine for a new configuration from the one serving: a
//! policy (or envoy descriptor limit) whose limits did not change keeps its stack, and so its
//! counters; one whose limits changed keeps its consumption, rescaled as the same fraction of
//! each new limit (rounded up). In process that is a new plan of the policy's open layers (each
//! key moves to it at its next call, as ad-hoc limits do), for up to [`RELOAD_PLANS`] changes
//! of one policy and as long as its layers keep their shape (the same keyings, the same number
//! of limits in each); past that its counters start afresh, and [`Carried::fresh`] names it. On
//! Redis keys are named by the policy, its layer and the limit's place, so the script rescales
//! them by itself. Ad-hoc limits keep their state.
//!
//! Every call goes through the workspace's one seam, [`AsyncLimiter`], and its [`Outcome`]
//! becomes an [`Answer`] in one place (`Engine::answer`), whatever the store.
//!
//! A batch is all or nothing: in process, its items are decided in order at one clock reading,
//! each admitted item keeping a grant; if any item is denied, every grant is refunded at that
//! same reading, so the batch leaves no trace, and the admitted items report what they hold
//! after it. (A concurrent caller may be denied while the
//! units are briefly held; none is ever admitted past a limit.) On Redis a batch is one
//! [`RedisBatch`](limiter_redis::RedisBatch): one script call decides every item at one `TIME`
//! and writes only if every enforced item admitted, so no caller can slip in between and a
//! denied batch takes nothing.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use limiter_core::{Clock, Decision, Limit, LimitError};
use limiter_redis::{
    BatchError, Kind, LeasedStack, OnFailure, RedisBackend, RedisLayer, RedisStack,
};
use limiter_stack::{AsyncLimiter, CallError, Grant, Layer, Outcome, Plan, Stack};

use crate::config::{CheckedLimit, Config, Keying, Policy, PolicyLimit, Store, StoreKind};
use crate::metrics::{AD_HOC, Counted, FailurePolicy, Metrics, PolicyCounters};

/// The most distinct ad-hoc limit shapes (`limit` and `duration_ms` pairs) one process keeps a
/// stack for; a request for another is refused and should become a configured policy.
pub const MAX_AD_HOC_SHAPES: usize = 1_024;

/// How many times one in-process policy's limits can change by reload with its counters kept
/// (each change is a plan of its layers); past that, a change starts its counters afresh.
pub const RELOAD_PLANS: usize = 32;

/// What a reload did with each policy's counters, by policy name (configured policies and
/// envoy descriptor limits, as the metrics name them).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Carried {
    /// Same limits: counters kept as they were.
    pub kept: Vec<String>,
    /// Changed limits: consumption kept, rescaled to the new limits.
    pub rescaled: Vec<String>,
    /// New, or changed past what can be rescaled in process: counters start afresh.
    pub fresh: Vec<String>,
}

/// A serving engine's policies, offered to the engine replacing it, by stack name.
struct Previous<C> {
    entries: HashMap<String, (Policy, Arc<Backend<C>>, usize)>,
    /// Whether a Redis store's failure policy or fleet size changed (its stacks hold both).
    store_changed: bool,
    carried: Carried,
}

/// What a stack decides on: one identifier, and the plan of the ad-hoc layer (0 elsewhere).
#[derive(Debug)]
pub struct Call {
    identifier: Arc<str>,
    plan: usize,
}

/// The stack name of every ad-hoc limit on Redis (so every shape names the same keys): no
/// policy can be called this, as a name has no `~`.
const AD_HOC_STACK: &str = "~adhoc";

/// A policy of the engine: a configured one, found by name with [`Engine::policy_id`], or one
/// added for an envoy descriptor by [`Engine::add_policy`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PolicyId(usize);

impl PolicyId {
    /// The policy at `index` in the order the engine added them (configured policies first,
    /// in name order). For tests and fuzz bodies; an id no policy has is refused when decided.
    #[doc(hidden)]
    pub const fn from_index(index: usize) -> Self {
        Self(index)
    }
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A policy of the engine.
    Policy(PolicyId),
    /// `limit` per `duration_ms`, keyed by namespace and identifier.
    AdHoc {
        /// The algorithm.
        kind: Kind,
        /// Units per duration (and the burst).
        limit: u64,
        /// The duration in milliseconds.
        duration_ms: u64,
        /// Keeps one caller's identifiers apart from another's.
        namespace: String,
    },
}

/// One decision asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Which limits.
    pub target: Target,
    /// Whose state.
    pub identifier: String,
    /// Units; 0 only reports.
    pub cost: u64,
    /// Evaluated and reported but never enforced: a denial of this item does not deny the
    /// batch (envoy's `shadow_mode`).
    pub shadow: bool,
    /// What the item does to its limits: asks for `cost` units, records them, or gives them
    /// back.
    pub charge: Charge,
}

/// What an item does to its limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Charge {
    /// Asks for `cost` units: admitted, or denied and nothing taken.
    #[default]
    Ask,
    /// Records `cost` units of usage that already happened (tokens a response used): counted
    /// whatever the limits hold, never refused and never denying its batch; a limit it takes
    /// past its capacity is left in debt, so later calls are denied until the debt is paid
    /// back. Written even when its batch is denied.
    Record,
    /// Gives `cost` units back, without a grant (envoy's `is_negative_hits`): no limit goes
    /// above full, and the answer is what the item holds after it. Decided alone, never in a
    /// batch.
    GiveBack,
}

impl Item {
    /// Whether the item never denies its batch: a shadow check, a record, a give-back.
    fn never_denies(&self) -> bool {
        self.shadow || self.charge != Charge::Ask
    }
}

/// Who answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// This process's memory.
    Memory,
    /// Redis.
    Redis,
    /// The deny cache, for a key Redis had just denied.
    DenyCache,
    /// The local fallback while Redis is out.
    Fallback,
    /// Redis failed and the policy admits: nothing was counted.
    FailOpen,
    /// A lease of Redis's budget, spent in this process (`lease_slack`).
    Lease,
}

impl Origin {
    /// The name the API reports.
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redis => "redis",
            Self::DenyCache => "deny_cache",
            Self::Fallback => "fallback",
            Self::FailOpen => "fail_open",
            Self::Lease => "lease",
        }
    }
}

/// The answer for one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The decision (least remaining, longest waits across the stack's limits).
    pub decision: Decision,
    /// Who answered.
    pub origin: Origin,
    /// When it was decided, in nanoseconds since the Unix epoch (by Redis's clock for Redis's
    /// answers and a lease's, by this process's otherwise): the instant its waits count from,
    /// so `at_unix_ns + reset_after` is when the limits are full again.
    pub at_unix_ns: u64,
}

impl Answer {
    /// When the limits are full again, in whole milliseconds since the Unix epoch (rounded
    /// up): the same instant for every answer about one window.
    pub fn reset_at_ms(&self) -> u64 {
        self.at_unix_ns
            .saturating_add(self.decision.reset_after_nanos())
            .div_ceil(1_000_000)
    }
}

/// How far ahead of this server's clock a request's `time` may be (a client's clock running
/// fast): such a time is decided at the server's own reading, and one further ahead is refused.
pub const MAX_TIME_AHEAD_MS: u64 = 5_000;

/// Why a request could not be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// The request is one no limit can ever decide: a cost above the burst (`field` is
    /// `cost`), or an ad-hoc limit no algorithm can count (`limit`).
    #[error("{message}")]
    Invalid {
        /// The request field at fault.
        field: &'static str,
        /// What was wrong and how to fix it.
        message: String,
    },
    /// Too many distinct ad-hoc limits.
    #[error(
        "this process already serves {MAX_AD_HOC_SHAPES} distinct ad-hoc limits: configure a \
         policy for this one"
    )]
    TooManyShapes,
    /// The backend failed and the policy refuses.
    #[error("the store is unavailable ({0}); try again later")]
    Unavailable(String),
    /// A bounded store holds its `max_keys` and none is full again yet: a new identifier
    /// must wait (held ones go on).
    #[error("{0}")]
    Full(String),
}

/// Why the engine could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The configuration names a Redis store but no connection was given.
    #[error(
        "the store is Redis but no Redis connection was made; connect first (limiterd does this from `[store] url`)"
    )]
    NoBackend,
    /// An in-process policy's stack was refused.
    #[error("policy `{policy}`: {source}")]
    Memory {
        /// The policy.
        policy: String,
        /// Why.
        #[source]
        source: limiter_stack::BuildError,
    },
    /// A Redis policy's stack was refused.
    #[error("policy `{policy}`: {source}")]
    Redis {
        /// The policy.
        policy: String,
        /// Why.
        #[source]
        source: limiter_redis::BuildError,
    },
}

type MemoryStack<C> = Stack<Call, Arc<str>, C>;

/// An ad-hoc limit's shape: the algorithm, `limit` per `duration_ms`.
type Shape = (Kind, u64, u64);

/// Where an ad-hoc shape is decided: a stack, and the shape's plan in it.
type AdHocStack<C> = (Arc<Backend<C>>, usize);

/// A policy's stack, in this process or on Redis (per call, or against leases).
enum Backend<C> {
    Memory(MemoryStack<C>),
    Redis(RedisStack<Call>),
    Leased(LeasedStack<Call>),
}

impl<C: Clock + Send + Sync + 'static> Backend<C> {
    /// The stack, through the seam every store shares.
    fn limiter(&self) -> &dyn AsyncLimiter<Call> {
        match self {
            Self::Memory(stack) => stack,
            Self::Redis(stack) => stack,
            Self::Leased(stack) => stack,
        }
    }
}

impl<C> Backend<C> {
    /// The per-call Redis stack (a leased policy's too): what batches decide on.
    fn redis_stack(&self) -> Option<&RedisStack<Call>> {
        match self {
            Self::Memory(_) => None,
            Self::Redis(stack) => Some(stack),
            Self::Leased(stack) => Some(stack.stack()),
        }
    }
}

enum StoreHandle {
    Memory {
        max_keys: Option<usize>,
    },
    /// The backend, the default failure policy and the fleet's size.
    Redis(RedisBackend, OnFailure, u64),
}

/// A policy: its name (its metrics label), what it was built from, its stack (shared with
/// the engine it was carried over from), the plan its calls choose, and its counters.
struct Entry<C> {
    name: String,
    stack_name: String,
    spec: Policy,
    backend: Arc<Backend<C>>,
    plan: usize,
    counters: PolicyCounters,
}

/// Every policy's stack, the ad-hoc stacks, and the clock they share.
pub struct Engine<C> {
    clock: C,
    store: StoreHandle,
    policies: Vec<Entry<C>>,
    by_name: HashMap<String, PolicyId>,
    /// Each ad-hoc shape's stack and plan: in process, the one open stack and the shape's plan
    /// in it; on Redis, the shape's own stack (plan 0).
    ad_hoc: RwLock<HashMap<Shape, AdHocStack<C>>>,
    /// In process, the stack every ad-hoc shape is a plan of.
    ad_hoc_memory: Option<Arc<Backend<C>>>,
    ad_hoc_counters: PolicyCounters,
    metrics: Arc<Metrics>,
    /// While a reload builds this engine: the policies of the one it replaces.
    previous: Option<Previous<C>>,
    /// The Unix time, in ns, of the clock's reading 0 (the start of a Unix week for the
    /// OS-backed clocks): what turns readings into Unix time, and a request's `time` back.
    unix_origin_ns: u64,
}

impl<C> std::fmt::Debug for Engine<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.policies.iter().map(|p| p.name.as_str()).collect();
        f.debug_struct("Engine")
            .field("policies", &names)
            .finish_non_exhaustive()
    }
}

/// An in-process layer: `limits` as its first plan, open to [`RELOAD_PLANS`] more (a reload's
/// changed limits), the one a call's `plan` names applied.
fn memory_layer(name: &str, keying: Keying, limits: &[&PolicyLimit]) -> Layer<Call, Arc<str>> {
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
fn same_shape(a: &Policy, b: &Policy) -> bool {
    let shape = |p: &Policy| -> Vec<(Keying, usize)> {
        groups(p).iter().map(|(k, l)| (*k, l.len())).collect()
    };
    shape(a) == shape(b)
}

fn redis_layer(name: &str, keying: Keying, limits: &[&PolicyLimit]) -> RedisLayer<Call> {
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
fn groups(policy: &Policy) -> Vec<(Keying, Vec<&PolicyLimit>)> {
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

/// A call that can never be decided, as the API reports it.
fn call_error(e: &CallError) -> DecideError {
    match e {
        CallError::Full { .. } => {
            tracing::warn!(error = %e, "a policy's key store is full: new identifiers are refused");
            DecideError::Full(e.to_string())
        }
        _ => DecideError::Invalid {
            field: "cost",
            message: e.to_string(),
        },
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    /// Builds every configured policy's stack on `clock` (and, for a Redis store, `backend`),
    /// registering each policy's counters in `metrics` under its name.
    pub fn new(
        config: &Config,
        clock: C,
        backend: Option<RedisBackend>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, EngineError> {
        let store = match (&config.store, backend) {
            (Store::Memory { max_keys }, _) => StoreHandle::Memory {
                max_keys: *max_keys,
            },
            (
                Store::Redis {
                    on_failure,
                    fleet_size,
                    ..
                },
                Some(backend),
            ) => StoreHandle::Redis(backend, *on_failure, *fleet_size),
            (Store::Redis { .. }, None) => return Err(EngineError::NoBackend),
        };
        let mut engine = Self {
            clock,
            store,
            policies: Vec::new(),
            by_name: HashMap::new(),
            ad_hoc: RwLock::new(HashMap::new()),
            ad_hoc_memory: None,
            ad_hoc_counters: metrics.policy(AD_HOC),
            metrics,
            previous: None,
            unix_origin_ns: 0,
        };
        engine.unix_origin_ns = limiter_core::unix_origin(&engine.clock);
        if let StoreHandle::Memory { max_keys } = engine.store {
            let mut builder = Stack::builder().clock(engine.clock.clone());
            if let Some(max_keys) = max_keys {
                builder = builder.max_keys(max_keys);
            }
            let layer = Layer::keyed("identifier", |c: &Call| Some(Arc::clone(&c.identifier)))
                .open_plans(MAX_AD_HOC_SHAPES, 1, |c: &Call| c.plan);
            let stack = builder
                .layer(layer)
                .build()
                .map_err(|source| EngineError::Memory {
                    policy: AD_HOC.to_owned(),
                    source,
                })?;
            engine.ad_hoc_memory = Some(Arc::new(Backend::Memory(stack)));
        }
        for (name, policy) in &config.policies {
            let id = engine.add_policy(name, name, policy)?;
            engine.by_name.insert(name.clone(), id);
        }
        Ok(engine)
    }

    /// The engine for `config` in place of `self`, which keeps serving until the caller swaps
    /// them: every policy and descriptor limit whose limits did not change keeps its stack,
    /// changed ones keep their consumption (see the module docs). Add envoy's limits with
    /// [`add_policy`](Self::add_policy), then call [`carried`](Self::carried).
    ///
    /// The store itself (memory or Redis, `max_keys`, the URL and timeout) cannot change: the
    /// caller refuses such a configuration. The failure policy and the fleet's size can.
    pub fn reloaded(&self, config: &Config) -> Result<Self, EngineError> {
        let store = match (&self.store, &config.store) {
            (
                StoreHandle::Redis(backend, ..),
                Store::Redis {
                    on_failure,
                    fleet_size,
                    ..
                },
            ) => StoreHandle::Redis(backend.clone(), *on_failure, *fleet_size),
            (StoreHandle::Memory { .. }, Store::Memory { max_keys }) => StoreHandle::Memory {
                max_keys: *max_keys,
            },
            (_, Store::Redis { .. }) => return Err(EngineError::NoBackend),
            (_, Store::Memory { max_keys }) => StoreHandle::Memory {
                max_keys: *max_keys,
            },
        };
        // Ad-hoc stacks carry over unless a Redis store's failure policy or fleet changed
        // (their stacks hold those; the keys they name stay in Redis either way).
        let same_store = match (&self.store, &store) {
            (StoreHandle::Redis(_, a, n), StoreHandle::Redis(_, b, m)) => a == b && n == m,
            _ => true,
        };
        let ad_hoc = if same_store {
            self.ad_hoc.read().map(|m| m.clone()).unwrap_or_default()
        } else {
            HashMap::new()
        };
        let previous = Previous {
            entries: self
                .policies
                .iter()
                .map(|e| {
                    (
                        e.stack_name.clone(),
                        (e.spec.clone(), Arc::clone(&e.backend), e.plan),
                    )
                })
                .collect(),
            store_changed: !same_store,
            carried: Carried::default(),
        };
        let mut engine = Self {
            clock: self.clock.clone(),
            store,
            policies: Vec::new(),
            by_name: HashMap::new(),
            ad_hoc: RwLock::new(ad_hoc),
            ad_hoc_memory: self.ad_hoc_memory.clone(),
            ad_hoc_counters: self.ad_hoc_counters.clone(),
            metrics: Arc::clone(&self.metrics),
            previous: Some(previous),
            unix_origin_ns: self.unix_origin_ns,
        };
        for (name, policy) in &config.policies {
            let id = engine.add_policy(name, name, policy)?;
            engine.by_name.insert(name.clone(), id);
        }
        Ok(engine)
    }

    /// Ends a reload: what happened to each policy's counters, and the replaced engine's
    /// policies let go. Empty for an engine not built by [`reloaded`](Self::reloaded).
    pub fn carried(&mut self) -> Carried {
        self.previous.take().map(|p| p.carried).unwrap_or_default()
    }

    /// Which store policies are checked for ([`CheckedLimit::new`]).
    pub fn store_kind(&self) -> StoreKind {
        match self.store {
            StoreHandle::Memory { .. } => StoreKind::Memory,
            StoreHandle::Redis(..) => StoreKind::Redis,
        }
    }

    fn build(&self, stack_name: &str, policy: &Policy) -> Result<Backend<C>, EngineError> {
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

    /// Adds a policy counted under `name` in the metrics, with its state under `stack_name`
    /// (part of its Redis keys). Requests reach it by the returned id only (an envoy
    /// descriptor's limit); configured policies are also found by name.
    pub fn add_policy(
        &mut self,
        name: &str,
        stack_name: &str,
        policy: &Policy,
    ) -> Result<PolicyId, EngineError> {
        let (backend, plan) = match self.carry_over(name, stack_name, policy) {
            Some(found) => found,
            None => (Arc::new(self.build(stack_name, policy)?), 0),
        };
        self.policies.push(Entry {
            name: name.to_owned(),
            stack_name: stack_name.to_owned(),
            spec: policy.clone(),
            backend,
            plan,
            counters: self.metrics.policy(name),
        });
        Ok(PolicyId(self.policies.len() - 1))
    }

    /// During a reload, the stack and plan `stack_name` had, if its counters can go on under
    /// `policy`: the same stack for the same limits; in process, a new plan of its layers for
    /// changed limits of the same shape. Records what it did in [`Carried`].
    fn carry_over(
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

    /// What a policy does when Redis fails unless it says otherwise: the store's choice.
    pub fn default_failure(&self) -> OnFailure {
        match &self.store {
            StoreHandle::Redis(_, on_failure, _) => *on_failure,
            StoreHandle::Memory { .. } => OnFailure::default(),
        }
    }

    /// The configured policy named `name`.
    pub fn policy_id(&self, name: &str) -> Option<PolicyId> {
        self.by_name.get(name).copied()
    }

    /// The name of the policy `id` (its metrics label).
    pub fn policy_name(&self, id: PolicyId) -> Option<&str> {
        self.policies.get(id.0).map(|p| p.name.as_str())
    }

    /// Keys held in memory (0 on Redis, whose keys expire there).
    pub fn keys_held(&self) -> u64 {
        let policies = self.policies.iter().map(|p| held(&p.backend));
        let ad_hoc = self.ad_hoc_memory.as_deref().map_or(0, held);
        policies.sum::<u64>() + ad_hoc
    }

    fn ad_hoc_backend(
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

    fn resolve(&self, item: &Item) -> Result<(Resolved<'_, C>, Call), DecideError> {
        match &item.target {
            Target::Policy(id) => {
                let entry = self
                    .policies
                    .get(id.0)
                    .ok_or_else(|| DecideError::Invalid {
                        field: "policy",
                        message: format!("no policy number {}", id.0),
                    })?;
                let call = Call {
                    identifier: item.identifier.as_str().into(),
                    plan: entry.plan,
                };
                Ok((Resolved::Configured(&entry.backend, &entry.counters), call))
            }
            Target::AdHoc {
                kind,
                limit,
                duration_ms,
                namespace,
            } => {
                let (backend, plan) = self.ad_hoc_backend(*kind, *limit, *duration_ms)?;
                // The namespace keeps callers apart; its length is bounded, so the separator
                // cannot be forged into another namespace's key.
                let call = Call {
                    identifier: format!("{}:{namespace}:{}", namespace.len(), item.identifier)
                        .into(),
                    plan,
                };
                Ok((Resolved::AdHoc(backend, &self.ad_hoc_counters), call))
            }
        }
    }

    /// The metrics decisions are counted in.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The Unix time, in ns, of the clock's reading 0 (see [`limiter_core::unix_origin`]).
    pub fn unix_origin_ns(&self) -> u64 {
        self.unix_origin_ns
    }

    /// Uses `origin_ns` as the Unix time of the clock's reading 0 (for tests on a manual
    /// clock; the engine finds it itself otherwise).
    #[doc(hidden)]
    pub fn set_unix_origin_ns(&mut self, origin_ns: u64) {
        self.unix_origin_ns = origin_ns;
    }

    /// The clock's reading for a request's `time` (ms since the Unix epoch), as the engine
    /// decides it: a time before what the clock counts from is refused, and so is one more
    /// than [`MAX_TIME_AHEAD_MS`] ahead of the clock; one ahead by less is the clock's own
    /// reading (a time cannot spend what has not come back yet). `None`: now.
    fn reading_for(&self, time_ms: Option<u64>) -> Result<u64, DecideError> {
        let now = self.clock.now();
        let Some(time_ms) = time_ms else {
            return Ok(now);
        };
        let invalid = |message: String| DecideError::Invalid {
            field: "time",
            message,
        };
        let at = time_ms.saturating_mul(1_000_000);
        let origin = self.unix_origin_ns;
        if at < origin {
            return Err(invalid(format!(
                "`time` {time_ms} is before {}, where this server's clock starts counting (the \
                 start of the Unix week it started in): send the time of the request, in ms \
                 since the Unix epoch",
                origin / 1_000_000
            )));
        }
        let reading = at - origin;
        let ahead = reading.saturating_sub(now);
        if ahead > MAX_TIME_AHEAD_MS * 1_000_000 {
            return Err(invalid(format!(
                "`time` {time_ms} is {} ms ahead of this server's clock (more than \
                 {MAX_TIME_AHEAD_MS} ms): send the time of the request, in ms since the Unix \
                 epoch, or leave it out",
                ahead / 1_000_000
            )));
        }
        Ok(reading.min(now))
    }

    /// Decides `items`, all or nothing (see the module docs); one answer per item, in order.
    pub async fn decide(&self, items: &[Item]) -> Result<(bool, Vec<Answer>), DecideError> {
        self.decide_at(items, None).await
    }

    /// [`decide`](Self::decide) at a caller's `time` (ms since the Unix epoch; `None`: now).
    /// In memory the items are decided at that instant; a time ahead of the server's clock is
    /// decided at its own reading, never later. On Redis, Redis's clock decides (so a fleet
    /// agrees): the time is checked the same way and changes nothing.
    pub async fn decide_at(
        &self,
        items: &[Item],
        time_ms: Option<u64>,
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        let reading = self.reading_for(time_ms)?;
        let resolved = items
            .iter()
            .map(|item| self.resolve(item))
            .collect::<Result<Vec<_>, _>>()?;
        let result = if resolved
            .iter()
            .all(|(r, _)| matches!(r.backend(), Backend::Memory(_)))
        {
            self.decide_in_memory(items, &resolved, reading)
        } else {
            self.decide_on_redis(items, &resolved).await
        };
        match &result {
            Ok((admitted, answers)) => {
                for ((item, (target, _)), answer) in items.iter().zip(&resolved).zip(answers) {
                    let counted = if item.cost == 0 {
                        Counted::Peeked
                    } else if item.charge == Charge::Record {
                        Counted::Recorded
                    } else if item.charge == Charge::GiveBack {
                        Counted::GivenBack
                    } else if !answer.decision.is_allowed() {
                        Counted::Denied {
                            shadow: item.shadow,
                        }
                    } else if *admitted {
                        Counted::Allowed
                    } else {
                        Counted::BatchRefused
                    };
                    target.counters().count(counted, &item.identifier);
                }
            }
            Err(DecideError::Full(_)) => self.metrics.store_full(),
            Err(_) => {}
        }
        result
    }

    fn decide_in_memory(
        &self,
        items: &[Item],
        resolved: &[(Resolved<'_, C>, Call)],
        now: u64,
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        let mut answers = Vec::with_capacity(items.len());
        let mut grants: Vec<(usize, Grant)> = Vec::new();
        let mut all = true;
        for (i, (item, (backend, call))) in items.iter().zip(resolved).enumerate() {
            let Backend::Memory(stack) = backend.backend() else {
                unreachable!("checked by the caller");
            };
            let decided = match item.charge {
                Charge::Ask => stack.decide_at(call, item.cost, now),
                Charge::Record => stack.record_at(call, item.cost, now).map(|d| (d, None)),
                Charge::GiveBack => stack.give_back(call, item.cost).map(|d| (d, None)),
            };
            let (decision, grant) = match decided {
                Ok(pair) => pair,
                Err(e) => {
                    self.refund_all(resolved, grants);
                    return Err(call_error(&e));
                }
            };
            all &= decision.is_allowed() || item.never_denies();
            if let Some(grant) = grant {
                grants.push((i, grant));
            }
            answers.push(Answer {
                decision: decision.decision(),
                origin: Origin::Memory,
                at_unix_ns: self.unix_origin_ns.saturating_add(now),
            });
        }
        if !all {
            self.refund_all(resolved, grants);
            // Nothing was taken: admitted items report what they hold after the refund, read
            // at a reading no earlier than the refund's (a peek at the batch's own, earlier,
            // reading would count the refunded units as still owed).
            let now = self.clock.now().max(now);
            for ((item, (backend, call)), answer) in items.iter().zip(resolved).zip(&mut answers) {
                if answer.decision.is_allowed()
                    && item.cost > 0
                    && item.charge == Charge::Ask
                    && let Backend::Memory(stack) = backend.backend()
                    && let Ok((peek, _)) = stack.decide_at(call, 0, now)
                {
                    answer.decision = peek.decision();
                    answer.at_unix_ns = self.unix_origin_ns.saturating_add(now);
                }
            }
        }
        Ok((all, answers))
    }

    fn refund_all(&self, resolved: &[(Resolved<'_, C>, Call)], grants: Vec<(usize, Grant)>) {
        for (i, mut grant) in grants {
            let (backend, call) = &resolved[i];
            if let Backend::Memory(stack) = backend.backend() {
                let units = grant.left();
                // A grant from this stack, with its own units: a refund cannot fail.
                let _ = stack.refund(call, &mut grant, units);
            }
        }
    }

    async fn decide_on_redis(
        &self,
        items: &[Item],
        resolved: &[(Resolved<'_, C>, Call)],
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        if let [item] = items {
            let (backend, call) = &resolved[0];
            let answer = match item.charge {
                Charge::Ask => self.call_one(backend.backend(), call, item.cost).await?,
                Charge::Record => self.record_one(backend.backend(), call, item.cost).await?,
                Charge::GiveBack => {
                    self.give_back_one(backend.backend(), call, item.cost)
                        .await?
                }
            };
            let admitted = answer.decision.is_allowed() || item.never_denies();
            return Ok((admitted, vec![answer]));
        }
        let Some((first, _)) = resolved.first() else {
            return Ok((true, Vec::new()));
        };
        let Some(first) = first.backend().redis_stack() else {
            return Err(DecideError::Unavailable(
                "a batch mixes stores; every policy of one limiterd uses the same store".into(),
            ));
        };
        let mut batch = first.backend().batch();
        for (item, (backend, call)) in items.iter().zip(resolved) {
            let Some(stack) = backend.backend().redis_stack() else {
                return Err(DecideError::Unavailable(
                    "a batch mixes stores; every policy of one limiterd uses the same store".into(),
                ));
            };
            if item.charge == Charge::GiveBack {
                return Err(DecideError::Invalid {
                    field: "cost",
                    message: "units given back are decided alone, never in a batch: send them \
                              on their own"
                        .into(),
                });
            }
            if item.charge == Charge::Record {
                batch.add_record(stack, call, item.cost);
            } else if item.shadow {
                batch.add_shadow(stack, call, item.cost);
            } else {
                batch.add(stack, call, item.cost);
            }
        }
        let decided = match batch.decide().await {
            Ok(decided) => decided,
            // Keys in several slots of a cluster: decided one item at a time instead.
            Err(BatchError::CrossSlot { .. }) => {
                return self.decide_across_slots(items, resolved).await;
            }
            Err(e) => return Err(batch_error(&e)),
        };
        let admitted = decided.is_admitted();
        let answers = decided
            .into_decisions()
            .into_iter()
            .zip(resolved)
            .map(|(decision, (backend, call))| self.redis_answer(decision, backend.backend(), call))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((admitted, answers))
    }

    /// A batch whose keys span a cluster's slots (several identifiers, or envoy descriptors):
    /// no script can decide it whole, so each item is decided in turn (records written, the
    /// others taken with a grant), and if one is denied every grant is refunded and the items
    /// report what they hold after it, as in memory. Between the take and the refund the
    /// units are held (a racing call may be denied a moment early); none is ever admitted past
    /// a limit.
    async fn decide_across_slots(
        &self,
        items: &[Item],
        resolved: &[(Resolved<'_, C>, Call)],
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        let mut answers = Vec::with_capacity(items.len());
        let mut grants = Vec::new();
        let mut all = true;
        for (i, (item, (backend, call))) in items.iter().zip(resolved).enumerate() {
            let backend = backend.backend();
            let Some(stack) = backend.redis_stack() else {
                return Err(DecideError::Unavailable(
                    "a batch mixes stores; every policy of one limiterd uses the same store".into(),
                ));
            };
            let answer = if item.charge == Charge::Record {
                self.record_one(backend, call, item.cost).await?
            } else {
                let (decision, grant) = stack
                    .acquire(call, item.cost)
                    .await
                    .map_err(|e| call_error(&e.into()))?;
                if let Some(grant) = grant {
                    grants.push((i, grant));
                }
                self.redis_answer(decision, backend, call)?
            };
            all &= answer.decision.is_allowed() || item.never_denies();
            answers.push(answer);
        }
        if !all {
            for (i, mut grant) in grants {
                let (backend, call) = &resolved[i];
                let (Some(stack), units) = (backend.backend().redis_stack(), grant.left()) else {
                    continue;
                };
                // Refunded, the item reports what it holds now; a refund Redis did not take
                // leaves the units counted (never admitted twice).
                if let Ok(peek) = stack.refund(call, &mut grant, units).await {
                    answers[i] = self.redis_answer(peek, backend.backend(), call)?;
                }
            }
        }
        Ok((all, answers))
    }

    /// One call on any store: in process through the seam, on Redis keeping when Redis
    /// decided.
    async fn call_one(
        &self,
        backend: &Backend<C>,
        call: &Call,
        cost: u64,
    ) -> Result<Answer, DecideError> {
        let decided = match backend {
            Backend::Redis(stack) => stack.check_n(call, cost).await,
            Backend::Leased(stack) => stack.check_n(call, cost).await,
            Backend::Memory(_) => {
                let outcome = backend.limiter().decide_request(call, cost).await;
                return self.answer(outcome, backend, call, None);
            }
        };
        let decision = decided.map_err(|e| call_error(&e.into()))?;
        self.redis_answer(decision, backend, call)
    }

    /// A Redis store's answer, read as every answer is ([`answer`](Self::answer)), at the
    /// instant Redis decided it.
    fn redis_answer(
        &self,
        decision: limiter_redis::RedisDecision,
        backend: &Backend<C>,
        call: &Call,
    ) -> Result<Answer, DecideError> {
        let at = decision.decided_at_micros();
        self.answer(Ok(Outcome::from(decision)), backend, call, at)
    }

    /// One record of usage on a Redis store (per call, or spending the lease first).
    async fn record_one(
        &self,
        backend: &Backend<C>,
        call: &Call,
        cost: u64,
    ) -> Result<Answer, DecideError> {
        let recorded = match backend {
            Backend::Redis(stack) => stack.record(call, cost).await,
            Backend::Leased(stack) => stack.record(call, cost).await,
            Backend::Memory(stack) => {
                let outcome = stack.record(call, cost).map(Outcome::in_process);
                return self.answer(outcome, backend, call, None);
            }
        };
        let decision = recorded.map_err(|e| call_error(&e.into()))?;
        self.redis_answer(decision, backend, call)
    }

    /// Units given back on a Redis store (a leased policy's go to Redis: its leases are its own).
    async fn give_back_one(
        &self,
        backend: &Backend<C>,
        call: &Call,
        units: u64,
    ) -> Result<Answer, DecideError> {
        let stack = match backend {
            Backend::Redis(stack) => stack,
            Backend::Leased(stack) => stack.stack(),
            Backend::Memory(stack) => {
                let outcome = stack.give_back(call, units).map(Outcome::in_process);
                return self.answer(outcome, backend, call, None);
            }
        };
        match stack.give_back(call, units).await {
            Ok(decision) => self.redis_answer(decision, backend, call),
            Err(e) => {
                self.metrics.backend_error();
                Err(DecideError::Unavailable(e.to_string()))
            }
        }
    }

    /// An [`Outcome`] as the API reports it, counting backend failures and failure-policy
    /// answers: the one place a store's answer is read. `at_us` is when Redis decided it (µs
    /// since the Unix epoch); `None`: this process decided it, now.
    fn answer(
        &self,
        outcome: Result<Outcome, CallError>,
        backend: &Backend<C>,
        call: &Call,
        at_us: Option<u64>,
    ) -> Result<Answer, DecideError> {
        let at_unix_ns = match at_us {
            Some(us) => us.saturating_mul(1_000),
            None => self.unix_origin_ns.saturating_add(self.clock.now()),
        };
        let failed = |policy: FailurePolicy| {
            self.metrics.backend_error();
            self.metrics.failure_policy(policy);
        };
        match outcome.map_err(|e| call_error(&e))? {
            Outcome::Decided { decision, origin } => {
                let origin = match origin {
                    limiter_stack::Origin::InProcess => Origin::Memory,
                    limiter_stack::Origin::DenyCache => Origin::DenyCache,
                    limiter_stack::Origin::Lease => Origin::Lease,
                    limiter_stack::Origin::Fallback => {
                        failed(FailurePolicy::Fallback);
                        Origin::Fallback
                    }
                    _ => Origin::Redis,
                };
                Ok(Answer {
                    decision: decision.decision(),
                    origin,
                    at_unix_ns,
                })
            }
            Outcome::FailedOpen(_) => {
                failed(FailurePolicy::Open);
                // Admitted without counting: the policy's tightest limit, with nothing taken.
                let limit = policy_limit(backend, call.plan);
                Ok(Answer {
                    decision: Decision::allow(limit, limit, 0),
                    origin: Origin::FailOpen,
                    at_unix_ns,
                })
            }
            Outcome::FailedClosed(e) => {
                failed(FailurePolicy::Closed);
                Err(DecideError::Unavailable(e.to_string()))
            }
        }
    }
}

/// The smallest count among the limits `backend` applies under `plan` (a configured policy's
/// one plan, or an ad-hoc shape's): what a fail-open answer reports as its limit.
fn policy_limit<C: Clock + Send + Sync + 'static>(backend: &Backend<C>, plan: usize) -> u64 {
    backend
        .limiter()
        .layers()
        .iter()
        .filter_map(|layer| layer.plans.get(plan).or_else(|| layer.plans.first()))
        .flatten()
        .map(Limit::count)
        .min()
        .unwrap_or(0)
}

/// A batch Redis cannot decide as the API reports it.
fn batch_error(error: &BatchError) -> DecideError {
    match error {
        BatchError::Call { source, .. } => call_error(&source.clone().into()),
        other => DecideError::Unavailable(other.to_string()),
    }
}

/// Polls `future` once and returns its output: a memory engine decides at once, so its
/// futures are ready on the first poll (for tests and fuzz bodies, which run no runtime).
///
/// # Panics
/// If the future is not ready (a Redis store's would not be).
#[doc(hidden)]
pub fn decided_at_once<T>(future: impl std::future::Future<Output = T>) -> T {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    let mut future = std::pin::pin!(future);
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(value) => value,
        std::task::Poll::Pending => panic!("a memory engine decides at once"),
    }
}

impl<C> Engine<C> {
    /// Hands back every lease the leased policies hold (at shutdown: leases not handed back
    /// are lost until they expire). Returns the units handed back.
    pub async fn release_leases(&self) -> u64 {
        let mut units = 0u64;
        for entry in &self.policies {
            if let Backend::Leased(stack) = entry.backend.as_ref() {
                units = units.saturating_add(stack.shutdown().await);
            }
        }
        units
    }
}

fn held<C: Clock>(backend: &Backend<C>) -> u64 {
    match backend {
        Backend::Memory(stack) => stack.len(),
        Backend::Redis(_) | Backend::Leased(_) => 0,
    }
}

/// A policy's backend, or a shared ad-hoc one, with the counters its answers go to.
enum Resolved<'a, C> {
    Configured(&'a Arc<Backend<C>>, &'a PolicyCounters),
    AdHoc(Arc<Backend<C>>, &'a PolicyCounters),
}

impl<C> Resolved<'_, C> {
    fn backend(&self) -> &Backend<C> {
        match self {
            Self::Configured(b, _) => b,
            Self::AdHoc(b, _) => b,
        }
    }

    fn counters(&self) -> &PolicyCounters {
        match self {
            Self::Configured(_, c) | Self::AdHoc(_, c) => c,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use limiter_core::ManualClock;

    use super::*;

    fn engine(text: &str) -> (Engine<ManualClock>, ManualClock) {
        let config = Config::parse(text).expect("valid");
        let clock = ManualClock::new();
        let metrics = Arc::new(Metrics::new());
        let engine = Engine::new(&config, clock.clone(), None, metrics).expect("builds");
        (engine, clock)
    }

    fn item(id: &str, cost: u64) -> Item {
        Item {
            target: Target::Policy(PolicyId(0)),
            identifier: id.into(),
            cost,
            shadow: false,
            charge: Charge::Ask,
        }
    }

    #[test]
    fn a_denied_batch_refunds_exactly_at_its_own_instant() {
        let (engine, clock) = engine(
            "[policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 4, period = \"1s\" }]\n",
        );
        clock.advance(Duration::from_millis(10));
        let (ok, answers) =
            decided_at_once(engine.decide(&[item("a", 3), item("b", 4), item("a", 2)]))
                .expect("valid");
        assert!(!ok);
        assert_eq!(
            answers
                .iter()
                .map(|a| a.decision.is_allowed())
                .collect::<Vec<_>>(),
            [true, true, false]
        );
        // Everything came back: both keys are full at the same instant.
        for id in ["a", "b"] {
            let (_, peek) = decided_at_once(engine.decide(&[item(id, 0)])).expect("valid");
            assert_eq!(peek[0].decision.remaining(), 4, "{id}");
        }
    }

    #[test]
    fn a_bounded_memory_store_refuses_new_identifiers_until_one_refills() {
        let (engine, clock) = engine(
            "[store]\nkind = \"memory\"\nmax_keys = 1\n[policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }]\n",
        );
        assert!(
            decided_at_once(engine.decide(&[item("a", 1)]))
                .expect("valid")
                .0
        );
        let err = decided_at_once(engine.decide(&[item("b", 1)])).expect_err("full");
        assert!(matches!(err, DecideError::Full(_)), "{err}");
        assert!(
            !decided_at_once(engine.decide(&[item("a", 1)]))
                .expect("held keys go on")
                .0
        );
        clock.advance(Duration::from_secs(1));
        assert!(
            decided_at_once(engine.decide(&[item("b", 1)]))
                .expect("a refilled and made room")
                .0
        );
        assert_eq!(engine.keys_held(), 1);
    }

    #[test]
    fn max_keys_is_exact_per_policy() {
        for max in [10, 100, 1_000] {
            let (engine, clock) = engine(&format!(
                "[store]\nkind = \"memory\"\nmax_keys = {max}\n[policies.p]\nlimits = [{{ algorithm = \"fixed_window\", count = 1, period = \"1m\" }}]\n"
            ));
            for n in 0..max {
                let (ok, _) = decided_at_once(engine.decide(&[item(&format!("id{n}"), 1)]))
                    .unwrap_or_else(|e| panic!("max_keys {max}: identifier {n} refused: {e}"));
                assert!(ok);
            }
            let err = decided_at_once(engine.decide(&[item("one-more", 1)])).expect_err("full");
            assert!(matches!(err, DecideError::Full(_)), "{err}");
            assert_eq!(engine.keys_held(), max as u64);
            clock.advance(Duration::from_secs(60));
            assert!(
                decided_at_once(engine.decide(&[item("one-more", 1)]))
                    .expect("room")
                    .0
            );
        }
    }
}
