//! Where the engine's policies live: [`Stacks`] builds a policy's stack for the configured
//! store (in this process, on Redis per call, or against leases on Redis) from one definition
//! of its layers (`limits.rs`), and hands it to the engine behind the workspace's one seam
//! ([`Charges`], an [`AsyncLimiter`](limiter_stack::AsyncLimiter) that takes every charge),
//! with the permits of a policy's concurrency limit on the same store ([`Stacks::permits`]). The engine above it decides, batches,
//! refunds and reloads through the seam alone, and names no store crate.
//!
//! In process a layer is open to more plans ([`RELOAD_PLANS`] of them: a reload's changed
//! limits become a plan, see the engine), and the ad-hoc limits share one stack whose plans
//! are their shapes ([`Stacks::ad_hoc_home`]). On Redis keys are named by stack, layer and
//! limit's place, so a new stack for changed limits finds them and the script rescales them
//! ([`Stacks::names_keys`]); every ad-hoc shape is a stack of its own under one name.

use std::sync::Arc;

use limiter_core::Clock;
use limiter_stack::{
    BatchAnswer, BatchItem, CallError, Charges, HoldsKeys, Layer, OpenPlans, Plan, Stack,
    decide_all,
};

use crate::config::{Policy, Store, StoreKind};
use crate::store::permits::{MemoryPermits, PolicyPermits};
use crate::store::quotas::{PolicyQuota, QuotaTables};
use crate::store::{LeasedStack, OnFailure, RedisBackend, RedisStack};

mod limits;

pub use limits::groups;
pub(crate) use limits::with_limit;
use limits::{NoRateLimits, layer};

/// How many times one in-process policy's limits can change by reload with its counters kept
/// (each change is a plan of its layers); past that, a change starts its counters afresh.
pub const RELOAD_PLANS: usize = 32;

/// The most distinct ad-hoc limit shapes (`limit` and `duration_ms` pairs) one process keeps a
/// stack for; a request for another is refused and should become a configured policy.
pub const MAX_AD_HOC_SHAPES: usize = 1_024;

/// What a stack decides on: one identifier, and the plan its calls choose (a reload's plan of
/// a policy, an ad-hoc shape's plan; 0 elsewhere).
#[derive(Debug)]
pub struct Call {
    /// Whose state.
    pub identifier: Arc<str>,
    /// The plan of every layer.
    pub plan: usize,
}

/// A policy's stack on any store, as the engine holds it: decided through the seam (it
/// dereferences to [`Charges`], every charge and batch item), and kept by type beside it, so
/// what only one store does is asked of that store's type: plans added and keys counted in
/// process, a batch of Redis policies in one script ([`decide_batch`]), leases refunded at
/// shutdown. Nothing looks behind the seam.
#[derive(Clone)]
pub struct PolicyStack {
    limiter: Arc<dyn Charges<Call>>,
    on: OnStore,
}

/// A policy's stack by its store's type.
#[derive(Clone)]
enum OnStore {
    Memory(Arc<dyn InMemory>),
    PerCall(Arc<RedisStack<Call>>),
    Leased(Arc<LeasedStack<Call>>),
}

/// What an in-process stack can do beyond deciding.
trait InMemory: HoldsKeys + OpenPlans + Send + Sync {}

impl<T: HoldsKeys + OpenPlans + Send + Sync> InMemory for T {}

