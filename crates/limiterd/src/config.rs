//! The configuration file (TOML): where to listen, the store (in memory, or Redis with its
//! timeout and failure policy), and named policies, each a stack of limits with an algorithm
//! and a keying. [`Config::parse`] checks everything and every error names the line, the field
//! and the fix.
//!
//! ```toml
//! listen = "127.0.0.1:8080"
//!
//! [store]
//! kind = "memory"              # or "redis"
//! # max_keys = 1000000         # memory: at most this many keys per policy
//! # url = "redis://127.0.0.1:6379"
//! # cluster = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]  # a Redis Cluster's seeds
//! #                            # (instead of `url`): identifiers spread over every master
//! # timeout_ms = 25
//! # on_failure = "fallback"    # "open", "closed" or "fallback"
//! # fleet_size = 1             # processes sharing this Redis: while it is out, each
//! #                            # falls back to its share (1/fleet_size) of every limit
//!
//! [envoy]                      # envoy's rate-limit protocol over gRPC (optional)
//! listen = "127.0.0.1:8081"
//! files = ["ratelimit/web.yaml"] # descriptor files, relative to this file
//!
//! [policies.api]
//! limits = [
//!   { algorithm = "token_bucket", count = 10, period = "1s", burst = 20 },
//!   { algorithm = "sliding_window", count = 1000, period = "1h" },
//!   { algorithm = "fixed_window", count = 10000, period = "1s", key = "global" },
//! ]
//! # lease_slack = "1%"         # Redis: decide locally against leases; the fleet admits at
//! #                            # most each limit plus this ("N%" of it, or N units)
//! # lease_ttl = "1s"           # how long a lease lives
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use limiter_core::{Limit, LimitError};
use limiter_redis::{Kind, LEASE_TTL_RANGE, Lease, OnFailure, RedisLimit, Slack};
use serde::Deserialize;
use toml::Spanned;

/// The policies limiterd serves when started without a file: per-identifier API limits, a
/// login limit, and a global cap.
pub const BUILT_IN: &str = r#"# limiterd's built-in policies (used when no --config is given).
listen = "127.0.0.1:8080"

[store]
kind = "memory"

# 10 per second per identifier, bursts of 20, and at most 1000 per hour.
[policies.api]
limits = [
  { algorithm = "token_bucket", count = 10, period = "1s", burst = 20 },
  { algorithm = "sliding_window", count = 1000, period = "1h" },
]
# With a Redis store, decide locally against leases of each key's budget: the fleet then admits
# at most each limit plus this slack ("N%" of the limit, or N units). Ignored in memory.
# lease_slack = "1%"
# lease_ttl = "1s"             # how long a lease lives (10ms to 1h)

# 5 attempts per minute per identifier.
[policies.login]
limits = [{ algorithm = "fixed_window", count = 5, period = "1m" }]

# 10,000 per second across every identifier, and 100 per second per identifier.
[policies.global]
limits = [
  { algorithm = "token_bucket", count = 100, period = "1s" },
  { algorithm = "token_bucket", count = 10000, period = "1s", key = "global" },
]

# Timeouts and reloading, in milliseconds (these are the defaults; the table may be left out).
# [server]
# header_timeout_ms = 10000    # to send a request's headers
# body_timeout_ms = 10000      # to send its body (then 408)
# shutdown_timeout_ms = 10000  # for requests in flight to finish after SIGTERM
# reload_check_ms = 1000       # how often the files are checked for changes (0: SIGHUP only)
"#;

/// The largest `[store] fleet_size`.
pub const MAX_FLEET_SIZE: u64 = 10_000;

/// The most limits one keying of one policy holds (a stack layer's limit count).
pub const MAX_LIMITS_PER_KEYING: usize = limiter_stack::MAX_LIMITS_PER_LAYER;

/// A checked configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// Where the HTTP API listens.
    pub listen: SocketAddr,
    /// Where state lives.
    pub store: Store,
    /// The policies, by name.
    pub policies: BTreeMap<String, Policy>,
    /// Envoy's rate-limit protocol, if configured.
    pub envoy: Option<EnvoySettings>,
    /// Timeouts and reloading (`[server]`).
    pub server: ServerSettings,
}

/// How the servers treat slow clients, how long a shutdown may take, and how often the files
/// are checked for changes: the `[server]` table, each field in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerSettings {
    /// `header_timeout_ms`: how long a client may take to send a request's headers, from its
    /// first byte (10 s). A connection that stalls there is closed.
    pub header_timeout: Duration,
    /// `body_timeout_ms`: how long a client may take to send a request's body (10 s); past it
    /// the request is answered 408 `request_timeout` and the connection closed.
    pub body_timeout: Duration,
    /// `shutdown_timeout_ms`: after a shutdown signal, how long requests in flight may take to
    /// finish (10 s); connections still open then are cut.
    pub shutdown_timeout: Duration,
    /// `reload_check_ms`: how often the configuration and descriptor files are checked for
    /// changes (1 s); 0 turns the check off (SIGHUP still reloads).
    pub reload_check: Duration,
}

impl Default for ServerSettings {
    fn default() -> Self {
        Self {
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            shutdown_timeout: Duration::from_secs(10),
            reload_check: Duration::from_secs(1),
        }
    }
}

/// Service-wide switches, as the reference's environment sets them (`SHADOW_MODE`,
/// `NEAR_LIMIT_RATIO`, `LIMIT_RESPONSE_HEADERS_ENABLED` and the header names,
/// `RESPONSE_DYNAMIC_METADATA`).
#[derive(Clone, Debug, PartialEq)]
pub struct Options {
    /// Global shadow mode: no configured limit denies (statuses still say which descriptors
    /// were over, and what fits is counted); a limit envoy sends with a descriptor still does.
    pub shadow_mode: bool,
    /// A hit that leaves a limit more than this fraction used counts as `near_limit`.
    pub near_limit_ratio: f64,
    /// Rate-limit headers added to every answer (`response_headers_to_add`), if enabled.
    pub headers: Option<HeaderNames>,
    /// Describe the request's descriptors in the answer's `dynamic_metadata`.
    pub dynamic_metadata: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            shadow_mode: false,
            near_limit_ratio: 0.8,
            headers: None,
            dynamic_metadata: false,
        }
    }
}

