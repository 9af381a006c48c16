//! [`BackendBuilder`]: how a [`RedisBackend`] reaches Redis (one server, a cluster's seed
//! nodes, or Sentinel), logs in (a user and a password, given, in the URL or read from a
//! file), speaks TLS (feature `tls`), and behaves (timeout, breaker, deny cache, coalescing,
//! replicas to wait for), then connects.

use core::fmt;
use core::time::Duration;
use std::path::PathBuf;
use std::sync::Arc;

use limiter_core::{Clock, DefaultClock};

use crate::backend::{DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT, Parts, RedisBackend, TimeSource};
use crate::breaker::BreakerConfig;
use crate::connect::link::{Link, LinkSettings};
use crate::connect::secret::{Password, Secret};
use crate::connect::url::{RedisUrl, ToRedisUrl, UrlError};
use crate::error::BackendError;
use crate::script::run::Wait;
use crate::topology::cluster::Cluster;
use crate::topology::sentinel::Sentinel;
use crate::topology::{NodeMaker, Topology};

/// The least time a connection may take to open (TCP, TLS, login), whatever the call timeout:
/// callers wait for it within their own timeout, and the next ones find it open.
pub const MIN_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A URL as given: parsed, or why it is not one (reported by `connect`).
type Given = Result<RedisUrl, UrlError>;

/// Where Redis is.
#[derive(Clone)]
enum Target {
    Server(Given),
    Cluster(Vec<Given>),
    Sentinel {
        master: String,
        sentinels: Vec<Given>,
    },
}

/// How to reach Redis and how calls behave; see [`RedisBackend::builder`],
/// [`RedisBackend::cluster_builder`] and [`RedisBackend::sentinel_builder`].
pub struct BackendBuilder {
    target: Target,
    username: Option<String>,
    password: Option<Password>,
    sentinel_username: Option<String>,
    sentinel_password: Option<Password>,
    #[cfg(feature = "tls")]
    tls: Option<crate::TlsOptions>,
    #[cfg(feature = "tls")]
    sentinel_tls: Option<crate::TlsOptions>,
    timeout: Duration,
    breaker: BreakerConfig,
    deny_cache: usize,
    expiry_slack: Duration,
    time: TimeSource,
    clock: Arc<dyn Clock>,
    max_in_flight: usize,
    wait: Option<Wait>,
}

impl RedisBackend {
    /// A backend on one Redis server at `url` (`redis://[user[:password]@]host[:port][/db]`,
    /// `rediss://` for TLS), to configure before [`connect`](BackendBuilder::connect).
    pub fn builder(url: impl ToRedisUrl) -> BackendBuilder {
        BackendBuilder::new(Target::Server(url.to_redis_url()))
    }

    /// A backend on a Redis Cluster, reached through any of `nodes` (its seed nodes' URLs; the
    /// first URL's user and password log in to every node, unless the builder gives them).
    pub fn cluster_builder(nodes: impl IntoIterator<Item = impl ToRedisUrl>) -> BackendBuilder {
        BackendBuilder::new(Target::Cluster(
            nodes.into_iter().map(ToRedisUrl::to_redis_url).collect(),
        ))
    }

    /// A backend on the master that Redis Sentinel names `master_name`, asking the sentinels
    /// at `sentinels` (their URLs, each with the sentinel's own login if it needs one) and
    /// following every failover. The master's login and TLS are the builder's
    /// ([`username`](BackendBuilder::username), [`password`](BackendBuilder::password),
    /// `tls`); the sentinels' are their URLs' or the `sentinel_*` settings.
    pub fn sentinel_builder(
        master_name: impl Into<String>,
        sentinels: impl IntoIterator<Item = impl ToRedisUrl>,
    ) -> BackendBuilder {
        BackendBuilder::new(Target::Sentinel {
            master: master_name.into(),
            sentinels: sentinels
                .into_iter()
                .map(ToRedisUrl::to_redis_url)
                .collect(),
        })
    }
}

