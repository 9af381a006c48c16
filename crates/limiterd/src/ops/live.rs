//! The configuration being served, swapped whole on reload.
//!
//! [`Live`] holds the [`AppState`] every request reads ([`Live::current`]: a handle read
//! from the calling thread's shard, so requests on different cores share no lock and no
//! reference count; `shards.rs`). [`Live::reload`] builds the parts for a new
//! configuration beside the serving ones ([`AppState::reloaded`], which keeps counters) and
//! swaps them in one step: a request sees the old configuration or the new, never a mix, and a
//! configuration that cannot be built is refused with the message `check-config` gives while
//! the old one keeps serving. What a reload cannot change (where the servers listen, the
//! store's kind, address, timeout and `max_keys`, the `[server]` table) needs a restart, and a
//! file that changes it is refused, naming it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use limiter_core::Clock;

use super::overrides::Overrides;
use crate::app::AppState;
use crate::config::{Config, RedisConnection, Store};
use crate::engine::Carried;
use crate::envoy::Domains;
use crate::metrics::{MasterReading, StoreReading};
use crate::shards::{Current, PerThread};

/// The state every request reads, replaced whole by [`reload`](Self::reload).
#[derive(Debug)]
pub struct Live<C> {
    current: PerThread<AppState<C>>,
    /// Whether the service is ready: what the server's probe last found, and whether it is
    /// shutting down.
    pub health: Health,
    /// unkey's overrides: run-time data, kept across reloads.
    pub overrides: Arc<Overrides>,
}

/// Readiness: the store's reachability as last probed, and whether the service is draining.
#[derive(Debug, Default)]
pub struct Health {
    /// The last probe: whether the store can decide, and what is wrong if anything (a
    /// reachable store may still have masters or slots failing); `None` before any probe.
    store: Mutex<Option<Probed>>,
    draining: AtomicBool,
}

/// What the last probe of the store found.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Probed {
    reachable: bool,
    problem: Option<String>,
    detail: Option<StoreStatus>,
}

/// A Redis store's health per master, as `/readyz` and `/debug/status` show it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct StoreStatus {
    /// `server`, `sentinel` or `cluster`.
    pub deployment: &'static str,
    /// Masters known.
    pub masters: usize,
    /// Masters that answered the probe.
    pub masters_answering: usize,
    /// Cluster slots whose calls fail now (`10923-16383`), which follow the failure policy.
    pub slots_failing: Vec<String>,
    /// Each master: where, its slots, whether it answered (and why not), its breaker.
    pub nodes: Vec<NodeStatus>,
    /// Sentinel: the master's name and how many sentinels answered of how many.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sentinel: Option<SentinelStatus>,
}

/// One master in a [`StoreStatus`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct NodeStatus {
    /// `host:port`.
    pub addr: String,
    /// Its cluster slots (`0-5460`), empty off a cluster.
    pub slots: String,
    /// Whether it answered the probe.
    pub answering: bool,
    /// Why not, if it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Whether its circuit breaker is open.
    pub breaker_open: bool,
}

/// Sentinel's part of a [`StoreStatus`].
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SentinelStatus {
    /// The master's name.
    pub master_name: String,
    /// Sentinels that answered.
    pub answering: usize,
    /// Sentinels configured.
    pub configured: usize,
}

impl StoreStatus {
    /// The status a probe of a Redis backend found.
    pub fn of(health: &crate::store::StoreHealth) -> Self {
        let slots = |ranges: &[std::ops::RangeInclusive<u16>]| crate::store::slot_ranges(ranges);
        Self {
            deployment: health.deployment.name(),
            masters: health.masters.len(),
            masters_answering: health.masters_answering(),
            slots_failing: health
                .slots_failing
                .iter()
                .map(|r| slots(std::slice::from_ref(r)))
                .collect(),
            nodes: health
                .masters
                .iter()
                .map(|m| NodeStatus {
                    addr: m.addr.clone(),
                    slots: slots(&m.slots),
                    answering: m.answer.is_ok(),
                    error: m.answer.as_ref().err().map(ToString::to_string),
                    breaker_open: m.breaker_open,
                })
                .collect(),
            sentinel: health.sentinel.as_ref().map(|s| SentinelStatus {
                master_name: s.master_name.clone(),
                answering: s.answering,
                configured: s.configured,
            }),
        }
    }
}