impl PolicyStack {
    fn memory<S: Charges<Call> + InMemory + 'static>(stack: Arc<S>) -> Self {
        Self {
            limiter: stack.clone(),
            on: OnStore::Memory(stack),
        }
    }

    fn redis(stack: RedisStack<Call>) -> Self {
        let stack = Arc::new(stack);
        Self {
            limiter: stack.clone(),
            on: OnStore::PerCall(stack),
        }
    }

    fn leased(stack: LeasedStack<Call>) -> Self {
        let stack = Arc::new(stack);
        Self {
            limiter: stack.clone(),
            on: OnStore::Leased(stack),
        }
    }

    /// The per-call Redis stack a batch decides this policy on (a leased policy's too: a batch
    /// is decided on Redis, not against a lease); `None` in process.
    pub(crate) fn per_call(&self) -> Option<&RedisStack<Call>> {
        match &self.on {
            OnStore::Memory(_) => None,
            OnStore::PerCall(stack) => Some(stack),
            OnStore::Leased(stack) => Some(stack.stack()),
        }
    }

    /// Whether the stack decides its takes against leases held in this process (a take
    /// there cannot be undone, and costs no round trip).
    pub(crate) fn is_leased(&self) -> bool {
        matches!(self.on, OnStore::Leased(_))
    }

    /// The stack's open plans, in process (a reload's changed limits and the ad-hoc shapes
    /// become plans); `None` on Redis, where a new stack finds the old one's keys by name.
    pub fn open_plans(&self) -> Option<&dyn OpenPlans> {
        match &self.on {
            OnStore::Memory(stack) => Some(&**stack),
            OnStore::PerCall(_) | OnStore::Leased(_) => None,
        }
    }

    /// Keys held in this process's memory (0 on Redis, whose keys expire there).
    pub fn keys_held(&self) -> u64 {
        match &self.on {
            OnStore::Memory(stack) => stack.keys_held(),
            OnStore::PerCall(_) | OnStore::Leased(_) => 0,
        }
    }

    /// Refunds the leases a leased policy holds (at shutdown: leases not refunded are lost
    /// until they expire), answering the units refunded; 0 for any other stack.
    pub async fn refund_leases(&self) -> u64 {
        match &self.on {
            OnStore::Leased(stack) => stack.refund_leases().await,
            OnStore::Memory(_) | OnStore::PerCall(_) => 0,
        }
    }
}

impl std::ops::Deref for PolicyStack {
    type Target = dyn Charges<Call>;

    fn deref(&self) -> &Self::Target {
        &*self.limiter
    }
}

impl std::fmt::Debug for PolicyStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let store = match self.on {
            OnStore::Memory(_) => "memory",
            OnStore::PerCall(_) => "redis",
            OnStore::Leased(_) => "redis, leased",
        };
        f.debug_struct("PolicyStack")
            .field("store", &store)
            .finish_non_exhaustive()
    }
}

/// In process, the one stack every ad-hoc shape (a `limit` and `duration_ms` pair) is a plan
/// of: decided as a policy's stack, its shapes added as plans.
#[derive(Clone)]
pub struct AdHocHome {
    stack: PolicyStack,
    shapes: Arc<dyn InMemory>,
}

impl std::fmt::Debug for AdHocHome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdHocHome")
            .field("keys_held", &self.keys_held())
            .finish_non_exhaustive()
    }
}

impl AdHocHome {
    /// The stack, decided as a policy's.
    pub fn stack(&self) -> &PolicyStack {
        &self.stack
    }

    /// Adds a shape's plan (one limit), answering its index; refused past
    /// [`MAX_AD_HOC_SHAPES`].
    pub fn add_shape(&self, plan: Plan) -> Result<usize, limiter_stack::BuildError> {
        self.shapes.add_plan(0, plan)
    }

    /// Keys held.
    pub fn keys_held(&self) -> u64 {
        self.shapes.keys_held()
    }
}

/// Decides `batch` all or nothing, item `i` on `stacks[i]`: in one Redis script call when every
/// item's policy is on Redis (one backend, one slot; else item by item), by takes and refunds
/// through the seam otherwise.
pub async fn decide_batch(
    batch: &[BatchItem<'_, Call>],
    stacks: &[&PolicyStack],
    at: Option<u64>,
) -> Result<BatchAnswer, CallError> {
    let on_redis: Option<Vec<&RedisStack<Call>>> = stacks.iter().map(|s| s.per_call()).collect();
    match on_redis {
        Some(on_redis) if on_redis.len() > 1 => {
            crate::store::decide_batch(batch, &on_redis, at).await
        }
        _ => decide_all(batch, at).await,
    }
}

/// Why a policy's stack could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The configuration names a Redis store but no connection was given.
    #[error(
        "the store is Redis but no Redis connection was made; connect first (limiterd does this from `[store] url`)"
    )]
    NoBackend,
    /// A policy's stack (in process or on Redis) was refused.
    #[error("policy `{policy}`: {source}")]
    Stack {
        /// The policy.
        policy: String,
        /// Why.
        #[source]
        source: limiter_stack::BuildError,
    },
}

enum Place {
    Memory {
        max_keys: Option<usize>,
    },
    /// The backend, the default failure policy and the fleet's size.
    Redis(RedisBackend, OnFailure, u64),
}