/// The names of the rate-limit headers (the reference's defaults: `RateLimit-Limit`,
/// `RateLimit-Remaining`, `RateLimit-Reset`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeaderNames {
    /// The limit of the descriptor closest to its limit.
    pub limit: String,
    /// What it has left.
    pub remaining: String,
    /// Seconds until it resets.
    pub reset: String,
}

impl Default for HeaderNames {
    fn default() -> Self {
        Self {
            limit: "RateLimit-Limit".into(),
            remaining: "RateLimit-Remaining".into(),
            reset: "RateLimit-Reset".into(),
        }
    }
}

/// Where envoy's gRPC protocol listens, unless the file says.
pub const DEFAULT_GRPC_LISTEN: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(
    std::net::Ipv4Addr::LOCALHOST,
    8081,
));

/// Envoy's rate-limit protocol: where its gRPC service listens and the descriptor files it
/// decides (see [`crate::envoy::rules`]).
#[derive(Clone, Debug, PartialEq)]
pub struct EnvoySettings {
    /// The gRPC address.
    pub listen: SocketAddr,
    /// The descriptor files, as written (relative to the configuration file); a directory
    /// stands for every `.yaml` and `.yml` file in it, as the reference's runtime directory.
    pub files: Vec<PathBuf>,
    /// `merge_domains`: a domain named in several files gathers their descriptors (the
    /// reference's `MERGE_DOMAIN_CONFIG`); off, a domain lives in one file.
    pub merge_domains: bool,
    /// The service-wide switches (global shadow mode, near-limit ratio, rate-limit headers,
    /// dynamic metadata).
    pub options: Options,
    /// Which switches the `[envoy]` table set itself (the reference's environment variables
    /// only fill in the others).
    pub set_in_file: EnvoySwitches,
}

impl EnvoySettings {
    /// Settings for `files`, listening on `listen`, with every switch at its default.
    pub fn new(listen: SocketAddr, files: Vec<PathBuf>) -> Self {
        Self {
            listen,
            files,
            merge_domains: false,
            options: Options::default(),
            set_in_file: EnvoySwitches::default(),
        }
    }

    /// Applies the reference service's environment variables (`SHADOW_MODE`,
    /// `NEAR_LIMIT_RATIO`, `MERGE_DOMAIN_CONFIG`, `LIMIT_RESPONSE_HEADERS_ENABLED`,
    /// `LIMIT_LIMIT_HEADER`, `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER`,
    /// `RESPONSE_DYNAMIC_METADATA`) read through `var`, for what the `[envoy]` table left
    /// unset ([`EnvoySettings::set_in_file`]), so a deployment configured for the reference
    /// keeps its switches.
    pub fn apply_reference_env(
        &mut self,
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<(), String> {
        let set_in_file = self.set_in_file;
        let flag = |name: &str| -> Result<Option<bool>, String> {
            match var(name) {
                None => Ok(None),
                Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                    "1" | "t" | "true" | "yes" | "on" => Ok(Some(true)),
                    "0" | "f" | "false" | "no" | "off" | "" => Ok(Some(false)),
                    _ => Err(format!(
                        "{name}={v:?} is not a boolean: set it to true or false"
                    )),
                },
            }
        };
        if !set_in_file.shadow_mode
            && let Some(on) = flag("SHADOW_MODE")?
        {
            self.options.shadow_mode = on;
        }
        if !set_in_file.merge_domains
            && let Some(on) = flag("MERGE_DOMAIN_CONFIG")?
        {
            self.merge_domains = on;
        }
        if !set_in_file.dynamic_metadata
            && let Some(on) = flag("RESPONSE_DYNAMIC_METADATA")?
        {
            self.options.dynamic_metadata = on;
        }
        if !set_in_file.near_limit_ratio
            && let Some(v) = var("NEAR_LIMIT_RATIO")
        {
            self.options.near_limit_ratio =
                parse_ratio(&v).map_err(|e| format!("NEAR_LIMIT_RATIO={v:?} {e}"))?;
        }
        if !set_in_file.response_headers
            && let Some(on) = flag("LIMIT_RESPONSE_HEADERS_ENABLED")?
        {
            self.options.headers = on.then(HeaderNames::default);
        }
        if let Some(names) = &mut self.options.headers {
            for (variable, name) in [
                ("LIMIT_LIMIT_HEADER", &mut names.limit),
                ("LIMIT_REMAINING_HEADER", &mut names.remaining),
                ("LIMIT_RESET_HEADER", &mut names.reset),
            ] {
                if let Some(v) = var(variable).filter(|v| !v.is_empty())
                    && !set_in_file.header_names
                {
                    check_header_name(&v).map_err(|e| format!("{variable}={v:?} {e}"))?;
                    *name = v;
                }
            }
        }
        Ok(())
    }
}

/// Which of the `[envoy]` switches the file set, so the reference's environment variables
/// only fill in the others.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EnvoySwitches {
    /// `shadow_mode`.
    pub shadow_mode: bool,
    /// `merge_domains`.
    pub merge_domains: bool,
    /// `dynamic_metadata`.
    pub dynamic_metadata: bool,
    /// `near_limit_ratio`.
    pub near_limit_ratio: bool,
    /// `response_headers`.
    pub response_headers: bool,
    /// Any of the header names.
    pub header_names: bool,
}

fn parse_ratio(text: &str) -> Result<f64, &'static str> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err("is not a ratio between 0 and 1: write one like 0.8"),
    }
}

fn check_header_name(name: &str) -> Result<(), &'static str> {
    if !name.is_empty() && http::HeaderName::from_bytes(name.as_bytes()).is_ok() {
        Ok(())
    } else {
        Err("is not a header name: use letters, digits and `-`, like RateLimit-Limit")
    }
}

/// Where state lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Store {
    /// In this process: fast, and per process; each policy's stack holds at most `max_keys`
    /// keys if set (new identifiers are refused, with a 503, while it is full of keys still
    /// refilling; none is forgotten).
    Memory {
        /// The bound per policy, if any.
        max_keys: Option<usize>,
    },
    /// On Redis: shared by every limiterd pointed at it.
    Redis {
        /// One server, or a cluster's seed nodes.
        at: RedisAt,
        /// Each call's timeout.
        timeout: Duration,
        /// What a policy does when Redis fails, unless it says otherwise.
        on_failure: OnFailure,
        /// How many limiterd processes share the policies: while Redis is out, each one's
        /// fallback enforces its share (`1/fleet_size`) of every limit.
        fleet_size: u64,
    },
}