/// What readiness reports.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Readiness {
    /// Ready for traffic: the store can decide (its last probe found it so) and no shutdown
    /// has begun.
    pub ready: bool,
    /// Whether the store can decide (true in memory). A cluster with some masters down still
    /// can: `store_error` then names the slots that follow the failure policy.
    pub store_reachable: bool,
    /// What is wrong with the store, if anything.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store_error: Option<String>,
    /// A Redis store's masters, as last probed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreStatus>,
    /// A shutdown has begun: requests in flight finish, new ones should go elsewhere.
    pub draining: bool,
}

impl Readiness {
    /// What the store's health gauges report of it (`/metrics`).
    pub fn reading(&self) -> StoreReading<'_> {
        let store = self.store.as_ref();
        StoreReading {
            ready: self.ready,
            reachable: self.store_reachable,
            masters: store.map_or_else(Vec::new, |s| {
                s.nodes
                    .iter()
                    .map(|n| MasterReading {
                        addr: &n.addr,
                        slots: &n.slots,
                        answering: n.answering,
                        breaker_open: n.breaker_open,
                    })
                    .collect()
            }),
            sentinels: store
                .and_then(|s| s.sentinel.as_ref())
                .map(|s| (s.answering, s.configured)),
        }
    }
}

/// What readiness says before the first probe of a Redis store has answered.
pub const NOT_PROBED: &str = "the store has not answered a probe yet";

impl Health {
    /// Not ready until a probe finds the store can decide (a Redis store, at start).
    pub fn await_first_probe(&self) {
        self.record(false, Some(NOT_PROBED.to_owned()), None);
    }

    /// Records a probe of the store: whether it can decide, what is wrong if anything, and
    /// its masters.
    pub fn record(&self, reachable: bool, problem: Option<String>, detail: Option<StoreStatus>) {
        *self.store.lock().unwrap_or_else(PoisonError::into_inner) = Some(Probed {
            reachable,
            problem,
            detail,
        });
    }

    /// Records a probe that either found the store reachable or failed with `result`'s error.
    pub fn set_store(&self, result: Result<(), String>) {
        let reachable = result.is_ok();
        self.record(reachable, result.err(), None);
    }

    /// Marks the service as shutting down: not ready from now on.
    pub fn drain(&self) {
        // Relaxed: a flag readiness reports; it publishes nothing else.
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Whether a shutdown has begun.
    pub fn is_draining(&self) -> bool {
        // Relaxed: the flag alone (see `drain`).
        self.draining.load(Ordering::Relaxed)
    }

    /// Readiness now. A memory store is always reachable; a Redis store is not until its
    /// first probe answers ([`await_first_probe`](Self::await_first_probe)).
    pub fn readiness(&self) -> Readiness {
        let store = self
            .store
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let draining = self.is_draining();
        let (reachable, problem, detail) = match store {
            None => (true, None, None),
            Some(probed) => (probed.reachable, probed.problem, probed.detail),
        };
        Readiness {
            ready: reachable && !draining,
            store_reachable: reachable,
            store_error: problem,
            store: detail,
            draining,
        }
    }
}

/// Which of the Redis connection's settings changed, if any (none of them reloads: the
/// connection is made once).
fn redis_change(a: &RedisConnection, b: &RedisConnection) -> Option<&'static str> {
    if a.at != b.at {
        Some("where Redis is (`url`, `cluster` or `[store.sentinel]`) changed")
    } else if a.timeout != b.timeout {
        Some("`[store] timeout_ms` changed")
    } else if a.login != b.login {
        Some("the Redis login (`username` or the password's source) changed")
    } else if a.tls != b.tls {
        Some("`[store.tls]` changed")
    } else if a.breaker != b.breaker {
        Some("`[store] breaker_failures` or `breaker_open_ms` changed")
    } else if a.wait != b.wait {
        Some("`[store] wait_replicas` or `wait_timeout_ms` changed")
    } else {
        None
    }
}

