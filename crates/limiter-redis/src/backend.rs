//! [`RedisBackend`]: the connection to Redis (one server or a cluster), the script, the time
//! source, the per-call timeout, the circuit breaker and the deny cache, shared by every
//! limiter built on it.
#![deny(clippy::arithmetic_side_effects)]

use core::fmt;
use core::time::Duration;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use limiter_core::{Clock, DefaultClock};
use redis::Value;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;
use tokio::sync::oneshot;

use crate::breaker::{Breaker, BreakerConfig, Pass};
use crate::deny_cache::DenyCache;
use crate::error::BackendError;
use crate::script::Scripts;
use crate::script::call::Call;
use crate::script::reply::GroupAnswer;

/// The default per-call timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_millis(25);

/// The default for [`BackendBuilder::max_in_flight`]: script calls one backend has in flight
/// on one server before decisions queue to share the next.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 4;

/// Where decisions read time.
#[derive(Clone)]
enum TimeSource {
    /// Redis `TIME`, read inside the script, so nodes with skewed clocks agree.
    Server,
    /// A clock whose readings are nanoseconds since the Unix epoch (tests).
    Clock(Arc<dyn Clock>),
}

enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// `cmd_name` (`FCALL`, `EVALSHA` or `EVAL`) of `body` (the function, the hash or the
/// script), then the keys and arguments.
fn script_cmd(cmd_name: &str, body: &str, keys: &[String], args: &[&[u8]]) -> redis::Cmd {
    let mut cmd = redis::cmd(cmd_name);
    cmd.arg(body).arg(keys.len()).arg(keys);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// Whether `e` says the server has no such function (never loaded, flushed, a new node).
fn function_missing(e: &redis::RedisError) -> bool {
    e.to_string().contains("Function not found")
}

/// Whether `e` says the server cannot run or load functions (before Redis 7, or an ACL that
/// refuses them): the script then runs by `EVALSHA`.
fn functions_unavailable(e: &redis::RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    [
        "unknown command",
        "unknown subcommand",
        "noperm",
        "no permissions",
    ]
    .iter()
    .any(|says| text.contains(says))
}

impl Connection {
    async fn query(&self, cmd: &redis::Cmd) -> redis::RedisResult<Value> {
        match self {
            Connection::Single(c) => cmd.query_async(&mut c.clone()).await,
            Connection::Cluster(c) => cmd.query_async(&mut c.clone()).await,
        }
    }

    /// Runs the script: as a function (`FCALL`) while the server has functions, loading the
    /// library (on every master of a cluster) when the server lacks it; by its hash
    /// (`EVALSHA`) otherwise, sent in full once when the server lacks it. The flag says
    /// whether the script had to be loaded.
    async fn run(
        &self,
        scripts: &Scripts,
        functions: &AtomicBool,
        keys: &[String],
        args: &[&[u8]],
    ) -> redis::RedisResult<(Value, bool)> {
        // Relaxed: whether functions work is a hint; each call's outcome corrects it.
        if functions.load(Ordering::Relaxed) {
            let fcall = script_cmd("FCALL", &scripts.function, keys, args);
            match self.query(&fcall).await {
                Err(e) if function_missing(&e) => {
                    let mut load = redis::cmd("FUNCTION");
                    load.arg("LOAD").arg("REPLACE").arg(&scripts.library);
                    match self.query(&load).await {
                        Ok(_) => return self.query(&fcall).await.map(|value| (value, true)),
                        Err(e) if functions_unavailable(&e) => {
                            // Relaxed: a hint, as above.
                            functions.store(false, Ordering::Relaxed);
                        }
                        Err(e) => return Err(e),
                    }
                }
                // Relaxed: a hint shared by calls; a call that reads it late tries FCALL once more.
                Err(e) if functions_unavailable(&e) => functions.store(false, Ordering::Relaxed),
                answer => return answer.map(|value| (value, false)),
            }
        }
        let by_hash = script_cmd("EVALSHA", scripts.eval.get_hash(), keys, args);
        match self.query(&by_hash).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                let in_full = script_cmd("EVAL", crate::script::SCRIPT, keys, args);
                self.query(&in_full).await.map(|value| (value, true))
            }
            answer => answer.map(|value| (value, false)),
        }
    }
}

/// What a coalesced decision gets back: the script's time (µs) and its group's answer.
pub(crate) type Answered = Result<(u64, GroupAnswer), BackendError>;

/// A decision waiting for a script call.
pub(crate) struct Queued {
    pub(crate) keys: Vec<String>,
    /// Its group, written on its own: its `KEYS` indexes count from 1 within its own keys.
    pub(crate) group: Call,
    pub(crate) limits: usize,
    pub(crate) reply: oneshot::Sender<Answered>,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) in_flight: usize,
    pub(crate) queue: Vec<Queued>,
}

