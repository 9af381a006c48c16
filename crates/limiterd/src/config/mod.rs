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
//! # url = "redis://127.0.0.1:6379"  # rediss:// for TLS
//! # cluster = ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"]  # a Redis Cluster's seeds
//! #                            # (instead of `url`): identifiers spread over every master
//! # username = "limiterd"      # an ACL user; its password from `password`, `password_env`
//! # password_file = "redis-password"  # or a file read at each connection (never printed)
//! # breaker_failures = 5       # outages in a row that open a master's breaker, for
//! # breaker_open_ms = 1000     # this long
//! # wait_replicas = 1          # answer once a replica has the writes (WAIT), within
//! # wait_timeout_ms = 12       # this (half of timeout_ms by default)
//! # timeout_ms = 25
//! # on_failure = "fallback"    # "open", "closed" or "fallback"
//! # fleet_size = 1             # processes sharing this Redis: while it is out, each
//! #                            # falls back to its share (1/fleet_size) of every limit
//!
//! # [store.tls]                # TLS files: ca_file, cert_file + key_file, server_name
//! # [store.sentinel]           # Sentinel instead of url/cluster: master, sentinels, and
//! #                            # their own username, password*, [store.sentinel.tls]
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
//!
//! Its parts: `envoy.rs` (the `[envoy]` table), `store_section.rs` (`[store]`: memory or Redis),
//! `redis_store.rs` (`[store]`'s Redis settings), `redis_builder.rs` (from them to a backend,
//! and `--redis`), `policy.rs` (`[policies.*]`: limits, periods, leases).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use crate::store::OnFailure;
use serde::Deserialize;
use toml::Spanned;

mod auth;
mod envoy;
pub mod keys;
mod policy;
mod redis_builder;
mod redis_store;
mod store_section;

pub use crate::store::Keying;
pub use crate::store::permits::ConcurrencyLimit;
pub use auth::AuthSettings;
use auth::{RawAuth, parse_auth};
use envoy::parse_envoy;
pub use limiter_core::text::parse_period;
pub use limiter_envoy::settings::{
    DEFAULT_GRPC_LISTEN, EnvoySettings, EnvoySwitches, HeaderNames, Options,
};
use policy::parse_policy;
pub use policy::{
    CalendarSpec, CheckedLimit, DEFAULT_PERMIT_TTL, MAX_PERMIT_TTL, Policy, PolicyLimit,
};
pub use redis_store::{
    Login, PasswordFrom, RedisAt, RedisConnection, SentinelAt, TlsFiles, WaitFor,
};
use store_section::parse_store;
pub use store_section::{Store, StoreKind};

/// The policies limiterd serves when started without a file: per-identifier API limits, a
/// login limit, and a global cap.
pub const BUILT_IN: &str = r#"# limiterd's built-in policies (used when no --config is given).
listen = "127.0.0.1:8080"

[store]
kind = "memory"
# To share limits with a fleet, on Redis (docs/operations.md's "Connecting to your Redis" has TLS,
# ACL users, Sentinel and clusters):
# kind = "redis"
# url = "redis://127.0.0.1:6379"     # or rediss:// for TLS, with [store.tls] ca_file = "..."
# username = "limiterd"
# password_file = "redis-password"   # or password_env = "REDIS_PASSWORD"; never printed

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

# At most 2 exports running per identifier, and 10 started per hour. An admitted call's answer
# carries a "permit": release it with POST /v1/ratelimit/release when the export ends (an
# unreleased permit expires after ttl).
[policies.exports]
limits = [
  { algorithm = "concurrency", count = 2, ttl = "5m" },
  { algorithm = "fixed_window", count = 10, period = "1h" },
]

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
    /// The keys limiterd accepts, and whether the native API needs one (`[auth]`).
    pub auth: AuthSettings,
    /// unkey's overrides (`[overrides]`).
    pub overrides: OverrideSettings,
}

/// The most overrides one namespace holds unless `[overrides] max_per_namespace` says.
pub const DEFAULT_MAX_OVERRIDES: usize = 10_000;

/// The `[overrides]` table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OverrideSettings {
    /// `max_per_namespace`: the most overrides one namespace holds (10,000); a new one past it
    /// is refused, naming this setting.
    pub max_per_namespace: usize,
}

impl Default for OverrideSettings {
    fn default() -> Self {
        Self {
            max_per_namespace: DEFAULT_MAX_OVERRIDES,
        }
    }
}