impl BackendBuilder {
    fn new(target: Target) -> Self {
        Self {
            target,
            username: None,
            password: None,
            sentinel_username: None,
            sentinel_password: None,
            #[cfg(feature = "tls")]
            tls: None,
            #[cfg(feature = "tls")]
            sentinel_tls: None,
            timeout: DEFAULT_TIMEOUT,
            breaker: BreakerConfig::default(),
            deny_cache: 100_000,
            expiry_slack: Duration::ZERO,
            time: TimeSource::Server,
            clock: Arc::new(DefaultClock::new()),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            wait: None,
        }
    }

    /// Logs in as this ACL user (instead of the URL's, or Redis's `default`).
    pub fn username(mut self, name: impl Into<String>) -> Self {
        self.username = Some(name.into());
        self
    }

    /// Logs in with this password (instead of the URL's).
    pub fn password(mut self, password: Secret) -> Self {
        self.password = Some(Password::Given(password));
        self
    }

    /// Logs in with the password held in the file at `path` (a mounted Kubernetes secret),
    /// read at every new connection, so a rotated secret applies at the next one.
    pub fn password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.password = Some(Password::File(path.into()));
        self
    }

    /// Logs in to the sentinels as this user (unless a sentinel's URL names one).
    pub fn sentinel_username(mut self, name: impl Into<String>) -> Self {
        self.sentinel_username = Some(name.into());
        self
    }

    /// Logs in to the sentinels with this password (unless a sentinel's URL gives one).
    pub fn sentinel_password(mut self, password: Secret) -> Self {
        self.sentinel_password = Some(Password::Given(password));
        self
    }

    /// Logs in to the sentinels with the password in the file at `path`, read at every new
    /// connection.
    pub fn sentinel_password_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.sentinel_password = Some(Password::File(path.into()));
        self
    }

    /// How to speak TLS to Redis (feature `tls`): for `rediss://` URLs (which use the
    /// system's roots without it), and for the masters Sentinel names (TLS only when this is
    /// given). Given with a `redis://` URL, [`connect`](Self::connect) refuses it.
    #[cfg(feature = "tls")]
    pub fn tls(mut self, tls: crate::TlsOptions) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How to speak TLS to `rediss://` sentinels, if not as [`tls`](Self::tls) says.
    #[cfg(feature = "tls")]
    pub fn sentinel_tls(mut self, tls: crate::TlsOptions) -> Self {
        self.sentinel_tls = Some(tls);
        self
    }

    /// Coalescing on each master: at most `calls` script calls in flight at once for single
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

    /// When a master's circuit breaker opens and for how long (default: 5 outages in a row,
    /// 1 s). Each master has its own.
    pub fn breaker(mut self, breaker: BreakerConfig) -> Self {
        self.breaker = breaker;
        self
    }

    /// How many denied keys each master's deny cache holds (default 100,000; 0 turns it
    /// off).
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

    /// The local clock the circuit breakers, the deny caches and leases measure time on
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

    /// Answers a call that wrote only once `replicas` replicas acknowledged its writes (Redis
    /// `WAIT`, in the same round trip), waiting at most `within` (shorter than the call
    /// timeout). A call fewer replicas acknowledged goes to the failure policy
    /// ([`BackendError::NotReplicated`]; its units stay taken). With asynchronous
    /// replication (the default), a failover loses the writes a master acknowledged but had
    /// not yet sent: units taken in the last moments before the failure count again. With
    /// this, an admission the promoted replica acknowledged is never lost. Every write waits:
    /// stacks' decisions and refunds, permits' acquires, releases and renewals, quotas' takes
    /// and refunds, and the records beside the limits. It costs a replication round trip per
    /// call, and calls on one connection wait for each other's.
    pub fn wait_for_replicas(mut self, replicas: u32, within: Duration) -> Self {
        self.wait = Some(Wait {
            replicas,
            timeout: within,
        });
        self
    }

    /// Connects. Nothing is refused for being unreachable: a server (or the master, or a
    /// cluster's nodes) down at connect is reached when it comes up, calls meanwhile going to
    /// the failure policy, and [`RedisBackend::health`] says why. What is refused here is a
    /// setting that cannot work: a URL that is not a Redis URL, TLS settings that cannot be
    /// used, `rediss://` without the `tls` feature. A cluster learns its slots and Sentinel
    /// names its master before this returns (within the timeout), when they answer.
    pub async fn connect(self) -> Result<RedisBackend, BackendError> {
        if let Some(wait) = self.wait
            && (wait.replicas == 0 || wait.timeout >= self.timeout)
        {
            return Err(BackendError::Connect(format!(
                "wait_for_replicas({}, {:?}): wait for at least one replica, for less than the call timeout ({:?})",
                wait.replicas, wait.timeout, self.timeout
            )));
        }
        let refunds = Arc::<std::sync::Mutex<u64>>::default();
        let maker = NodeMaker {
            breaker: self.breaker,
            deny_cache: self.deny_cache,
            refunds: Arc::clone(&refunds),
            max_in_flight: self.max_in_flight,
        };
        let (topology, shown) = match &self.target {
            Target::Server(url) => {
                let url = parse(url)?;
                let settings = self.data_settings(&url, url.tls(), url.db())?;
                let link = Link::new(url.addr().clone(), Arc::new(settings));
                let node = Arc::new(maker.make(Some(link)));
                (Topology::Single(node), url.to_string())
            }
            Target::Cluster(seeds) => self.cluster(seeds, maker).await?,
            Target::Sentinel { master, sentinels } => {
                self.sentinel(master, sentinels, maker).await?
            }
        };
        Ok(RedisBackend::from_parts(Parts {
            topology,
            timeout: self.timeout,
            expiry_slack: self.expiry_slack,
            time: self.time,
            clock: self.clock,
            wait: self.wait,
            shown,
            refunds,
        }))
    }

    fn connect_timeout(&self) -> Duration {
        self.timeout.max(MIN_CONNECT_TIMEOUT)
    }

    async fn cluster(
        &self,
        seeds: &[Given],
        maker: NodeMaker,
    ) -> Result<(Topology, String), BackendError> {
        let urls = seeds.iter().map(parse).collect::<Result<Vec<_>, _>>()?;
        let Some(first) = urls.first() else {
            return Err(BackendError::Connect(
                "a cluster needs at least one seed node's URL".to_owned(),
            ));
        };
        if urls.iter().any(|u| u.tls() != first.tls()) {
            return Err(BackendError::Connect(
                "the cluster's seed URLs mix redis:// and rediss://; a cluster is reached with TLS or without it".to_owned(),
            ));
        }
        if let Some(url) = urls.iter().find(|u| u.db() != 0) {
            return Err(BackendError::Connect(format!(
                "{url}: a Redis Cluster has only database 0; leave the path out"
            )));
        }
        let settings = Arc::new(self.data_settings(first, first.tls(), 0)?);
        let addrs = urls.iter().map(|u| u.addr().clone()).collect();
        let cluster = Arc::new(Cluster::new(
            addrs,
            settings,
            maker,
            Arc::clone(&self.clock),
            self.timeout,
        ));
        if let Err(e) = cluster.refresh().await {
            tracing::warn!(
                target: "limiter_redis::cluster",
                error = %e,
                "the cluster's slots could not be learned at connect; calls follow the failure policy until they are"
            );
        }
        let shown: Vec<String> = urls.iter().map(ToString::to_string).collect();
        Ok((
            Topology::Cluster(cluster),
            format!("cluster via {}", shown.join(", ")),
        ))
    }

    async fn sentinel(
        &self,
        master: &str,
        sentinels: &[Given],
        maker: NodeMaker,
    ) -> Result<(Topology, String), BackendError> {
        if master.is_empty() || sentinels.is_empty() {
            return Err(BackendError::Connect(
                "Sentinel needs the master's name and at least one sentinel's URL".to_owned(),
            ));
        }
        let urls = sentinels.iter().map(parse).collect::<Result<Vec<_>, _>>()?;
        #[cfg(feature = "tls")]
        let data_tls = self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        let data_tls = false;
        let data = Arc::new(self.data_settings_from(
            self.username.clone(),
            self.password.clone(),
            data_tls,
            0,
            DataOrSentinel::Data,
        )?);
        let mut links = Vec::with_capacity(urls.len());
        for url in &urls {
            let username = url
                .username()
                .map(str::to_owned)
                .or_else(|| self.sentinel_username.clone());
            let password = url
                .password()
                .cloned()
                .map(Password::Given)
                .or_else(|| self.sentinel_password.clone());
            let settings = self.data_settings_from(
                username,
                password,
                url.tls(),
                0,
                DataOrSentinel::Sentinel,
            )?;
            links.push(Link::new(url.addr().clone(), Arc::new(settings)));
        }
        let sentinel = Arc::new(Sentinel::new(
            master.to_owned(),
            links.into_iter().map(Arc::new).collect(),
            data,
            maker.make(None),
            self.timeout.max(Duration::from_millis(250)),
        ));
        sentinel.follow().await;
        Sentinel::watch(&sentinel);
        let shown: Vec<String> = urls.iter().map(ToString::to_string).collect();
        Ok((
            Topology::Sentinel(sentinel),
            format!("master `{master}` via sentinels {}", shown.join(", ")),
        ))
    }

    /// A data node's settings: the builder's login, else `url`'s.
    fn data_settings(
        &self,
        url: &RedisUrl,
        tls: bool,
        db: i64,
    ) -> Result<LinkSettings, BackendError> {
        let username = self
            .username
            .clone()
            .or_else(|| url.username().map(str::to_owned));
        let password = self
            .password
            .clone()
            .or_else(|| url.password().cloned().map(Password::Given));
        self.data_settings_from(username, password, tls, db, DataOrSentinel::Data)
    }

    fn data_settings_from(
        &self,
        username: Option<String>,
        password: Option<Password>,
        tls: bool,
        db: i64,
        which: DataOrSentinel,
    ) -> Result<LinkSettings, BackendError> {
        #[cfg(not(feature = "tls"))]
        if tls {
            let _ = which;
            return Err(BackendError::Connect(
                "rediss:// (TLS) needs limiter-redis's `tls` feature (limiterd has it)".to_owned(),
            ));
        }
        Ok(LinkSettings {
            username,
            password,
            db,
            #[cfg(feature = "tls")]
            tls: self.tls_setup(tls, which)?,
            connect_timeout: self.connect_timeout(),
        })
    }

    #[cfg(feature = "tls")]
    fn tls_setup(
        &self,
        wanted: bool,
        which: DataOrSentinel,
    ) -> Result<Option<crate::connect::tls::TlsSetup>, BackendError> {
        let given = match which {
            DataOrSentinel::Data => self.tls.as_ref(),
            DataOrSentinel::Sentinel => self.sentinel_tls.as_ref().or(self.tls.as_ref()),
        };
        if !wanted {
            if given.is_some()
                && matches!(which, DataOrSentinel::Data)
                && !matches!(self.target, Target::Sentinel { .. })
            {
                return Err(BackendError::Connect(
                    "TLS settings were given but the URL says redis://; write rediss:// to connect with TLS".to_owned(),
                ));
            }
            return Ok(None);
        }
        let options = given.cloned().unwrap_or_default();
        options
            .build()
            .map(Some)
            .map_err(|e| BackendError::Tls(e.to_string()))
    }
}