/// Where a Redis store is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisAt {
    /// One server: `redis://host:port`.
    Server(String),
    /// A Redis Cluster, reached through any of these seed nodes (`redis://host:port` each):
    /// each policy's identifiers spread over every master.
    Cluster(Vec<String>),
}

impl std::fmt::Display for RedisAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Server(url) => f.write_str(url),
            Self::Cluster(seeds) => write!(f, "cluster via {}", seeds.join(", ")),
        }
    }
}

impl Store {
    /// Memory or Redis, what a limit is checked for.
    pub fn kind(&self) -> StoreKind {
        match self {
            Self::Memory { .. } => StoreKind::Memory,
            Self::Redis { .. } => StoreKind::Redis,
        }
    }
}

/// Which store a limit runs on, which decides the limits it can count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    /// This process's memory.
    Memory,
    /// Redis (counting microseconds, within the script's ranges).
    Redis,
}

/// A limit its algorithm accepts on the store it will run on. It is checked once, where it is
/// read (the file, an envoy descriptor, an ad-hoc request), and trusted from then on: the
/// engine builds stacks from it without checking again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckedLimit {
    kind: Kind,
    limit: Limit,
    store: StoreKind,
}

impl CheckedLimit {
    /// `limit` counted by `kind` on `store`, or why that store cannot count it.
    pub fn new(kind: Kind, limit: Limit, store: StoreKind) -> Result<Self, LimitError> {
        match store {
            StoreKind::Memory => kind.check(limit)?,
            StoreKind::Redis => {
                RedisLimit::new(kind, limit)?;
            }
        }
        Ok(Self { kind, limit, store })
    }

    /// The algorithm.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Count per period, burst.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The store it was checked for.
    pub fn store(&self) -> StoreKind {
        self.store
    }
}

/// How a limit is keyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Keying {
    /// A state per identifier.
    Identifier,
    /// One state for every identifier.
    Global,
}

/// One limit of a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyLimit {
    /// The algorithm and its limit, checked for the store.
    pub limit: CheckedLimit,
    /// Per identifier or global.
    pub keying: Keying,
}

/// A named stack of limits, all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The limits, in the file's order.
    pub limits: Vec<PolicyLimit>,
    /// What the policy does when Redis fails (the store's unless set).
    pub on_failure: OnFailure,
    /// On Redis, decide against leases within this slack (`lease_slack`); ignored in memory,
    /// where every decision is local already.
    pub lease: Option<Lease>,
}

/// A configuration that cannot be used: where, what, and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// 1-based line, when the error has a place in the file.
    pub line: Option<usize>,
    /// 1-based column.
    pub column: Option<usize>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => {
                write!(f, "line {line}, column {column}: {}", self.message)
            }
            (Some(line), None) => write!(f, "line {line}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    listen: Option<Spanned<String>>,
    store: Option<Spanned<RawStore>>,
    #[serde(default)]
    policies: BTreeMap<Spanned<String>, Spanned<RawPolicy>>,
    envoy: Option<Spanned<RawEnvoy>>,
    server: Option<Spanned<RawServer>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    header_timeout_ms: Option<Spanned<u64>>,
    body_timeout_ms: Option<Spanned<u64>>,
    shutdown_timeout_ms: Option<Spanned<u64>>,
    reload_check_ms: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEnvoy {
    listen: Option<Spanned<String>>,
    files: Spanned<Vec<Spanned<String>>>,
    merge_domains: Option<bool>,
    shadow_mode: Option<bool>,
    near_limit_ratio: Option<Spanned<f64>>,
    response_headers: Option<bool>,
    limit_header: Option<Spanned<String>>,
    remaining_header: Option<Spanned<String>>,
    reset_header: Option<Spanned<String>>,
    dynamic_metadata: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    kind: Spanned<String>,
    max_keys: Option<Spanned<u64>>,
    url: Option<Spanned<String>>,
    cluster: Option<Spanned<Vec<Spanned<String>>>>,
    timeout_ms: Option<Spanned<u64>>,
    on_failure: Option<Spanned<String>>,
    fleet_size: Option<Spanned<u64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    limits: Spanned<Vec<Spanned<RawLimit>>>,
    on_failure: Option<Spanned<String>>,
    lease_slack: Option<Spanned<toml::Value>>,
    lease_ttl: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    algorithm: Spanned<String>,
    count: Spanned<u64>,
    period: Spanned<String>,
    burst: Option<Spanned<u64>>,
    key: Option<Spanned<String>>,
}

/// Turns byte offsets into lines and columns.
struct Source<'a>(&'a str);

impl Source<'_> {
    fn error(&self, span: Option<Range<usize>>, message: impl Into<String>) -> ConfigError {
        let (line, column) = match span {
            Some(span) => {
                let before = self.0.get(..span.start).unwrap_or(self.0);
                let line = before.matches('\n').count() + 1;
                let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                (Some(line), Some(column))
            }
            None => (None, None),
        };
        ConfigError {
            line,
            column,
            message: message.into(),
        }
    }

    fn at<T>(&self, field: &Spanned<T>, message: impl Into<String>) -> ConfigError {
        self.error(Some(field.span()), message)
    }
}

