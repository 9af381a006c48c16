//! [`RedisBackend`]: the connection to Redis (one server, the master Sentinel names, or a
//! cluster's masters), the script, the time source and the per-call timeout, shared by every
//! limiter built on it; each master with its own circuit breaker, deny cache and coalescing
//! queue (`topology/`). How to reach Redis is set on the [`BackendBuilder`](crate::BackendBuilder) (`builder.rs`).
#![deny(clippy::arithmetic_side_effects)]

use core::fmt;
use core::future::Future;
use core::time::Duration;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use limiter_core::Clock;
use redis::Value;

use crate::breaker::Pass;
use crate::connect::link::{Failed, Link};
use crate::connect::url::NodeAddr;
use crate::deny_cache::{Denied, LimitId};
use crate::error::BackendError;
use crate::health::StoreHealth;
use crate::keyslot::key_slot;
use crate::script::Scripts;
use crate::script::call::Call;
use crate::script::run::{self, ScriptCall, Wait};
use crate::topology::{Node, Topology};

mod commands;

/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(25);

/// The default for [`BackendBuilder::max_in_flight`](crate::BackendBuilder::max_in_flight):
/// script calls one backend has in flight on one master before decisions queue to share the
/// next.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4;

/// Redirects one call follows on a cluster before it gives up.
const MAX_REDIRECTS: usize = 3;

/// Where decisions read time.
#[derive(Clone)]
pub(crate) enum TimeSource {
    /// Redis `TIME`, read inside the script, so nodes with skewed clocks agree.
    Server,
    /// A clock whose readings are nanoseconds since the Unix epoch (tests).
    Clock(Arc<dyn Clock>),
}

#[derive(Debug, Default)]
struct Counters {
    round_trips: AtomicU64,
    outages: AtomicU64,
    refused_by_breaker: AtomicU64,
    deny_cache_hits: AtomicU64,
    script_loads: AtomicU64,
    coalesced: AtomicU64,
}

/// What a backend has done so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct BackendStats {
    /// Script calls sent to Redis (one per decision, batch or stack).
    pub round_trips: u64,
    /// Calls that failed because Redis was down, slow or unreachable.
    pub outages: u64,
    /// Calls an open circuit breaker kept from Redis.
    pub refused_by_breaker: u64,
    /// Calls the deny cache answered without a round trip.
    pub deny_cache_hits: u64,
    /// Calls that found a server without the script (restarted, flushed, a new cluster
    /// node) and sent it in full; each is logged at `info`.
    pub script_loads: u64,
    /// Decisions that queued and shared a script call
    /// ([`BackendBuilder::max_in_flight`](crate::BackendBuilder::max_in_flight)).
    pub coalesced: u64,
    /// Script calls for single decisions in flight now.
    pub in_flight: usize,
    /// Whether some master's circuit breaker is open now.
    pub breaker_open: bool,
    /// Keys the deny caches hold now.
    pub deny_cache_keys: usize,
}

/// What the builder hands the backend.
pub(crate) struct Parts {
    pub(crate) topology: Topology,
    pub(crate) timeout: Duration,
    pub(crate) expiry_slack: Duration,
    pub(crate) time: TimeSource,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) wait: Option<Wait>,
    /// How the backend was addressed, passwords redacted (for `Debug`).
    pub(crate) shown: String,
    /// The refund epoch every node's deny cache shares.
    pub(crate) refunds: Arc<std::sync::Mutex<u64>>,
}

struct Inner {
    topology: Topology,
    scripts: Scripts,
    /// Whether the servers run the script as a function (until one says it cannot).
    functions: AtomicBool,
    timeout: Duration,
    expiry_slack_ms: u64,
    time: TimeSource,
    clock: Arc<dyn Clock>,
    wait: Option<Wait>,
    counters: Counters,
    shown: String,
    refunds: Arc<std::sync::Mutex<u64>>,
}

/// A connection to Redis shared by every limiter built on it. Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("at", &self.inner.shown)
            .field("timeout", &self.inner.timeout)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

/// When a request was sent; see [`RedisBackend::sent`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sent {
    /// Local clock reading (ns).
    pub(crate) at: u64,
    /// The deny caches' refund epoch.
    pub(crate) epoch: u64,
}