/// The queue and the count of script calls in flight, per backend (the protocol is in
/// `coalesce.rs`).
pub(crate) struct Coalescer {
    state: Mutex<State>,
    pub(crate) max_in_flight: usize,
}

impl Coalescer {
    /// At most `max_in_flight` script calls at once (0 turns coalescing off).
    pub(crate) fn new(max_in_flight: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            max_in_flight,
        }
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is valid after any panic: each change is one assignment or push.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many script calls are in flight now (for stats).
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().in_flight
    }
}

/// How to reach Redis and how calls behave; see [`RedisBackend::builder`].
pub struct BackendBuilder {
    nodes: Vec<String>,
    cluster: bool,
    timeout: Duration,
    breaker: BreakerConfig,
    deny_cache: usize,
    expiry_slack: Duration,
    time: TimeSource,
    clock: Arc<dyn Clock>,
    max_in_flight: usize,
}

impl BackendBuilder {
    fn new(nodes: Vec<String>, cluster: bool) -> Self {
        Self {
            nodes,
            cluster,
            timeout: DEFAULT_TIMEOUT,
            breaker: BreakerConfig::default(),
            deny_cache: 100_000,
            expiry_slack: Duration::ZERO,
            time: TimeSource::Server,
            clock: Arc::new(DefaultClock::new()),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }

    /// Coalescing on one server: at most `calls` script calls in flight at once for single
    /// decisions (default [`DEFAULT_MAX_IN_FLIGHT`]). A lone decision is sent at once; one
    /// that finds a call in flight queues, and what queued leaves in one script call as soon
    /// as a call ends (up to 32 decisions, each decided in order as if sent alone), so many
    /// decisions in flight cost a few full script calls, not one each. A further call leaves
    /// at once only when 32 have queued, up to `calls` at a time. `0` sends every decision in
    /// a call of its own. Batches and refunds are their own calls either way.
    pub fn max_in_flight(mut self, calls: usize) -> Self {
        self.max_in_flight = calls;
        self
    }

    /// The most a call waits for Redis before the failure policy answers (default 25 ms).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// When the circuit breaker opens and for how long (default: 5 outages in a row, 1 s).
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }

    /// How many denied keys the deny cache holds (default 100,000; 0 turns it off).
    pub fn deny_cache(mut self, keys: usize) -> Self {
        self.deny_cache = keys;
        self
    }

    /// Extra time keys are kept beyond the instant their state is full again (default none).
    /// A state that is full is the same as no key, so any slack is safe; it only costs memory.
    pub fn expiry_slack(mut self, slack: Duration) -> Self {
        self.expiry_slack = slack;
        self
    }

    /// The local clock the circuit breaker, the deny cache and leases measure time on
    /// (default [`DefaultClock`], the workspace's fast clock). Decisions on Redis read Redis's
    /// time, not this one; a [`LeasedStack`](crate::LeasedStack) spends its leases on it.
    pub fn clock(mut self, clock: impl Clock + 'static) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Decides at `clock`'s readings, taken as nanoseconds since the Unix epoch, instead of Redis
    /// `TIME`. For tests, with a [`ManualClock`](limiter_core::ManualClock); a fleet should keep
    /// the default, so that nodes with skewed clocks agree.
    pub fn time_from(mut self, clock: impl Clock + 'static) -> Self {
        self.time = TimeSource::Clock(Arc::new(clock));
        self
    }

    /// Connects. A single server is connected lazily, so a backend can be built while Redis is
    /// down (calls then go to the failure policy until it is up); a cluster must be reachable to
    /// learn its slots.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        let connect_error = |e: redis::RedisError| BackendError::Connect(e.to_string());
        let connection = if self.cluster {
            let client = redis::cluster::ClusterClient::builder(self.nodes.clone())
                .connection_timeout(self.timeout)
                .response_timeout(self.timeout)
                .build()
                .map_err(connect_error)?;
            let connection = tokio::time::timeout(
                self.timeout.saturating_mul(40),
                client.get_async_connection(),
            )
            .await
            .map_err(|_| BackendError::Connect("the cluster did not answer".to_owned()))?
            .map_err(connect_error)?;
            Connection::Cluster(connection)
        } else {
            let url = self.nodes.first().cloned().unwrap_or_default();
            let client = redis::Client::open(url).map_err(connect_error)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(self.timeout))
                .set_response_timeout(Some(self.timeout))
                .set_min_delay(Duration::from_millis(10))
                .set_max_delay(Duration::from_millis(500));
            Connection::Single(
                ConnectionManager::new_lazy_with_config(client, config).map_err(connect_error)?,
            )
        };
        Ok(RedisBackend {
            inner: Arc::new(Inner {
                connection,
                scripts: Scripts::new(),
                functions: AtomicBool::new(true),
                timeout: self.timeout,
                expiry_slack_ms: u64::try_from(self.expiry_slack.as_millis()).unwrap_or(u64::MAX),
                time: self.time,
                clock: self.clock,
                breaker: Breaker::new(self.breaker),
                deny_cache: DenyCache::new(self.deny_cache),
                counters: Counters::default(),
                coalescer: Coalescer::new(self.max_in_flight),
            }),
        })
    }
}

