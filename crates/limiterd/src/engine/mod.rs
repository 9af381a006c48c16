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
//! Every call goes through the workspace's one seam, [`AsyncLimiter`], and its [`Outcome`](limiter_stack::Outcome)
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
//!
//! Its parts: `build.rs` (a policy's stack for the store, carried over on reload; ad-hoc
//! shapes), `decide.rs` (items resolved and decided, all or nothing, in memory or on Redis,
//! and every store's outcome read as an [`Answer`]).

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use limiter_core::{Clock, Decision};
use limiter_redis::{Kind, LeasedStack, OnFailure, RedisBackend, RedisStack};
use limiter_stack::{AsyncLimiter, Layer, Stack};

use crate::config::{Config, Policy, Store, StoreKind};
use crate::metrics::{AD_HOC, Metrics, PolicyCounters};

mod build;
mod decide;
mod item;

pub use item::{Answer, Charge, DecideError, EngineError, Item, MAX_TIME_AHEAD_MS, Origin, Target};

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

    /// Which store policies are checked for ([`CheckedLimit::new`](crate::config::CheckedLimit::new)).
    pub fn store_kind(&self) -> StoreKind {
        match self.store {
            StoreHandle::Memory { .. } => StoreKind::Memory,
            StoreHandle::Redis(..) => StoreKind::Redis,
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
