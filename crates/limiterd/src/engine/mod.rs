//! The decision engine behind the API: one stack per configured policy (layers: the limits
//! keyed by identifier, then the global ones), in process or on Redis, and ad-hoc limits
//! (`limit` per `duration_ms`, keyed by namespace and identifier).
//!
//! An ad-hoc counter is named by what the caller names (namespace and identifier), never by the
//! limit it sends: a caller that changes the limit keeps its consumption, rescaled as the same
//! fraction of the new limit (rounded up), so it cannot reset its budget by sending another
//! limit. In process every ad-hoc limit is a plan of one open layer
//! ([`Layer::open_plans`](limiter_stack::Layer::open_plans)), added on first use; on Redis each shape's stack names the same
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
//! The engine knows no store: [`Stacks`] builds each policy's stack, and every call goes
//! through the workspace's one seam, [`AsyncLimiter`] (one ask, or a batch by
//! [`stacks::decide_batch`](crate::stacks::decide_batch), which knows each Redis policy's stack
//! by type); its [`Outcome`](limiter_stack::Outcome) becomes
//! an [`Answer`] in one place (`Engine::answer`), whatever the store.
//!
//! A batch is all or nothing: in process, its items are decided in order at one clock reading,
//! each admitted item keeping a grant; if any item is denied, every grant is refunded, so the
//! batch leaves no trace, and the admitted items report what they hold after it. (A concurrent
//! caller may be denied while the units are briefly held; none is ever admitted past a limit.)
//! On Redis a batch is one script call that decides every item at one `TIME` and writes only
//! if every enforced item admitted, so no caller can slip in between and a denied batch takes
//! nothing (across a cluster's slots, grants and refunds as in process).
//!
//! Its parts: `reload.rs` (a policy's stack carried over on reload; ad-hoc shapes added),
//! `shapes.rs` (the ad-hoc shapes seen, found per shard of threads), `decide.rs` (items
//! resolved and decided through the seam, and every store's outcome read as an [`Answer`]),
//! `permitted.rs` (concurrency limits' permits), `quota_take.rs` and `quota_batch.rs`
//! (calendar quotas on Redis taken with the stack, alone and in a batch), `quota_answer.rs`
//! (their answers folded with the stack's).

use std::collections::HashMap;
use std::sync::Arc;

use limiter_core::{Clock, Decision};
use limiter_stack::{AsyncLimiter, Kind};

use crate::config::{Config, Policy, StoreKind};
use crate::metrics::{AD_HOC, Metrics, PolicyCounters};
pub use crate::stacks::{
    AdHocHome, Call, EngineError, MAX_AD_HOC_SHAPES, PolicyStack, RELOAD_PLANS, Stacks,
};
use shapes::AdHocShapes;

mod decide;
mod item;
mod permitted;
mod quota_answer;
mod quota_batch;
mod quota_take;
mod reload;
mod shapes;