/// What a reload did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reloaded {
    /// The files are unchanged from what is served: nothing was rebuilt.
    Unchanged,
    /// The new configuration serves; what happened to each policy's counters.
    Applied(Carried),
}

impl<C: Clock + Clone + Send + Sync + 'static> Live<C> {
    /// Serves `state`, with overrides held in memory only.
    pub fn new(state: AppState<C>) -> Self {
        Self::with_overrides(state, Overrides::in_memory())
    }

    /// Serves `state` with `overrides`.
    pub fn with_overrides(state: AppState<C>, overrides: Overrides) -> Self {
        Self {
            current: PerThread::new(state),
            health: Health::default(),
            overrides: Arc::new(overrides),
        }
    }

    /// The state serving now. A request holds it to the end, so a reload never changes the
    /// rules under a decision.
    pub fn current(&self) -> Current<AppState<C>> {
        self.current.read()
    }

    /// Serves `config` and `domains` from now on, keeping counters, or says why not (and the
    /// old configuration serves on).
    pub fn reload(&self, config: &Config, domains: Domains) -> Result<Reloaded, String> {
        let serving = self.current();
        if let Some(reason) = needs_restart(&serving.config, config) {
            return Err(format!(
                "{reason}: that takes a restart; the running configuration is kept"
            ));
        }
        if serving.config == *config && *serving.envoy.domains() == domains {
            return Ok(Reloaded::Unchanged);
        }
        let (state, carried) = serving
            .reloaded(config, domains)
            .map_err(|e| format!("{e}; the running configuration is kept"))?;
        self.current.replace(state);
        Ok(Reloaded::Applied(carried))
    }
}

/// What in `new` a running service cannot take without a restart, if anything.
pub fn needs_restart(old: &Config, new: &Config) -> Option<String> {
    if old.listen != new.listen {
        return Some(format!(
            "`listen` changed from {} to {}",
            old.listen, new.listen
        ));
    }
    match (&old.envoy, &new.envoy) {
        (Some(a), Some(b)) if a.listen != b.listen => {
            return Some(format!(
                "envoy's gRPC `listen` changed from {} to {}",
                a.listen, b.listen
            ));
        }
        (None, Some(_)) => return Some("an `[envoy]` table was added".into()),
        (Some(_), None) => return Some("the `[envoy]` table was removed".into()),
        _ => {}
    }
    let store = match (&old.store, &new.store) {
        (Store::Memory { max_keys: a }, Store::Memory { max_keys: b }) if a != b => {
            Some("`[store] max_keys` changed")
        }
        (Store::Redis { connection: a, .. }, Store::Redis { connection: b, .. }) => {
            redis_change(a, b)
        }
        (Store::Memory { .. }, Store::Redis { .. })
        | (Store::Redis { .. }, Store::Memory { .. }) => Some("`[store] kind` changed"),
        _ => None,
    };
    if let Some(store) = store {
        return Some(store.into());
    }
    (old.server != new.server).then(|| "the `[server]` table changed".into())
}

#[cfg(test)]
mod tests {
    use limiter_core::ManualClock;

    use super::*;
    use crate::engine::{Item, Target, decided_at_once};

    const TEN: &str = "[policies.api]\nlimits = [{ algorithm = \"fixed_window\", count = 10, period = \"1h\" }]\n[policies.other]\nlimits = [{ algorithm = \"token_bucket\", count = 5, period = \"1h\" }]\n";

    fn live(text: &str) -> Live<ManualClock> {
        let config = Config::parse(text).expect("valid");
        Live::new(AppState::build(&config, Domains::default(), ManualClock::new(), None).unwrap())
    }

    fn take(live: &Live<ManualClock>, policy: &str, cost: u64) -> (bool, u64) {
        let state = live.current();
        let id = state.engine.policy_id(policy).expect("configured");
        let item = Item {
            target: Target::Policy(id),
            identifier: "u".into(),
            cost,
            shadow: false,
            charge: crate::engine::Charge::Take,
        };
        let (_, answers) = decided_at_once(state.engine.decide(&[item])).unwrap();
        (
            answers[0].decision.is_allowed(),
            answers[0].decision.remaining(),
        )
    }