impl fmt::Debug for BackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendBuilder")
            .field("nodes", &self.nodes)
            .field("cluster", &self.cluster)
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .field("deny_cache", &self.deny_cache)
            .finish_non_exhaustive()
    }
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
    /// Calls the open circuit breaker kept from Redis.
    pub refused_by_breaker: u64,
    /// Calls the deny cache answered without a round trip.
    pub deny_cache_hits: u64,
    /// Calls that found the server without the script (restarted, flushed, a new cluster
    /// node) and sent it in full; each is logged at `info`.
    pub script_loads: u64,
    /// Decisions that queued and shared a script call ([`BackendBuilder::max_in_flight`]).
    pub coalesced: u64,
    /// Script calls for single decisions in flight now.
    pub in_flight: usize,
    /// Whether the circuit breaker is open now.
    pub breaker_open: bool,
    /// Keys the deny cache holds now.
    pub deny_cache_keys: usize,
}

struct Inner {
    connection: Connection,
    scripts: Scripts,
    /// Whether the server runs the script as a function (until it says it cannot).
    functions: AtomicBool,
    timeout: Duration,
    expiry_slack_ms: u64,
    time: TimeSource,
    clock: Arc<dyn Clock>,
    breaker: Breaker,
    deny_cache: DenyCache,
    counters: Counters,
    coalescer: Coalescer,
}

/// A connection to Redis shared by every limiter built on it. Cheap to clone.
#[derive(Clone)]
pub struct RedisBackend {
    inner: Arc<Inner>,
}

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("cluster", &self.is_cluster())
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
    /// The deny cache's refund epoch.
    pub(crate) epoch: u64,
}

impl RedisBackend {
    /// A backend on the Redis server at `url` (`redis://127.0.0.1:6379`), with the defaults.
    pub async fn connect(url: impl Into<String>) -> Result<Self, BackendError> {
        Self::builder(url).connect().await
    }

    /// A backend on one Redis server, to configure before [`connect`](BackendBuilder::connect).
    pub fn builder(url: impl Into<String>) -> BackendBuilder {
        BackendBuilder::new(vec![url.into()], false)
    }

    /// A backend on a Redis Cluster, reached through any of `nodes`.
    pub fn cluster_builder(nodes: impl IntoIterator<Item = impl Into<String>>) -> BackendBuilder {
        BackendBuilder::new(nodes.into_iter().map(Into::into).collect(), true)
    }