impl Config {
    /// Whether the native API needs a key: as `[auth]` says, else exactly when `listen` is not
    /// a loopback address and keys exist (without keys it cannot, and limiterd warns).
    pub fn protects_native(&self, has_keys: bool) -> bool {
        has_keys
            && self
                .auth
                .protect_native
                .unwrap_or(!self.listen.ip().is_loopback())
    }
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
    auth: Option<Spanned<RawAuth>>,
    overrides: Option<Spanned<RawOverrides>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOverrides {
    max_per_namespace: Spanned<u64>,
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
    sentinel: Option<Spanned<redis_store::RawSentinel>>,
    timeout_ms: Option<Spanned<u64>>,
    on_failure: Option<Spanned<String>>,
    fleet_size: Option<Spanned<u64>>,
    username: Option<Spanned<String>>,
    password: Option<Spanned<toml::Value>>,
    password_env: Option<Spanned<String>>,
    password_file: Option<Spanned<String>>,
    tls: Option<Spanned<redis_store::RawTls>>,
    breaker_failures: Option<Spanned<u64>>,
    breaker_open_ms: Option<Spanned<u64>>,
    wait_replicas: Option<Spanned<u64>>,
    wait_timeout_ms: Option<Spanned<u64>>,
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
    period: Option<Spanned<String>>,
    burst: Option<Spanned<u64>>,
    key: Option<Spanned<String>>,
    ttl: Option<Spanned<String>>,
    calendar: Option<Spanned<String>>,
}

/// Turns byte offsets into lines and columns, and relative paths into paths beside the file.
struct Source<'a>(&'a str, Option<&'a std::path::Path>);

impl Source<'_> {
    /// `path` as written, relative to the configuration file's directory when it is relative.
    fn path(&self, path: &str) -> std::path::PathBuf {
        let path = std::path::Path::new(path);
        match self.1 {
            Some(dir) if path.is_relative() => dir.join(path),
            _ => path.to_owned(),
        }
    }
}

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
    /// Parses and checks `text` (relative file names relative to the working directory).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        Self::parse_in(text, None)
    }

    /// Parses and checks `text`, read from a file in `dir`: relative file names in it (TLS
    /// and password files) are relative to `dir`.
    pub fn parse_in(text: &str, dir: Option<&std::path::Path>) -> Result<Self, ConfigError> {
        let source = Source(text, dir);
        // A table wherever a struct is read: serde alone would read an array by position
        // (`limits = [["token_bucket", 10, "1s", ...]]`), a shape the file format never has.
        let raw: RawConfig = toml::de::Deserializer::parse(text)
            .and_then(|toml| limiter_input::deserialize(toml, "a table"))
            .map_err(|e| {
                let message = limiter_input::in_plain_words(e.message().trim_end(), "a table");
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
        let auth = match &raw.auth {
            None => AuthSettings::default(),
            Some(auth) => parse_auth(&source, auth.get_ref())?,
        };
        let overrides = match &raw.overrides {
            None => OverrideSettings::default(),
            Some(o) => {
                let max = &o.get_ref().max_per_namespace;
                if *max.get_ref() == 0 {
                    return Err(source.at(max, "`max_per_namespace` must be at least 1"));
                }
                OverrideSettings {
                    max_per_namespace: usize::try_from(*max.get_ref()).unwrap_or(usize::MAX),
                }
            }
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
            auth,
            overrides,
        })
    }
}

impl Config {
    /// The same policies on the Redis `--redis` names ([`RedisAt::from_flag`]: one server, a
    /// cluster or Sentinel): the file's other Redis settings (login, TLS, timeout, failure
    /// policy) if it had a Redis store, else the defaults. Refused if a limit cannot be
    /// decided exactly on Redis.
    pub fn with_redis(mut self, flag: &str) -> Result<Self, ConfigError> {
        let plain = |message: String| ConfigError {
            line: None,
            column: None,
            message,
        };
        let at = RedisAt::from_flag(flag).map_err(plain)?;
        let (connection, on_failure, fleet_size) = match self.store {
            Store::Redis {
                connection,
                on_failure,
                fleet_size,
            } => (connection, on_failure, fleet_size),
            Store::Memory { .. } => (
                Box::new(RedisConnection::new(at.clone())),
                OnFailure::default(),
                1,
            ),
        };
        let connection = Box::new(connection.at(at).map_err(plain)?);
        for (name, policy) in &mut self.policies {
            for l in &mut policy.limits {
                l.limit = l
                    .limit
                    .on_store(StoreKind::Redis)
                    .map_err(|e| plain(format!("policy `{name}` cannot run on Redis: {e}")))?;
            }
        }
        self.store = Store::Redis {
            connection,
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

#[cfg(test)]
mod tests;