impl Config {
    /// Parses and checks `text`.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let source = Source(text);
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let message = e.message().trim_end().to_owned();
            source.error(
                e.span(),
                format!(
                    "{message} (`limiterd example-config` prints a complete file to start from)"
                ),
            )
        })?;
        let listen = match &raw.listen {
            None => SocketAddr::from(([127, 0, 0, 1], 8080)),
            Some(listen) => parse_listen(&source, "listen", listen)?,
        };
        let envoy = match &raw.envoy {
            None => None,
            Some(envoy) => Some(parse_envoy(&source, envoy)?),
        };
        let store = match &raw.store {
            None => Store::Memory { max_keys: None },
            Some(store) => parse_store(&source, store)?,
        };
        let server = match &raw.server {
            None => ServerSettings::default(),
            Some(server) => parse_server(&source, server.get_ref())?,
        };
        let default_failure = match &store {
            Store::Redis { on_failure, .. } => *on_failure,
            Store::Memory { .. } => OnFailure::default(),
        };
        if raw.policies.is_empty() && envoy.is_none() {
            return Err(source.error(
                None,
                "no policies: add at least one `[policies.NAME]` table with `limits = [...]`, \
                 or an `[envoy]` table with descriptor `files`",
            ));
        }
        let mut policies = BTreeMap::new();
        for (name, policy) in &raw.policies {
            check_name(&source, name)?;
            let checked = parse_policy(&source, name.get_ref(), policy, default_failure, &store)?;
            policies.insert(name.get_ref().clone(), checked);
        }
        Ok(Self {
            listen,
            store,
            policies,
            envoy,
            server,
        })
    }
}

impl Config {
    /// The same policies on the Redis at `url` (the `--redis` flag): the file's Redis timeout
    /// and failure policy if it had a Redis store, else the defaults. Refused if a limit cannot
    /// be decided exactly on Redis.
    pub fn with_redis(mut self, url: &str) -> Result<Self, ConfigError> {
        let plain = |message: String| ConfigError {
            line: None,
            column: None,
            message,
        };
        if !url.starts_with("redis://") && !url.starts_with("rediss://") {
            return Err(plain(format!(
                "--redis {url:?}: write it as redis://host:port"
            )));
        }
        let (timeout, on_failure, fleet_size) = match self.store {
            Store::Redis {
                timeout,
                on_failure,
                fleet_size,
                ..
            } => (timeout, on_failure, fleet_size),
            Store::Memory { .. } => (limiter_redis::DEFAULT_TIMEOUT, OnFailure::default(), 1),
        };
        for (name, policy) in &mut self.policies {
            for l in &mut policy.limits {
                l.limit = CheckedLimit::new(l.limit.kind(), l.limit.limit(), StoreKind::Redis)
                    .map_err(|e| plain(format!("policy `{name}` cannot run on Redis: {e}")))?;
            }
        }
        self.store = Store::Redis {
            at: RedisAt::Server(url.to_owned()),
            timeout,
            on_failure,
            fleet_size,
        };
        Ok(self)
    }
}

fn parse_listen(
    source: &Source<'_>,
    field: &str,
    listen: &Spanned<String>,
) -> Result<SocketAddr, ConfigError> {
    listen.get_ref().parse().map_err(|_| {
        source.at(
            listen,
            format!(
                "`{field} = {:?}` is not an address and port: write one like \"127.0.0.1:8080\"",
                listen.get_ref()
            ),
        )
    })
}

fn parse_envoy(
    source: &Source<'_>,
    envoy: &Spanned<RawEnvoy>,
) -> Result<EnvoySettings, ConfigError> {
    let raw = envoy.get_ref();
    let listen = match &raw.listen {
        None => DEFAULT_GRPC_LISTEN,
        Some(listen) => parse_listen(source, "listen", listen)?,
    };
    if raw.files.get_ref().is_empty() {
        return Err(source.at(
            &raw.files,
            "`files` is empty: list the descriptor files (YAML) envoy's domains are in",
        ));
    }
    let mut files = Vec::new();
    for file in raw.files.get_ref() {
        if file.get_ref().is_empty() {
            return Err(source.at(file, "an empty file name: write the path to a YAML file"));
        }
        files.push(PathBuf::from(file.get_ref()));
    }
    let mut settings = EnvoySettings::new(listen, files);
    settings.set_in_file = EnvoySwitches {
        shadow_mode: raw.shadow_mode.is_some(),
        merge_domains: raw.merge_domains.is_some(),
        dynamic_metadata: raw.dynamic_metadata.is_some(),
        near_limit_ratio: raw.near_limit_ratio.is_some(),
        response_headers: raw.response_headers.is_some(),
        header_names: raw.limit_header.is_some()
            || raw.remaining_header.is_some()
            || raw.reset_header.is_some(),
    };
    settings.merge_domains = raw.merge_domains.unwrap_or(false);
    let options = &mut settings.options;
    options.shadow_mode = raw.shadow_mode.unwrap_or(false);
    options.dynamic_metadata = raw.dynamic_metadata.unwrap_or(false);
    if let Some(ratio) = &raw.near_limit_ratio {
        options.near_limit_ratio = parse_ratio(&ratio.get_ref().to_string())
            .map_err(|e| source.at(ratio, format!("`near_limit_ratio` {e}")))?;
    }
    if raw.response_headers == Some(true) {
        let mut names = HeaderNames::default();
        for (field, value, name) in [
            ("limit_header", &raw.limit_header, &mut names.limit),
            (
                "remaining_header",
                &raw.remaining_header,
                &mut names.remaining,
            ),
            ("reset_header", &raw.reset_header, &mut names.reset),
        ] {
            if let Some(value) = value {
                check_header_name(value.get_ref())
                    .map_err(|e| source.at(value, format!("`{field}` {e}")))?;
                *name = value.get_ref().clone();
            }
        }
        options.headers = Some(names);
    }
    Ok(settings)
}

fn parse_server(source: &Source<'_>, raw: &RawServer) -> Result<ServerSettings, ConfigError> {
    let defaults = ServerSettings::default();
    let field = |value: &Option<Spanned<u64>>,
                 name: &str,
                 least: u64,
                 default: Duration|
     -> Result<Duration, ConfigError> {
        match value {
            None => Ok(default),
            Some(ms) if (least..=3_600_000).contains(ms.get_ref()) => {
                Ok(Duration::from_millis(*ms.get_ref()))
            }
            Some(ms) => Err(source.at(
                ms,
                format!(
                    "`{name} = {}`: use {least} to 3600000 milliseconds",
                    ms.get_ref()
                ),
            )),
        }
    };
    Ok(ServerSettings {
        header_timeout: field(
            &raw.header_timeout_ms,
            "header_timeout_ms",
            1,
            defaults.header_timeout,
        )?,
        body_timeout: field(
            &raw.body_timeout_ms,
            "body_timeout_ms",
            1,
            defaults.body_timeout,
        )?,
        shutdown_timeout: field(
            &raw.shutdown_timeout_ms,
            "shutdown_timeout_ms",
            0,
            defaults.shutdown_timeout,
        )?,
        reload_check: field(
            &raw.reload_check_ms,
            "reload_check_ms",
            0,
            defaults.reload_check,
        )?,
    })
}