impl RedisBackend {
    pub(crate) fn from_parts(parts: Parts) -> Self {
        Self {
            inner: Arc::new(Inner {
                topology: parts.topology,
                scripts: Scripts::new(),
                functions: AtomicBool::new(true),
                timeout: parts.timeout,
                expiry_slack_ms: u64::try_from(parts.expiry_slack.as_millis()).unwrap_or(u64::MAX),
                time: parts.time,
                clock: parts.clock,
                wait: parts.wait,
                counters: Counters::default(),
                shown: parts.shown,
                refunds: parts.refunds,
            }),
        }
    }

    /// A backend on the Redis server at `url` (`redis://127.0.0.1:6379`), with the defaults.
    pub async fn connect(url: impl crate::ToRedisUrl) -> Result<Self, BackendError> {
        Self::builder(url).connect().await
    }

    /// Whether this backend talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.inner.topology.is_cluster()
    }

    /// Whether `other` is this very backend (a clone of it), on the same connection.
    pub(crate) fn same_as(&self, other: &RedisBackend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// What the backend has done so far.
    pub fn stats(&self) -> BackendStats {
        let c = &self.inner.counters;
        let nodes = self.inner.topology.nodes();
        BackendStats {
            // Relaxed: statistics, each read on its own.
            round_trips: c.round_trips.load(Ordering::Relaxed),
            outages: c.outages.load(Ordering::Relaxed),
            refused_by_breaker: c.refused_by_breaker.load(Ordering::Relaxed),
            deny_cache_hits: c.deny_cache_hits.load(Ordering::Relaxed),
            script_loads: c.script_loads.load(Ordering::Relaxed),
            coalesced: c.coalesced.load(Ordering::Relaxed),
            in_flight: nodes.iter().map(|n| n.coalescer.in_flight()).sum(),
            breaker_open: nodes.iter().any(|n| n.breaker.is_open()),
            deny_cache_keys: nodes.iter().map(|n| n.deny_cache.len()).sum(),
        }
    }

    /// Probes every master, past the circuit breakers, each within the call timeout: which
    /// answer, which cluster slots fail, and whether the store can decide at all. A cluster's
    /// slot map is learned again first. For readiness checks and status pages; decisions never
    /// wait on it.
    pub async fn health(&self) -> StoreHealth {
        let timeout = self.inner.timeout;
        self.inner
            .topology
            .health(timeout, &*self.inner.clock)
            .await
    }

    /// Asks Redis whether it can decide (see [`health`](Self::health)): how long the first
    /// master took to answer, or why the store is down.
    pub async fn ping(&self) -> Result<Duration, BackendError> {
        let health = self.health().await;
        match health.down {
            Some(e) => Err(e),
            None => Ok(health
                .masters
                .iter()
                .find_map(|m| m.answer.as_ref().ok().copied())
                .unwrap_or_default()),
        }
    }

    /// What a request records as it is sent: the local clock's reading (a denial's deadline
    /// counts from it) and the deny caches' refund epoch.
    pub(crate) fn sent(&self) -> Sent {
        // The lock is valid after any panic: the epoch is one number.
        let epoch = *self
            .inner
            .refunds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Sent {
            at: self.local_now(),
            epoch,
        }
    }

    /// The local clock's reading (breaker and deny cache time).
    pub(crate) fn local_now(&self) -> u64 {
        self.inner.clock.now()
    }

    /// The local clock, shared with the in-memory fallback.
    pub(crate) fn local_clock(&self) -> Arc<dyn Clock> {
        Arc::clone(&self.inner.clock)
    }

    /// The per-call timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The master a call on `keys` goes to.
    pub(crate) fn node_for(&self, keys: &[String]) -> Result<Arc<Node>, BackendError> {
        self.inner
            .topology
            .node_for(keys.first().map(String::as_str))
    }

    /// Whether single decisions on `node` may share a script call: always on one server; on
    /// a cluster, while the servers run functions (only a function takes several slots' keys).
    pub(crate) fn coalesces_on(&self, _node: &Node) -> bool {
        // Relaxed: a hint (see `functions`).
        !self.is_cluster() || self.inner.functions.load(Ordering::Relaxed)
    }

    pub(crate) fn count_coalesced(&self, decisions: usize) {
        let n = u64::try_from(decisions).unwrap_or(u64::MAX);
        self.inner
            .counters
            .coalesced
            // Relaxed: a statistic.
            .fetch_add(n, Ordering::Relaxed);
    }

    /// The standing denial covering `cost` under `limit` on `key` at `now`, if any (a hit
    /// is counted).
    pub(crate) fn denied(&self, key: &str, limit: LimitId, cost: u64, now: u64) -> Option<Denied> {
        let node = self.inner.topology.node_for(Some(key)).ok()?;
        let denied = node.deny_cache.lookup(key, limit, cost, now)?;
        self.inner
            .counters
            .deny_cache_hits
            // Relaxed: a statistic.
            .fetch_add(1, Ordering::Relaxed);
        Some(denied)
    }

    /// Remembers Redis's denial on `key`, for a request sent at refund epoch `epoch`.
    pub(crate) fn remember_denial(&self, key: &str, denied: Denied, epoch: u64) {
        if let Ok(node) = self.inner.topology.node_for(Some(key)) {
            node.deny_cache.record(key, denied, epoch);
        }
    }

    /// A refund gave units back on `keys` (one slot): their standing denials are forgotten.
    pub(crate) fn forget_denials(&self, keys: &[String]) {
        if let Ok(node) = self.node_for(keys) {
            node.deny_cache.forget(keys);
        }
    }

    /// Runs the script once on `keys` and `call`, within the timeout and past the breaker.
    pub(crate) async fn eval(&self, keys: &[String], call: Call) -> Result<Value, BackendError> {
        self.eval_as(keys, call, None).await
    }

    /// The call's one argument: the time it is decided at (the test clock's reading, or
    /// `None` for Redis `TIME`) and the encoded groups.
    fn argument(&self, call: Call) -> Vec<u8> {
        let now_us = match &self.inner.time {
            TimeSource::Server => None,
            TimeSource::Clock(clock) => Some(clock.now() / 1_000),
        };
        call.finish(now_us, self.inner.expiry_slack_ms)
    }

    /// Runs the script once on `keys` and `call` (a lease call naming its `holder`), on the
    /// master serving them, within the timeout and past its breaker, following a cluster's
    /// redirects.
    pub(crate) async fn eval_as(
        &self,
        keys: &[String],
        call: Call,
        holder: Option<&str>,
    ) -> Result<Value, BackendError> {
        let argument = self.argument(call);
        let mut args: [&[u8]; 2] = [&argument, &[]];
        let args = match holder {
            Some(holder) => {
                args[1] = holder.as_bytes();
                &args[..]
            }
            None => &args[..1],
        };
        let node = self.node_for(keys)?;
        let slot = keys
            .first()
            .filter(|_| self.is_cluster())
            .map(|key| key_slot(key));
        let inner = &*self.inner;
        let script = ScriptCall {
            scripts: &inner.scripts,
            functions: &inner.functions,
            keys,
            args,
            node_wide: false,
            wait: inner.wait,
        };
        let script = &script;
        self.call_node(node, slot, |link, asking| async move {
            run::run(&link, script, asking).await
        })
        .await
    }

    /// Runs coalesced decisions on `node`: on a cluster as one node-wide call (its keys in
    /// several slots), which follows no redirect (a group whose key left the node is refused
    /// alone); elsewhere as any call.
    pub(crate) async fn eval_coalesced(
        &self,
        node: &Arc<Node>,
        keys: &[String],
        call: Call,
    ) -> Result<Value, BackendError> {
        if !self.is_cluster() {
            return self.eval(keys, call).await;
        }
        let argument = self.argument(call);
        let args: [&[u8]; 1] = [&argument];
        let inner = &*self.inner;
        let script = ScriptCall {
            scripts: &inner.scripts,
            functions: &inner.functions,
            keys,
            args: &args,
            node_wide: true,
            wait: inner.wait,
        };
        let script = &script;
        self.call_node(Arc::clone(node), None, |link, asking| async move {
            run::run(&link, script, asking).await
        })
        .await
    }

    /// Runs `op` on `node`'s link within the timeout and past its breaker; on a cluster
    /// (`slot` given) follows `MOVED` and `ASK` to the node named; counts the outcome.
    async fn call_node<'a, F, Fut>(
        &'a self,
        mut node: Arc<Node>,
        slot: Option<u16>,
        op: F,
    ) -> Result<Value, BackendError>
    where
        F: Fn(Arc<Link>, bool) -> Fut,
        Fut: Future<Output = Result<(Value, bool), Failed>> + 'a,
    {
        let inner = &*self.inner;
        let mut asking = false;
        for _ in 0..=MAX_REDIRECTS {
            let pass = node.breaker.pass(self.local_now());
            if let Pass::Refuse(retry_in) = pass {
                // Relaxed: a statistic.
                inner
                    .counters
                    .refused_by_breaker
                    .fetch_add(1, Ordering::Relaxed);
                // Its slots may have a new master by now (a promoted replica, a failover).
                inner.topology.outage();
                return Err(BackendError::CircuitOpen { retry_in });
            }
            // Relaxed: a statistic.
            inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
            let link = match node.link() {
                Ok(link) => link,
                Err(e) => {
                    let result = Err(e);
                    self.settle(&node, None, pass, &result);
                    return result;
                }
            };
            let answer = tokio::time::timeout(inner.timeout, op(Arc::clone(&link), asking)).await;
            let result = match answer {
                Err(_) => Err(BackendError::Timeout {
                    after: inner.timeout,
                }),
                Ok(Ok((value, reloaded))) => {
                    if reloaded {
                        self.count_script_load(link.addr());
                        self.load_on_every_master(&link).await;
                    }
                    Ok(value)
                }
                Ok(Err(Failed::Call(e))) => {
                    if let Some((next, moved)) = self.redirect(slot, &e) {
                        // The node answered, if not with the key.
                        node.breaker.success();
                        node = next;
                        asking = !moved;
                        continue;
                    }
                    if let (Some("limiter:"), Some(detail)) = (e.code(), e.detail()) {
                        // The script's own refusal, as written (Redis's error shows its first
                        // word as a quoted code), as a refusal inside a reply reads.
                        Err(BackendError::Script(format!("limiter: {detail}")))
                    } else if e.to_string().contains("limiter:") {
                        Err(BackendError::Script(e.to_string()))
                    } else {
                        Err(link.explain(Failed::Call(e)))
                    }
                }
                Ok(Err(failed)) => Err(link.explain(failed)),
            };
            self.settle(&node, Some(&link), pass, &result);
            return result;
        }
        Err(BackendError::Redis(format!(
            "the cluster redirected a call {MAX_REDIRECTS} times; its slots are moving"
        )))
    }

    /// Where a cluster's `MOVED` or `ASK` sends a call on `slot`, and whether it moved.
    fn redirect(&self, slot: Option<u16>, e: &redis::RedisError) -> Option<(Arc<Node>, bool)> {
        let slot = slot?;
        let (to, _) = e.redirect_node()?;
        let to = NodeAddr::parse_redirect(to)?;
        let moved = e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved);
        let next = self.inner.topology.redirected(slot, &to, moved)?;
        Some((next, moved))
    }

    /// On a cluster, after one master was found without the library (flushed, restarted, new):
    /// loads it on every other master too, within the timeout, so their next calls do not each
    /// find it missing. Best effort: a master that misses it still loads it on its own.
    async fn load_on_every_master(&self, loaded: &Arc<Link>) {
        // Relaxed: a hint (see `functions`).
        if !self.is_cluster() || !self.inner.functions.load(Ordering::Relaxed) {
            return;
        }
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD")
            .arg("REPLACE")
            .arg(&self.inner.scripts.library);
        let load = &load;
        let others = self
            .inner
            .topology
            .nodes()
            .into_iter()
            .filter_map(|node| node.link().ok())
            .filter(|link| link.addr() != loaded.addr())
            .map(|link| async move { link.query(load).await });
        let _ =
            tokio::time::timeout(self.inner.timeout, futures_util::future::join_all(others)).await;
    }

    fn count_script_load(&self, addr: &NodeAddr) {
        // Relaxed: a statistic.
        self.inner
            .counters
            .script_loads
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            target: "limiter_redis::backend",
            node = %addr,
            "Redis did not have the decision script (restarted, flushed or a new node); loaded it again"
        );
    }

    /// Counts a call's outcome on `node`: an outage moves its breaker, forgets its standing
    /// denials (Redis may come back without its state) and looks for a new master or slot
    /// map; anything else closes its breaker.
    fn settle(
        &self,
        node: &Node,
        link: Option<&Arc<Link>>,
        pass: Pass,
        result: &Result<Value, BackendError>,
    ) {
        match result {
            Err(e) if e.is_outage() => {
                tracing::debug!(target: "limiter_redis::backend", error = %e, "Redis outage");
                // Relaxed: a statistic, read by nobody deciding.
                self.inner.counters.outages.fetch_add(1, Ordering::Relaxed);
                node.breaker.failure(self.local_now(), pass);
                if matches!(e, BackendError::Timeout { .. }) && node.breaker.is_open() {
                    // The connection itself may be what hangs: the next call opens another.
                    if let Some(link) = link {
                        link.reset();
                    }
                }
                node.deny_cache.clear();
                self.inner.topology.outage();
            }
            _ => node.breaker.success(),
        }
    }
}