/// Builds policies' stacks on one store, on one clock.
pub struct Stacks<C> {
    clock: C,
    /// The Unix time, in ns, of the clock's reading 0: where calendar windows start.
    unix_origin_ns: u64,
    place: Place,
    /// In memory, each policy's permit table by stack name, shared by the stacks a reload
    /// builds: permits held survive a reload.
    permit_tables: PermitTables,
    /// On Redis, the stand-ins of falling-back policies' calendar quotas by quota name, shared
    /// the same way: what a node counted while Redis failed survives a reload.
    quota_tables: QuotaTables,
}

type PermitTables = Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<MemoryPermits>>>>;

impl<C> std::fmt::Debug for Stacks<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stacks")
            .field("store", &self.kind())
            .finish_non_exhaustive()
    }
}

impl<C> Stacks<C> {
    /// Which store the stacks are on (what limits are checked for).
    pub fn kind(&self) -> StoreKind {
        match self.place {
            Place::Memory { .. } => StoreKind::Memory,
            Place::Redis(..) => StoreKind::Redis,
        }
    }

    /// What a policy does when Redis fails unless it says otherwise: the store's choice.
    pub fn default_failure(&self) -> OnFailure {
        match &self.place {
            Place::Redis(_, on_failure, _) => *on_failure,
            Place::Memory { .. } => OnFailure::default(),
        }
    }

    /// The clock every in-process stack reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The Unix time, in ns, of the clock's reading 0 (see [`limiter_core::unix_origin`]).
    pub fn unix_origin_ns(&self) -> u64 {
        self.unix_origin_ns
    }

    /// Uses `origin_ns` as the Unix time of the clock's reading 0 (for tests on a manual
    /// clock: calendar windows start where it says; the stacks find it themselves otherwise).
    #[doc(hidden)]
    pub fn set_unix_origin_ns(&mut self, origin_ns: u64) {
        self.unix_origin_ns = origin_ns;
    }

    /// Whether a new stack for a policy finds the old one's keys by name (Redis: keys are named
    /// by stack, layer and place, and the script rescales those written under other limits),
    /// rather than holding them itself (in process).
    pub fn names_keys(&self) -> bool {
        matches!(self.place, Place::Redis(..))
    }