fn check_name(source: &Source<'_>, name: &Spanned<String>) -> Result<(), ConfigError> {
    let ok = !name.get_ref().is_empty()
        && name.get_ref().len() <= 64
        && name
            .get_ref()
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(source.at(
            name,
            format!(
                "policy name {:?}: use 1 to 64 letters, digits, `-`, `_` or `.`",
                name.get_ref()
            ),
        ))
    }
}

fn parse_failure(source: &Source<'_>, value: &Spanned<String>) -> Result<OnFailure, ConfigError> {
    match value.get_ref().as_str() {
        "open" => Ok(OnFailure::Open),
        "closed" => Ok(OnFailure::Closed),
        "fallback" => Ok(OnFailure::Fallback),
        other => Err(source.at(
            value,
            format!("`on_failure = {other:?}`: use \"open\", \"closed\" or \"fallback\""),
        )),
    }
}

fn parse_store(source: &Source<'_>, store: &Spanned<RawStore>) -> Result<Store, ConfigError> {
    let raw = store.get_ref();
    match raw.kind.get_ref().as_str() {
        "memory" => {
            let max_keys = match &raw.max_keys {
                None => None,
                Some(n) if (1..=1_000_000_000).contains(n.get_ref()) => {
                    usize::try_from(*n.get_ref()).ok()
                }
                Some(n) => {
                    return Err(source.at(
                        n,
                        format!(
                            "`max_keys = {}`: use 1 to 1000000000, or leave it out for no bound",
                            n.get_ref()
                        ),
                    ));
                }
            };
            for (present, field) in [
                (raw.url.as_ref().map(Spanned::span), "url"),
                (raw.cluster.as_ref().map(Spanned::span), "cluster"),
                (raw.timeout_ms.as_ref().map(Spanned::span), "timeout_ms"),
                (raw.on_failure.as_ref().map(Spanned::span), "on_failure"),
                (raw.fleet_size.as_ref().map(Spanned::span), "fleet_size"),
            ] {
                if let Some(span) = present {
                    return Err(source.error(
                        Some(span),
                        format!("`{field}` applies to `kind = \"redis\"` only: remove it or set the kind"),
                    ));
                }
            }
            Ok(Store::Memory { max_keys })
        }
        "redis" => {
            if let Some(n) = &raw.max_keys {
                return Err(source.at(
                    n,
                    "`max_keys` applies to `kind = \"memory\"`: Redis keys expire on their own",
                ));
            }
            let redis_url = |url: &Spanned<String>, field: &str| {
                if url.get_ref().starts_with("redis://") || url.get_ref().starts_with("rediss://") {
                    Ok(url.get_ref().clone())
                } else {
                    Err(source.at(
                        url,
                        format!(
                            "`{field}` holds {:?}: write it as \"redis://host:port\"",
                            url.get_ref()
                        ),
                    ))
                }
            };
            let at = match (&raw.url, &raw.cluster) {
                (Some(_), Some(cluster)) => {
                    return Err(source.at(
                        cluster,
                        "give `url` (one server) or `cluster` (a Redis Cluster's seed nodes), not both",
                    ));
                }
                (None, None) => {
                    return Err(source.at(
                        store,
                        "a redis store needs `url = \"redis://host:port\"` (one server) or \
                         `cluster = [\"redis://host:port\", ...]` (a Redis Cluster's seed nodes)",
                    ));
                }
                (Some(url), None) => RedisAt::Server(redis_url(url, "url")?),
                (None, Some(cluster)) => {
                    if cluster.get_ref().is_empty() {
                        return Err(source.at(
                            cluster,
                            "`cluster = []`: list at least one seed node, \"redis://host:port\"",
                        ));
                    }
                    let seeds = cluster
                        .get_ref()
                        .iter()
                        .map(|url| redis_url(url, "cluster"))
                        .collect::<Result<Vec<_>, _>>()?;
                    RedisAt::Cluster(seeds)
                }
            };
            let timeout = match &raw.timeout_ms {
                None => limiter_redis::DEFAULT_TIMEOUT,
                Some(ms) if (1..=60_000).contains(ms.get_ref()) => {
                    Duration::from_millis(*ms.get_ref())
                }
                Some(ms) => {
                    return Err(source.at(
                        ms,
                        format!(
                            "`timeout_ms = {}`: use 1 to 60000 milliseconds",
                            ms.get_ref()
                        ),
                    ));
                }
            };
            let on_failure = match &raw.on_failure {
                None => OnFailure::default(),
                Some(value) => parse_failure(source, value)?,
            };
            let fleet_size = match &raw.fleet_size {
                None => 1,
                Some(n) if (1..=MAX_FLEET_SIZE).contains(n.get_ref()) => *n.get_ref(),
                Some(n) => {
                    return Err(source.at(
                        n,
                        format!(
                            "`fleet_size = {}`: give the number of limiterd processes sharing this Redis, 1 to {MAX_FLEET_SIZE}",
                            n.get_ref()
                        ),
                    ));
                }
            };
            Ok(Store::Redis {
                at,
                timeout,
                on_failure,
                fleet_size,
            })
        }
        other => Err(source.at(
            &raw.kind,
            format!("store `kind = {other:?}`: use \"memory\" or \"redis\""),
        )),
    }
}