/// Whose settings: a data node's (server, cluster node, Sentinel's master) or a sentinel's.
#[derive(Clone, Copy)]
enum DataOrSentinel {
    Data,
    Sentinel,
}

/// The URL given, or why it is not one (the error never repeats a password).
fn parse(url: &Given) -> Result<RedisUrl, BackendError> {
    url.clone()
        .map_err(|e| BackendError::Connect(e.to_string()))
}

/// `url` as it may be shown: redacted, or a placeholder for a URL that does not parse.
fn shown(url: &Given) -> String {
    url.as_ref()
        .map_or_else(|_| "<not a Redis URL>".to_owned(), ToString::to_string)
}

impl fmt::Debug for BackendBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = match &self.target {
            Target::Server(url) => shown(url),
            Target::Cluster(seeds) => {
                let seeds: Vec<String> = seeds.iter().map(shown).collect();
                format!("cluster via {}", seeds.join(", "))
            }
            Target::Sentinel { master, sentinels } => {
                let sentinels: Vec<String> = sentinels.iter().map(shown).collect();
                format!("master `{master}` via sentinels {}", sentinels.join(", "))
            }
        };
        f.debug_struct("BackendBuilder")
            .field("at", &target)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| crate::REDACTED))
            .field("timeout", &self.timeout)
            .field("breaker", &self.breaker)
            .field("deny_cache", &self.deny_cache)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}