    fn reload(live: &Live<ManualClock>, text: &str) -> Result<Reloaded, String> {
        live.reload(&Config::parse(text).expect("valid"), Domains::default())
    }

    #[test]
    fn a_reload_keeps_unchanged_counters_and_rescales_changed_ones() {
        let live = live(TEN);
        for _ in 0..5 {
            take(&live, "api", 1);
        }
        take(&live, "other", 4);
        assert_eq!(reload(&live, TEN), Ok(Reloaded::Unchanged));

        // api doubles; other is untouched; a new policy appears.
        let doubled = TEN.replace("count = 10", "count = 20")
            + "[policies.new]\nlimits = [{ algorithm = \"fixed_window\", count = 3, period = \"1h\" }]\n";
        let Ok(Reloaded::Applied(carried)) = reload(&live, &doubled) else {
            panic!("applied")
        };
        assert_eq!(carried.kept, ["other"]);
        assert_eq!(carried.rescaled, ["api"]);
        assert_eq!(carried.fresh, ["new"]);
        // Half of 10 used is half of 20: 10 left, not 20; other still has 1 left.
        assert_eq!(take(&live, "api", 0), (true, 10));
        assert_eq!(take(&live, "other", 0), (true, 1));
        assert_eq!(take(&live, "new", 1), (true, 2));

        // Back to 10: still half used.
        let Ok(Reloaded::Applied(_)) = reload(&live, TEN) else {
            panic!("applied")
        };
        assert_eq!(take(&live, "api", 0), (true, 5));
        assert!(live.current().engine.policy_id("new").is_none(), "removed");
    }

    #[test]
    fn a_change_of_shape_starts_afresh_and_many_changes_run_out_of_plans() {
        let live = live(TEN);
        take(&live, "api", 6);
        // A second limit in the same keying: another shape.
        let two = TEN.replace(
            "{ algorithm = \"fixed_window\", count = 10, period = \"1h\" }",
            "{ algorithm = \"fixed_window\", count = 10, period = \"1h\" }, { algorithm = \"token_bucket\", count = 100, period = \"1m\" }",
        );
        let Ok(Reloaded::Applied(carried)) = reload(&live, &two) else {
            panic!("applied")
        };
        assert_eq!(carried.fresh, ["api"]);
        assert_eq!(take(&live, "api", 0), (true, 10));

        // Limits moving back and forth use a plan each; past the room, counters start afresh.
        let live = self::live(TEN);
        take(&live, "api", 10);
        let mut fresh_at = None;
        for n in 0..=crate::engine::RELOAD_PLANS {
            let count = if n % 2 == 0 { 20 } else { 10 };
            let text = TEN.replace("count = 10", &format!("count = {count}"));
            let Ok(Reloaded::Applied(carried)) = reload(&live, &text) else {
                panic!("applied")
            };
            if carried.fresh == ["api"] {
                fresh_at = Some(n);
                break;
            }
            assert_eq!(carried.rescaled, ["api"]);
            // Fully used stays fully used.
            assert_eq!(take(&live, "api", 0), (true, 0), "reload {n}");
        }
        assert_eq!(fresh_at, Some(crate::engine::RELOAD_PLANS));
    }

    #[test]
    fn a_reload_that_needs_a_restart_is_refused_and_the_old_configuration_serves() {
        let live = live(TEN);
        take(&live, "api", 3);
        for (text, says) in [
            (
                format!("listen = \"127.0.0.1:9999\"\n{TEN}"),
                "`listen` changed",
            ),
            (
                format!("[store]\nkind = \"memory\"\nmax_keys = 5\n{TEN}"),
                "max_keys",
            ),
            (
                format!("[server]\nbody_timeout_ms = 5\n{TEN}"),
                "`[server]`",
            ),
        ] {
            let err = reload(&live, &text).expect_err("refused");
            assert!(err.contains(says) && err.contains("restart"), "{err}");
        }
        assert_eq!(take(&live, "api", 0), (true, 7));
    }
}
