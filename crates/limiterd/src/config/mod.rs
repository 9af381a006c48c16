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
//!
//! Its parts: `envoy.rs` (the `[envoy]` table), `store.rs` (`[store]`: memory or Redis),
//! `policy.rs` (`[policies.*]`: limits, periods, leases).

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::ops::Range;
use std::time::Duration;

use limiter_redis::OnFailure;
use serde::Deserialize;
use toml::Spanned;

mod envoy;
mod policy;
mod store;

use envoy::parse_envoy;
pub use envoy::{DEFAULT_GRPC_LISTEN, EnvoySettings, EnvoySwitches, HeaderNames, Options};
pub(crate) use policy::parse_percent;
use policy::parse_policy;
pub use policy::{CheckedLimit, Keying, Policy, PolicyLimit, parse_period};
use store::parse_store;
pub use store::{RedisAt, Store, StoreKind};

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
mod tests {
    use limiter_redis::{Kind, Lease, Slack};

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