    /// Whether stacks built by `self` and `other` behave alike: the same failure policy and
    /// fleet size on Redis (a Redis stack holds both).
    pub fn same_as(&self, other: &Self) -> bool {
        match (&self.place, &other.place) {
            (Place::Redis(_, a, n), Place::Redis(_, b, m)) => a == b && n == m,
            (Place::Memory { .. }, Place::Memory { .. }) => true,
            _ => false,
        }
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> Stacks<C> {
    /// Stacks on `store` (a Redis store needs `backend`, connected by the caller).
    pub fn open(
        store: &Store,
        clock: C,
        backend: Option<RedisBackend>,
    ) -> Result<Self, EngineError> {
        let place = match (store, backend) {
            (Store::Memory { max_keys }, _) => Place::Memory {
                max_keys: *max_keys,
            },
            (
                Store::Redis {
                    on_failure,
                    fleet_size,
                    ..
                },
                Some(backend),
            ) => Place::Redis(backend, *on_failure, *fleet_size),
            (Store::Redis { .. }, None) => return Err(EngineError::NoBackend),
        };
        Ok(Self {
            unix_origin_ns: limiter_core::unix_origin(&clock),
            clock,
            place,
            permit_tables: PermitTables::default(),
            quota_tables: QuotaTables::default(),
        })
    }

    /// Stacks for a reloaded `store`, on the same connection and clock. The store itself
    /// cannot change (the caller refuses such a configuration); its failure policy, fleet
    /// size and `max_keys` can.
    pub fn reconfigured(&self, store: &Store) -> Result<Self, EngineError> {
        let place = match (&self.place, store) {
            (
                Place::Redis(backend, ..),
                Store::Redis {
                    on_failure,
                    fleet_size,
                    ..
                },
            ) => Place::Redis(backend.clone(), *on_failure, *fleet_size),
            (_, Store::Redis { .. }) => return Err(EngineError::NoBackend),
            (_, Store::Memory { max_keys }) => Place::Memory {
                max_keys: *max_keys,
            },
        };
        Ok(Self {
            clock: self.clock.clone(),
            unix_origin_ns: self.unix_origin_ns,
            place,
            permit_tables: Arc::clone(&self.permit_tables),
            quota_tables: Arc::clone(&self.quota_tables),
        })
    }

    /// The calendar quotas of `policy` kept beside its stack: on Redis, whose script knows no
    /// calendar (in memory a calendar window is one of the stack's limits; none here).
    pub fn quotas(
        &self,
        stack_name: &str,
        policy: &Policy,
    ) -> Result<Vec<PolicyQuota>, EngineError> {
        match &self.place {
            Place::Memory { .. } => Ok(Vec::new()),
            Place::Redis(backend, _, fleet) => {
                let tables = (&self.quota_tables, *fleet);
                limits::quotas_beside(policy, stack_name)
                    .and_then(|quotas| {
                        PolicyQuota::of(quotas, policy.on_failure, backend, stack_name, tables)
                    })
                    .map_err(|source| EngineError::Stack {
                        policy: stack_name.to_owned(),
                        source,
                    })
            }
        }
    }

    /// The permits of `policy`'s concurrency limit, if it has one: in this process (the table
    /// of `stack_name`, kept across reloads) or on Redis (keys named by `stack_name`).
    pub fn permits(
        &self,
        stack_name: &str,
        policy: &Policy,
    ) -> Result<Option<PolicyPermits>, EngineError> {
        let Some(limit) = policy.concurrency else {
            return Ok(None);
        };
        // This process's table of the policy's permits: its store in memory, its stand-in
        // while Redis fails on Redis; kept across reloads.
        let table = || {
            let mut tables = self
                .permit_tables
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let table = tables
                .entry(stack_name.to_owned())
                .or_insert_with(|| Arc::new(MemoryPermits::new(Arc::new(self.clock.clone()))));
            Arc::clone(table)
        };
        match &self.place {
            Place::Memory { .. } => Ok(Some(PolicyPermits::memory(limit, table()))),
            Place::Redis(backend, _, fleet) => {
                let fallback =
                    (policy.on_failure == OnFailure::Fallback).then(|| (table(), *fleet));
                { PolicyPermits::redis(limit, backend, stack_name, policy.on_failure, fallback) }
                    .map(Some)
                    .map_err(|source| EngineError::Stack {
                        policy: stack_name.to_owned(),
                        source,
                    })
            }
        }
    }

    /// The stack of `policy`, its state named `stack_name` (part of its Redis keys): one
    /// layer per keying (identifier first), each with the policy's limits of that keying.
    pub fn build(&self, stack_name: &str, policy: &Policy) -> Result<PolicyStack, EngineError> {
        let groups = groups(policy);
        if groups.is_empty() {
            // A policy of a concurrency limit alone: no rate layer, whatever the store.
            return Ok(PolicyStack::memory(Arc::new(NoRateLimits)));
        }
        match &self.place {
            Place::Memory { max_keys } => {
                let layers = groups.iter().map(|(keying, limits)| {
                    layer(*keying, limits, self.unix_origin_ns, |c: &Call| {
                        Some(Arc::clone(&c.identifier))
                    })
                    .open_plans(RELOAD_PLANS, limits.len(), |c: &Call| c.plan)
                });
                self.memory_stack(*max_keys, layers)
                    .map(PolicyStack::memory)
                    .map_err(|source| EngineError::Stack {
                        policy: stack_name.to_owned(),
                        source,
                    })
            }
            Place::Redis(backend, _, fleet) => {
                let layers = groups.iter().map(|(keying, limits)| {
                    layer(*keying, limits, self.unix_origin_ns, |c: &Call| {
                        Some(c.identifier.as_ref().to_owned())
                    })
                });
                let mut builder = RedisStack::builder(backend, stack_name)
                    .prefix(crate::store::KEY_PREFIX)
                    .on_failure(policy.on_failure)
                    .fleet_size(*fleet)
                    .layers(layers);
                // On a cluster, keys follow each identifier (spread over the masters); a
                // lease takes every limit in one script, so a leased policy of several
                // groups keeps its keys in one slot (leases keep its traffic to Redis low).
                if policy.lease.is_some() && groups.len() > 1 {
                    builder = builder.tag_by_stack();
                }
                let refused = |source| EngineError::Stack {
                    policy: stack_name.to_owned(),
                    source,
                };
                let stack = builder.build().map_err(refused)?;
                Ok(match policy.lease {
                    None => PolicyStack::redis(stack),
                    Some(lease) => PolicyStack::leased(stack.leased(lease).map_err(refused)?),
                })
            }
        }
    }

    /// In process, the one stack every ad-hoc shape is a plan of (an open layer keyed by
    /// identifier, room for [`MAX_AD_HOC_SHAPES`] plans of one limit); `None` on Redis, where
    /// each shape is a stack of its own.
    pub fn ad_hoc_home(&self) -> Result<Option<AdHocHome>, EngineError> {
        let Place::Memory { max_keys } = self.place else {
            return Ok(None);
        };
        let layer = Layer::keyed("identifier", |c: &Call| Some(Arc::clone(&c.identifier)))
            .open_plans(MAX_AD_HOC_SHAPES, 1, |c: &Call| c.plan);
        let stack = self
            .memory_stack(max_keys, [layer])
            .map_err(|source| EngineError::Stack {
                policy: crate::metrics::AD_HOC.to_owned(),
                source,
            })?;
        Ok(Some(AdHocHome {
            stack: PolicyStack::memory(stack.clone()),
            shapes: stack,
        }))
    }

    fn memory_stack(
        &self,
        max_keys: Option<usize>,
        layers: impl IntoIterator<Item = Layer<Call, Arc<str>>>,
    ) -> Result<Arc<Stack<Call, Arc<str>, C>>, limiter_stack::BuildError> {
        let mut builder = Stack::builder().clock(self.clock.clone()).layers(layers);
        if let Some(max_keys) = max_keys {
            builder = builder.max_keys(max_keys);
        }
        Ok(Arc::new(builder.build()?))
    }
}

#[cfg(test)]
mod tests {
    use limiter_core::ManualClock;
    use limiter_stack::Charge;
    use limiter_testkit::redis_server::RedisServer;

    use super::*;
    use crate::config::Config;

    fn item<'a>(stack: &'a PolicyStack, call: &'a Call, cost: u64) -> BatchItem<'a, Call> {
        BatchItem {
            limiter: &**stack,
            request: call,
            cost,
            charge: Charge::Take,
            shadow: false,
        }
    }

    /// A batch of Redis policies (one leased) is one script call, all or nothing; the
    /// policies are found by type, never by looking behind the seam.
    #[tokio::test]
    async fn a_batch_of_redis_policies_is_one_script_call() {
        let server = RedisServer::start();
        let text = format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\n\n\
             [policies.api]\nlimits = [{{ algorithm = \"token_bucket\", count = 3, period = \"1h\" }}]\n\n\
             [policies.leased]\nlimits = [{{ algorithm = \"token_bucket\", count = 100, period = \"1h\" }}]\nlease_slack = \"1%\"\n",
            server.url()
        );
        let config = Config::parse(&text).expect("valid");
        let backend = RedisBackend::connect(server.url().as_str())
            .await
            .expect("connects");
        let stacks =
            Stacks::open(&config.store, ManualClock::new(), Some(backend.clone())).expect("redis");
        let api = stacks
            .build("api", &config.policies["api"])
            .expect("builds");
        let leased = stacks
            .build("leased", &config.policies["leased"])
            .expect("builds");
        assert!(api.per_call().is_some() && leased.per_call().is_some());
        let ada = Call {
            identifier: "ada".into(),
            plan: 0,
        };
        let before = backend.stats().round_trips;
        let batch = [item(&api, &ada, 2), item(&leased, &ada, 1)];
        let answer = decide_batch(&batch, &[&api, &leased], None)
            .await
            .expect("decides");
        assert!(answer.admitted);
        assert_eq!(backend.stats().round_trips - before, 1, "one script call");
        // Over the api limit: refused whole, in one call, the leased policy untouched.
        let batch = [item(&api, &ada, 2), item(&leased, &ada, 1)];
        let answer = decide_batch(&batch, &[&api, &leased], None)
            .await
            .expect("decides");
        assert!(!answer.admitted);
        assert_eq!(backend.stats().round_trips - before, 2);
        let left = |outcome: &limiter_stack::Outcome| match outcome {
            limiter_stack::Outcome::Decided { decision, .. } => decision.decision().remaining(),
            other => panic!("decided: {other:?}"),
        };
        assert_eq!(
            left(&answer.outcomes[1]),
            99,
            "the refused batch took nothing"
        );
    }
}