pub use item::{Answer, DecideError, Item, MAX_TIME_AHEAD_MS, Target, source_name};
pub use limiter_stack::Charge;

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
struct Previous {
    entries: HashMap<String, (Policy, PolicyStack, usize)>,
    /// Whether the stacks' store settings (a Redis store's failure policy or fleet size)
    /// changed: its stacks hold both.
    store_changed: bool,
    carried: Carried,
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

/// An ad-hoc limit's shape: the algorithm, `limit` per `duration_ms`.
type Shape = (Kind, u64, u64);

/// Where an ad-hoc shape is decided: a stack, and the shape's plan in it.
type AdHocStack = (PolicyStack, usize);

/// The hasher of the maps looked up on every request (policies by name, ad-hoc shapes, unkey's
/// overrides): foldhash, seeded per process. What callers add to them is bounded (ad-hoc
/// shapes) or set through the authenticated API (overrides).
pub(crate) type FastHash = foldhash::fast::RandomState;

/// A policy: its name (its metrics label), what it was built from, its stack (shared with
/// the engine it was carried over from), the plan its calls choose, and its counters.
struct Entry {
    name: String,
    stack_name: String,
    spec: Policy,
    stack: PolicyStack,
    plan: usize,
    counters: PolicyCounters,
    /// The concurrency limit's permits, if the policy has one.
    permits: Option<crate::store::permits::PolicyPermits>,
    /// The calendar quotas kept beside the stack (on Redis).
    quotas: Vec<crate::store::quotas::PolicyQuota>,
}

/// Every policy's stack, the ad-hoc stacks, and the clock they share.
pub struct Engine<C> {
    stacks: Stacks<C>,
    policies: Vec<Entry>,
    /// Every request names its policy: foldhash, not SipHash (about 200 instructions a
    /// lookup less; the names are the configuration's, and a miss inserts nothing).
    by_name: HashMap<String, PolicyId, FastHash>,
    /// Each ad-hoc shape's stack and plan: in process, the one open stack and the shape's plan
    /// in it; on Redis, the shape's own stack (plan 0). At most `MAX_AD_HOC_SHAPES`, so a
    /// caller choosing shapes cannot grow it past that whatever the hash.
    ad_hoc: AdHocShapes,
    /// In process, the stack every ad-hoc shape is a plan of.
    ad_hoc_home: Option<AdHocHome>,
    ad_hoc_counters: PolicyCounters,
    metrics: Arc<Metrics>,
    /// While a reload builds this engine: the policies of the one it replaces.
    previous: Option<Previous>,
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
    /// Builds every configured policy's stack with `stacks`, registering each policy's
    /// counters in `metrics` under its name.
    pub fn new(
        config: &Config,
        stacks: Stacks<C>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, EngineError> {
        let mut engine = Self {
            ad_hoc_home: stacks.ad_hoc_home()?,
            unix_origin_ns: stacks.unix_origin_ns(),
            stacks,
            policies: Vec::new(),
            by_name: HashMap::default(),
            ad_hoc: AdHocShapes::new(HashMap::default()),
            ad_hoc_counters: metrics.policy(AD_HOC),
            metrics,
            previous: None,
        };
        engine.add_configured(config)?;
        Ok(engine)
    }

    /// The engine for `config` in place of `self`, which keeps serving until the caller swaps
    /// them: every policy and descriptor limit whose limits did not change keeps its stack,
    /// changed ones keep their consumption (see the module docs). Add envoy's limits with
    /// [`add_policy`](Self::add_policy), then call [`carried`](Self::carried).
    ///
    /// The store itself (memory or Redis, the URL and timeout) cannot change: the caller
    /// refuses such a configuration. The failure policy, the fleet's size and `max_keys` can.
    pub fn reloaded(&self, config: &Config) -> Result<Self, EngineError> {
        let stacks = self.stacks.reconfigured(&config.store)?;
        // Ad-hoc stacks carry over unless the stacks' settings changed (a Redis store's
        // failure policy or fleet: its stacks hold those; the keys they name stay in Redis).
        let same_store = stacks.same_as(&self.stacks);
        let ad_hoc = if same_store {
            self.ad_hoc.all()
        } else {
            HashMap::default()
        };
        let entries = self.policies.iter().map(|e| {
            let carried = (e.spec.clone(), e.stack.clone(), e.plan);
            (e.stack_name.clone(), carried)
        });
        let mut engine = Self {
            stacks,
            policies: Vec::new(),
            by_name: HashMap::default(),
            ad_hoc: AdHocShapes::new(ad_hoc),
            ad_hoc_home: self.ad_hoc_home.clone(),
            ad_hoc_counters: self.ad_hoc_counters.clone(),
            metrics: Arc::clone(&self.metrics),
            previous: Some(Previous {
                entries: entries.collect(),
                store_changed: !same_store,
                carried: Carried::default(),
            }),
            unix_origin_ns: self.unix_origin_ns,
        };
        engine.add_configured(config)?;
        Ok(engine)
    }

    fn add_configured(&mut self, config: &Config) -> Result<(), EngineError> {
        for (name, policy) in &config.policies {
            let id = self.add_policy(name, name, policy)?;
            self.by_name.insert(name.clone(), id);
        }
        Ok(())
    }

    /// Ends a reload: what happened to each policy's counters, and the replaced engine's
    /// policies let go. Empty for an engine not built by [`reloaded`](Self::reloaded).
    pub fn carried(&mut self) -> Carried {
        self.previous.take().map(|p| p.carried).unwrap_or_default()
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
        let (stack, plan) = match self.carry_over(name, stack_name, policy) {
            Some(found) => found,
            None => (self.stacks.build(stack_name, policy)?, 0),
        };
        let permits = self.stacks.permits(stack_name, policy)?;
        let quotas = self.stacks.quotas(stack_name, policy)?;
        self.policies.push(Entry {
            name: name.to_owned(),
            stack_name: stack_name.to_owned(),
            spec: policy.clone(),
            stack,
            plan,
            counters: self.metrics.policy(name),
            permits,
            quotas,
        });
        Ok(PolicyId(self.policies.len() - 1))
    }
}

impl<C> Engine<C> {
    /// Which store policies are checked for ([`CheckedLimit::new`](crate::config::CheckedLimit::new)).
    pub fn store_kind(&self) -> StoreKind {
        self.stacks.kind()
    }