    /// Whether this backend talks to a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.inner.connection, Connection::Cluster(_))
    }

    /// Whether `other` is this very backend (a clone of it), on the same connection.
    pub(crate) fn same_as(&self, other: &RedisBackend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// What the backend has done so far.
    pub fn stats(&self) -> BackendStats {
        let c = &self.inner.counters;
        BackendStats {
            round_trips: c.round_trips.load(Ordering::Relaxed),
            outages: c.outages.load(Ordering::Relaxed),
            refused_by_breaker: c.refused_by_breaker.load(Ordering::Relaxed),
            // Relaxed: statistics, each read on its own.
            deny_cache_hits: c.deny_cache_hits.load(Ordering::Relaxed),
            script_loads: c.script_loads.load(Ordering::Relaxed),
            coalesced: c.coalesced.load(Ordering::Relaxed),
            in_flight: self.inner.coalescer.in_flight(),
            breaker_open: self.inner.breaker.is_open(),
            deny_cache_keys: self.inner.deny_cache.len(),
        }
    }

    /// Asks Redis whether it answers (`PING`, within the call timeout, past the circuit
    /// breaker, which it neither consults nor moves): how long the answer took, or why none
    /// came. For readiness checks; decisions never wait on it.
    pub async fn ping(&self) -> Result<Duration, BackendError> {
        let started = self.local_now();
        let timeout = self.inner.timeout;
        match tokio::time::timeout(timeout, self.inner.connection.query(&redis::cmd("PING"))).await
        {
            Err(_) => Err(BackendError::Timeout { after: timeout }),
            Ok(Err(e)) => Err(BackendError::Redis(e.to_string())),
            Ok(Ok(_)) => Ok(Duration::from_nanos(
                self.local_now().saturating_sub(started),
            )),
        }
    }

    /// Runs `cmd` within the backend's timeout (the records beside the limits use it).
    pub(crate) async fn query(&self, cmd: &redis::Cmd) -> Result<Value, BackendError> {
        let timeout = self.inner.timeout;
        match tokio::time::timeout(timeout, self.inner.connection.query(cmd)).await {
            Err(_) => Err(BackendError::Timeout { after: timeout }),
            Ok(result) => result.map_err(|e| BackendError::Redis(e.to_string())),
        }
    }

    /// What a request records as it is sent: the local clock's reading (a denial's deadline
    /// counts from it) and the deny cache's refund epoch.
    pub(crate) fn sent(&self) -> Sent {
        Sent {
            at: self.local_now(),
            epoch: self.inner.deny_cache.epoch(),
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

    pub(crate) fn coalescer(&self) -> &Coalescer {
        &self.inner.coalescer
    }

    /// The per-call timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    pub(crate) fn count_coalesced(&self, decisions: usize) {
        let n = u64::try_from(decisions).unwrap_or(u64::MAX);
        self.inner
            .counters
            .coalesced
            // Relaxed: a statistic.
            .fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn deny_cache(&self) -> &DenyCache {
        &self.inner.deny_cache
    }

    pub(crate) fn count_deny_cache_hit(&self) {
        self.inner
            .counters
            .deny_cache_hits
            // Relaxed: a statistic.
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Runs the script once on `keys` and `call`, within the timeout and past the breaker.
    pub(crate) async fn eval(&self, keys: &[String], call: Call) -> Result<Value, BackendError> {
        self.eval_as(keys, call, None).await
    }

    /// Runs the script once on `keys` and `call` (a lease call naming its `holder`), within
    /// the timeout and past the breaker. The call's time is read now: the server's `TIME`,
    /// or the test clock's reading.
    pub(crate) async fn eval_as(
        &self,
        keys: &[String],
        call: Call,
        holder: Option<&str>,
    ) -> Result<Value, BackendError> {
        let inner = &*self.inner;
        let now_us = match &inner.time {
            TimeSource::Server => None,
            TimeSource::Clock(clock) => Some(clock.now() / 1_000),
        };
        let argument = call.finish(now_us, inner.expiry_slack_ms);
        let mut args: [&[u8]; 2] = [&argument, &[]];
        let args = match holder {
            Some(holder) => {
                args[1] = holder.as_bytes();
                &args[..]
            }
            None => &args[..1],
        };
        let now = self.local_now();
        let pass = inner.breaker.pass(now);
        if let Pass::Refuse(retry_in) = pass {
            inner
                .counters
                .refused_by_breaker
                // Relaxed: a statistic.
                .fetch_add(1, Ordering::Relaxed);
            return Err(BackendError::CircuitOpen { retry_in });
        }
        // Relaxed: a statistic.
        inner.counters.round_trips.fetch_add(1, Ordering::Relaxed);
        let answer = tokio::time::timeout(
            inner.timeout,
            inner
                .connection
                .run(&inner.scripts, &inner.functions, keys, args),
        )
        .await;
        let result = match answer {
            Err(_) => Err(BackendError::Timeout {
                after: inner.timeout,
            }),
            Ok(Ok((value, reloaded))) => {
                if reloaded {
                    // Relaxed: a statistic.
                    inner.counters.script_loads.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        target: "limiter_redis::backend",
                        "Redis did not have the decision script (restarted, flushed or a new node); loaded it again"
                    );
                }
                Ok(value)
            }
            Ok(Err(e)) if e.is_timeout() => Err(BackendError::Timeout {
                after: inner.timeout,
            }),
            Ok(Err(e)) if e.to_string().contains("limiter:") => {
                Err(BackendError::Script(e.to_string()))
            }
            Ok(Err(e)) => Err(BackendError::Redis(e.to_string())),
        };
        match &result {
            Err(e) if e.is_outage() => {
                tracing::debug!(target: "limiter_redis::backend", error = %e, "Redis outage");
                // Relaxed: a statistic, read by nobody deciding.
                inner.counters.outages.fetch_add(1, Ordering::Relaxed);
                inner.breaker.failure(self.local_now(), pass);
                // Redis may come back without its state: standing denials may no longer stand.
                inner.deny_cache.clear();
            }
            _ => inner.breaker.success(),
        }
        result
    }
}