fn parse_policy(
    source: &Source<'_>,
    name: &str,
    policy: &Spanned<RawPolicy>,
    default_failure: OnFailure,
    store: &Store,
) -> Result<Policy, ConfigError> {
    let raw = policy.get_ref();
    if raw.limits.get_ref().is_empty() {
        return Err(source.at(
            &raw.limits,
            format!("policy `{name}` has no limits: add one such as {{ algorithm = \"token_bucket\", count = 10, period = \"1s\" }}"),
        ));
    }
    let mut limits = Vec::new();
    for entry in raw.limits.get_ref() {
        let limit = parse_limit(source, name, entry, store)?;
        let same = limits
            .iter()
            .filter(|l: &&PolicyLimit| l.keying == limit.keying)
            .count();
        if same == MAX_LIMITS_PER_KEYING {
            return Err(source.at(
                entry,
                format!(
                    "policy `{name}` has more than {MAX_LIMITS_PER_KEYING} limits keyed the same way: merge some or split the policy"
                ),
            ));
        }
        limits.push(limit);
    }
    let on_failure = match &raw.on_failure {
        None => default_failure,
        Some(value) => parse_failure(source, value)?,
    };
    // While Redis is out, each of `fleet_size` processes falls back to its share of a limit.
    if let (Store::Redis { fleet_size, .. }, OnFailure::Fallback) = (store, on_failure) {
        for (entry, limit) in raw.limits.get_ref().iter().zip(&limits) {
            let limit = limit.limit.limit();
            let most = limit.count().min(limit.burst());
            if most < *fleet_size {
                return Err(source.at(
                    entry,
                    format!(
                        "policy `{name}`: {limit} cannot be shared by `fleet_size = {fleet_size}` processes while Redis is out (each would get 0); raise the count to {fleet_size} or more, lower `fleet_size` to {most}, or give the policy another `on_failure`"
                    ),
                ));
            }
        }
    }
    let lease = parse_lease(source, name, raw)?;
    if let (Some(lease), Some(slack)) = (&lease, &raw.lease_slack) {
        // A slack no lease can use on one of the policy's limits: refused here, with the
        // smallest (or largest) one that works, rather than silently per call.
        for limit in &limits {
            if let Some(reason) = lease.slack().refusal(limit.limit.limit().burst()) {
                return Err(source.at(
                    slack,
                    format!("policy `{name}`, limit {}: {reason}", limit.limit.limit()),
                ));
            }
        }
    }
    Ok(Policy {
        limits,
        on_failure,
        lease,
    })
}

/// `lease_slack` (`"N%"` of each limit, up to four decimals, or a whole number of units) and
/// `lease_ttl` (a period).
fn parse_lease(
    source: &Source<'_>,
    policy: &str,
    raw: &RawPolicy,
) -> Result<Option<Lease>, ConfigError> {
    let Some(slack) = &raw.lease_slack else {
        if let Some(ttl) = &raw.lease_ttl {
            return Err(source.at(
                ttl,
                format!("policy `{policy}`: `lease_ttl` without `lease_slack`; add `lease_slack = \"1%\"` (or remove `lease_ttl`)"),
            ));
        }
        return Ok(None);
    };
    let fix = "write a share of each limit such as \"1%\" or \"0.5%\", or a whole number of units such as 100";
    let slack_value =
        match slack.get_ref() {
            toml::Value::Integer(n) => u64::try_from(*n).map(Slack::units).map_err(|_| {
                source.at(
                    slack,
                    format!("policy `{policy}`: `lease_slack = {n}` is negative; {fix}"),
                )
            })?,
            toml::Value::String(text) => parse_percent(text)
                .map(Slack::PartsPerMillion)
                .ok_or_else(|| {
                    source.at(
                        slack,
                        format!("policy `{policy}`: `lease_slack = {text:?}`: {fix}"),
                    )
                })?,
            other => {
                return Err(source.at(
                    slack,
                    format!(
                        "policy `{policy}`: `lease_slack` is a {}: {fix}",
                        other.type_str()
                    ),
                ));
            }
        };
    let mut lease = Lease::new(slack_value);
    if let Some(ttl) = &raw.lease_ttl {
        let (least, most) = LEASE_TTL_RANGE;
        let period = parse_period(ttl.get_ref()).filter(|p| *p >= least && *p <= most);
        let Some(period) = period else {
            return Err(source.at(
                ttl,
                format!(
                    "policy `{policy}`: `lease_ttl = {:?}`: write a period from {least:?} to {most:?}, such as \"1s\"",
                    ttl.get_ref()
                ),
            ));
        };
        lease = lease.ttl(period);
    }
    Ok(Some(lease))
}

/// `"N%"` (N a decimal with at most four places, at most 100) in parts per million.
pub(crate) fn parse_percent(text: &str) -> Option<u64> {
    let number = text.trim().strip_suffix('%')?.trim();
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty()
        || fraction.len() > 4
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut places: u64 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().ok()?
    };
    for _ in fraction.len()..4 {
        places *= 10;
    }
    let ppm = whole.checked_mul(10_000)?.checked_add(places)?;
    (ppm <= 1_000_000).then_some(ppm)
}

fn parse_limit(
    source: &Source<'_>,
    policy: &str,
    entry: &Spanned<RawLimit>,
    store: &Store,
) -> Result<PolicyLimit, ConfigError> {
    let raw = entry.get_ref();
    let kind: Kind = raw.algorithm.get_ref().parse().map_err(|e| {
        let given = raw.algorithm.get_ref();
        source.at(&raw.algorithm, format!("`algorithm = {given:?}`: {e}"))
    })?;
    let period = parse_period(raw.period.get_ref())
        .ok_or_else(|| source.at(&raw.period, format!("`period = {:?}`: write a whole number with a unit, such as \"500ms\", \"1s\", \"1m\", \"1h\" or \"1d\"", raw.period.get_ref())))?;
    let limit = Limit::new(*raw.count.get_ref(), period);
    let limit = match &raw.burst {
        None => limit,
        Some(burst) => {
            let with_burst = limit.with_burst(*burst.get_ref());
            if let Err(e @ LimitError::ZeroBurst) = with_burst.check() {
                return Err(source.at(burst, format!("policy `{policy}`: {e}")));
            }
            with_burst
        }
    };
    limit
        .check()
        .map_err(|e| source.at(&raw.count, format!("policy `{policy}`: {e}")))?;
    let keying = match raw.key.as_ref().map(|k| k.get_ref().as_str()) {
        None | Some("identifier") => Keying::Identifier,
        Some("global") => Keying::Global,
        Some(other) => {
            let key = raw.key.as_ref().map(Spanned::span);
            return Err(source.error(
                key,
                format!("`key = {other:?}`: use \"identifier\" (the default) or \"global\""),
            ));
        }
    };
    // The algorithm must accept the limit here, in process and, for a Redis store, on Redis.
    let limit = CheckedLimit::new(kind, limit, store.kind())
        .map_err(|e| source.at(entry, format!("policy `{policy}`: {e}")))?;
    Ok(PolicyLimit { limit, keying })
}