    /// The stacks' store: what it is, and what its policies do when it fails.
    pub fn stacks(&self) -> &Stacks<C> {
        &self.stacks
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
        let policies = self.policies.iter().map(|p| p.stack.keys_held());
        let ad_hoc = self.ad_hoc_home.as_ref().map_or(0, |s| s.keys_held());
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

    /// Refunds every lease the leased policies hold (at shutdown: leases not refunded are
    /// lost until they expire). Returns the units refunded.
    pub async fn refund_leases(&self) -> u64 {
        let mut units = 0u64;
        for entry in &self.policies {
            units = units.saturating_add(entry.stack.refund_leases().await);
        }
        units
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use limiter_core::ManualClock;

    use super::*;

    /// An engine on a manual clock for the configuration `text`, in memory.
    pub(super) fn engine(text: &str) -> (Engine<ManualClock>, ManualClock) {
        let config = Config::parse(text).expect("valid");
        let clock = ManualClock::new();
        let metrics = Arc::new(Metrics::new());
        let stacks = Stacks::open(&config.store, clock.clone(), None).expect("memory");
        let engine = Engine::new(&config, stacks, metrics).expect("builds");
        (engine, clock)
    }

    /// A take of `cost` for `id` on the first policy.
    pub(super) fn item(id: &str, cost: u64) -> Item {
        Item {
            target: Target::Policy(PolicyId(0)),
            identifier: id.into(),
            cost,
            shadow: false,
            charge: Charge::Take,
        }
    }

    /// A request's decision is a future its server boxes and moves whole: the gated and
    /// batched paths, whose state holds answers across store calls, are boxed behind it, so
    /// the usual request's future stays a few hundred bytes (it was 6.2 KB with them inline).
    #[test]
    fn a_decisions_future_stays_small() {
        let (engine, _clock) = engine(
            "[policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }]\n",
        );
        let item = item("a", 1);
        let one = std::mem::size_of_val(&engine.decide_one(&item, None));
        let batch = std::mem::size_of_val(&engine.decide(std::slice::from_ref(&item)));
        assert!(one <= 1_024, "decide_one's future is {one} bytes");
        assert!(batch <= 1_024, "decide's future is {batch} bytes");
    }

    /// A daily quota in Berlin across the 25-hour 2026-10-25: the window ends at local
    /// midnight, and the answer's `reset_at_ms` names it.
    #[test]
    fn a_calendar_quota_resets_at_local_midnight() {
        let text = "[policies.p]\nlimits = [{ algorithm = \"fixed_window\", count = 2, period = \"1d\", calendar = \"Europe/Berlin\" }]\n";
        let config = Config::parse(text).expect("valid");
        let clock = ManualClock::new();
        let mut stacks = Stacks::open(&config.store, clock.clone(), None).expect("memory");
        let midnight_ms = 1_792_879_200_000; // 2026-10-25 00:00 in Berlin (summer time)
        stacks.set_unix_origin_ns(midnight_ms * 1_000_000);
        let engine = Engine::new(&config, stacks, Arc::new(Metrics::new())).expect("builds");
        clock.advance(Duration::from_secs(3_600));
        let (ok, answers) = decided_at_once(engine.decide(&[item("a", 2)])).expect("valid");
        assert!(ok);
        // The day lasts 25 hours: it ends at 2026-10-26 00:00 in Berlin (winter time).
        assert_eq!(answers[0].reset_at_ms(), 1_792_969_200_000);
        let (ok, answers) = decided_at_once(engine.decide(&[item("a", 1)])).expect("valid");
        assert!(!ok);
        assert_eq!(
            answers[0].decision.retry_after(),
            Duration::from_secs(24 * 3_600)
        );
        clock.advance(Duration::from_secs(24 * 3_600));
        assert!(
            decided_at_once(engine.decide(&[item("a", 1)]))
                .expect("valid")
                .0
        );
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