/// `"500ms"`, `"1s"`, `"15m"`, `"1h"`, `"1d"`: a whole number and a unit.
pub fn parse_period(text: &str) -> Option<Duration> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let nanos_per = match unit {
        "ns" => 1,
        "us" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        "d" => 86_400_000_000_000,
        _ => return None,
    };
    n.checked_mul(nanos_per).map(Duration::from_nanos)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_cluster_is_given_by_its_seed_nodes() {
        let config = Config::parse(
            "[store]\nkind = \"redis\"\ncluster = [\"redis://10.0.0.1:6379\", \"redis://10.0.0.2:6379\"]\n\
             [policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1m\" }]\n",
        )
        .unwrap();
        let Store::Redis { at, .. } = &config.store else {
            panic!("{:?}", config.store);
        };
        assert_eq!(
            at,
            &RedisAt::Cluster(vec![
                "redis://10.0.0.1:6379".to_owned(),
                "redis://10.0.0.2:6379".to_owned()
            ])
        );
        assert_eq!(
            at.to_string(),
            "cluster via redis://10.0.0.1:6379, redis://10.0.0.2:6379"
        );
    }

    #[test]
    fn the_built_in_policies_parse() {
        let config = Config::parse(BUILT_IN).expect("valid");
        assert_eq!(config.listen, SocketAddr::from(([127, 0, 0, 1], 8080)));
        assert_eq!(config.store, Store::Memory { max_keys: None });
        assert_eq!(
            config.policies.keys().collect::<Vec<_>>(),
            ["api", "global", "login"]
        );
        let api = &config.policies["api"];
        assert_eq!(api.limits[0].limit.limit().burst(), 20);
        assert_eq!(api.limits[1].limit.kind(), Kind::SlidingWindow);
        assert_eq!(config.policies["global"].limits[1].keying, Keying::Global);
    }

    fn error(text: &str) -> String {
        Config::parse(text).expect_err("refused").to_string()
    }

    #[test]
    fn lease_slack_reads_a_share_or_units_and_refuses_anything_else() {
        let with = |extra: &str| {
            format!(
                "[policies.p]\nlimits = [{{ algorithm = \"token_bucket\", count = 1000, period = \"1s\" }}]\n{extra}\n"
            )
        };
        let lease = |extra: &str| Config::parse(&with(extra)).expect("valid").policies["p"].lease;
        assert_eq!(lease(""), None);
        assert_eq!(
            lease("lease_slack = \"1%\""),
            Some(Lease::new(Slack::PartsPerMillion(10_000)))
        );
        assert_eq!(
            lease("lease_slack = \"0.25%\""),
            Some(Lease::new(Slack::PartsPerMillion(2_500)))
        );
        assert_eq!(
            lease("lease_slack = 40\nlease_ttl = \"2s\""),
            Some(Lease::new(Slack::Units(40)).ttl(Duration::from_secs(2)))
        );
        for (extra, want) in [
            (
                "lease_slack = \"5\"",
                "line 3, column 15: policy `p`: `lease_slack = \"5\"`: write a share",
            ),
            (
                "lease_slack = \"101%\"",
                "`lease_slack = \"101%\"`: write a share",
            ),
            ("lease_slack = \"0.12345%\"", "write a share"),
            ("lease_slack = \"-1%\"", "write a share"),
            ("lease_slack = -3", "`lease_slack = -3` is negative"),
            ("lease_slack = 1.5", "`lease_slack` is a float"),
            (
                "lease_slack = \"1%\"\nlease_ttl = \"1ms\"",
                "line 4, column 13: policy `p`: `lease_ttl = \"1ms\"`: write a period from 10ms to 3600s",
            ),
            ("lease_ttl = \"1s\"", "`lease_ttl` without `lease_slack`"),
            // A share that is no whole unit of the limit, and more units than the limit: each
            // refused with the slack that works, where the slack is written.
            (
                "lease_slack = \"0.05%\"",
                "line 3, column 15: policy `p`, limit 1000 per 1s: a slack of 0.05% is no whole unit of a burst of 1000, so nothing would be leased; use at least 0.1% (one unit)",
            ),
            (
                "lease_slack = 5000",
                "policy `p`, limit 1000 per 1s: a slack of 5000 units is more than the burst of 1000",
            ),
        ] {
            let got = error(&with(extra));
            assert!(got.contains(want), "{extra}: {got}");
        }
        // 1% of 10 rounds to no unit: refused (not silently decided per call).
        let ten = "[policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 10, period = \"1s\" }]\nlease_slack = \"1%\"\n";
        let got = error(ten);
        assert!(got.contains("use at least 10%"), "{got}");
        assert_eq!(parse_percent("100%"), Some(1_000_000));
        assert_eq!(parse_percent(".5%"), Some(5_000));
        assert_eq!(parse_percent("%"), None);
        assert_eq!(parse_percent("1.%"), Some(10_000));
        assert_eq!(parse_percent("99999999999999999999%"), None);
    }

    #[test]
    fn every_error_names_the_line_and_the_fix() {
        let policy = |limit: &str| format!("[policies.p]\nlimits = [\n  {limit},\n]\n");
        for (text, want) in [
            ("listen = 8080\n".to_owned(), "line 1, column 10: invalid type: integer `8080`, expected a string"),
            ("listen = \"nowhere\"\n".to_owned(), "line 1, column 10: `listen = \"nowhere\"` is not an address"),
            ("colour = 1\n".to_owned(), "line 1, column 1: unknown field `colour`"),
            ("[store]\nkind = \"disk\"\n".to_owned(), "line 2, column 8: store `kind = \"disk\"`: use \"memory\" or \"redis\""),
            ("[store]\nkind = \"redis\"\n".to_owned(), "line 1, column 1: a redis store needs `url"),
            ("[store]\nkind = \"redis\"\nurl = \"redis://a:1\"\ncluster = [\"redis://b:1\"]\n".to_owned(), "line 4, column 11: give `url` (one server) or `cluster`"),
            ("[store]\nkind = \"redis\"\ncluster = []\n".to_owned(), "line 3, column 11: `cluster = []`: list at least one seed node"),
            ("[store]\nkind = \"redis\"\ncluster = [\"redis://a:1\", \"b:1\"]\n".to_owned(), "line 3, column 27: `cluster` holds \"b:1\": write it as \"redis://host:port\""),
            ("[store]\nkind = \"memory\"\ncluster = [\"redis://a:1\"]\n".to_owned(), "line 3, column 11: `cluster` applies to `kind = \"redis\"` only"),
            ("[store]\nkind = \"memory\"\ntimeout_ms = 5\n".to_owned(), "line 3, column 14: `timeout_ms` applies to `kind = \"redis\"` only"),
            ("[store]\nkind = \"memory\"\nmax_keys = 0\n".to_owned(), "line 3, column 12: `max_keys = 0`: use 1 to 1000000000"),
            ("[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nfleet_size = 4\n[policies.p]\nlimits = [\n  { algorithm = \"fixed_window\", count = 3, period = \"1m\" },\n]\n".to_owned(), "line 7, column 3: policy `p`: 3 per 60s cannot be shared by `fleet_size = 4` processes"),
            ("[store]\nkind = \"memory\"\nfleet_size = 3\n".to_owned(), "line 3, column 14: `fleet_size` applies to `kind = \"redis\"` only"),
            ("[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nfleet_size = 0\n".to_owned(), "line 4, column 14: `fleet_size = 0`: give the number of limiterd processes"),
            ("".to_owned(), "no policies"),
            (policy("{ algorithm = \"leaky\", count = 1, period = \"1s\" }"), "line 3, column 17: `algorithm = \"leaky\"`"),
            (policy("{ algorithm = \"token_bucket\", count = 0, period = \"1s\" }"), "line 3, column 41: policy `p`: invalid limit: `count` is 0"),
            (policy("{ algorithm = \"token_bucket\", count = 5, period = \"1s\", burst = 0 }"), "line 3, column 67: policy `p`: invalid limit: `burst` is 0"),
            (policy("{ algorithm = \"token_bucket\", count = 1, period = \"1 sec\" }"), "line 3, column 53: `period = \"1 sec\"`: write a whole number with a unit"),
            (policy("{ algorithm = \"token_bucket\", count = -1, period = \"1s\" }"), "line 3, column 41: invalid value: integer `-1`, expected u64"),
            (policy("{ algorithm = \"fixed_window\", count = 10, period = \"1s\", burst = 20 }"), "line 3, column 3: policy `p`: invalid limit for the fixed window"),
            (policy("{ algorithm = \"token_bucket\", count = 1, period = \"1s\", key = \"ip\" }"), "line 3, column 65: `key = \"ip\"`: use \"identifier\""),
            ("[policies.\"bad name\"]\nlimits = []\n".to_owned(), "line 1, column 11: policy name \"bad name\""),
            ("[policies.p]\nlimits = []\n".to_owned(), "line 2, column 10: policy `p` has no limits"),
            ("[policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }]\non_failure = \"maybe\"\n".to_owned(), "line 3, column 14: `on_failure = \"maybe\"`"),
        ] {
            let got = error(&text);
            assert!(got.starts_with(want), "{text:?}\n got: {got}\nwant: {want}");
        }
    }

    #[test]
    fn too_many_limits_on_one_keying_are_refused() {
        let limit = "{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }";
        let text = format!("[policies.p]\nlimits = [\n{}\n]\n", [limit; 5].join(",\n"));
        assert!(error(&text).starts_with("line 7, column 1: policy `p` has more than 4 limits"));
    }

    #[test]
    fn periods_have_units() {
        assert_eq!(parse_period("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_period("2h"), Some(Duration::from_secs(7200)));
        for bad in [
            "",
            "s",
            "1",
            "1.5s",
            "1 s",
            "-1s",
            "99999999999999999999d",
            "1w",
        ] {
            assert_eq!(parse_period(bad), None, "{bad}");
        }
    }

    #[test]
    fn envoy_switches_come_from_the_table_or_the_references_environment() {
        let text = "[envoy]\nfiles = [\"a.yaml\"]\nresponse_headers = true\nlimit_header = \"X-RateLimit-Limit\"\nshadow_mode = false\n";
        let mut envoy = Config::parse(text).expect("valid").envoy.expect("envoy");
        let names = envoy.options.headers.clone().expect("enabled");
        assert_eq!(
            (names.limit.as_str(), names.remaining.as_str()),
            ("X-RateLimit-Limit", "RateLimit-Remaining")
        );
        let env = |name: &str| match name {
            "SHADOW_MODE" | "MERGE_DOMAIN_CONFIG" | "RESPONSE_DYNAMIC_METADATA" => {
                Some("true".to_owned())
            }
            "NEAR_LIMIT_RATIO" => Some("0.5".to_owned()),
            "LIMIT_LIMIT_HEADER" => Some("From-Env".to_owned()),
            _ => None,
        };
        envoy.apply_reference_env(env).expect("valid");
        // The file said shadow_mode and the header names; the environment fills in the rest.
        assert!(!envoy.options.shadow_mode);
        assert!(envoy.merge_domains && envoy.options.dynamic_metadata);
        assert!((envoy.options.near_limit_ratio - 0.5).abs() < f64::EPSILON);
        assert_eq!(
            envoy.options.headers.as_ref().map(|h| h.limit.as_str()),
            Some("X-RateLimit-Limit")
        );
        envoy.set_in_file = EnvoySwitches::default();
        let err = envoy
            .apply_reference_env(|n| (n == "NEAR_LIMIT_RATIO").then(|| "2".to_owned()))
            .expect_err("out of range");
        assert!(err.starts_with("NEAR_LIMIT_RATIO=\"2\""), "{err}");
        let err = Config::parse("[envoy]\nfiles = [\"a.yaml\"]\nresponse_headers = true\nreset_header = \"bad header\"\n")
            .expect_err("not a header name");
        assert!(err.to_string().contains("`reset_header`"), "{err}");
    }
}
