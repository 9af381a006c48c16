//! The Redis part of `[store]`: where Redis is (one server's `url`, a cluster's `cluster` seeds,
//! or `[store.sentinel]`), how to log in (`username`, and a password given, from an
//! environment variable or from a file), TLS (`[store.tls]`), each master's circuit breaker,
//! and replicas to wait for. Everything is checked when the file is read (files readable, PEM
//! that parses, the variable set), and no message ever holds a password.

use std::path::PathBuf;
use std::time::Duration;

use crate::store::{BreakerConfig, RedisUrl, Secret};
use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, Source};

/// Where a Redis store is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RedisAt {
    /// One server.
    Server(RedisUrl),
    /// A Redis Cluster, reached through any of these seed nodes: each policy's identifiers
    /// spread over every master.
    Cluster(Vec<RedisUrl>),
    /// The master Redis Sentinel names, followed through failovers.
    Sentinel(SentinelAt),
}

/// `[store.sentinel]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentinelAt {
    /// The master's name the sentinels monitor.
    pub master: String,
    /// The sentinels' URLs.
    pub sentinels: Vec<RedisUrl>,
    /// The sentinels' own login, if they need one.
    pub login: Login,
    /// The sentinels' own TLS settings (for `rediss://` sentinels), if not `[store.tls]`'s.
    pub tls: Option<TlsFiles>,
}

impl std::fmt::Display for RedisAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |urls: &[RedisUrl]| {
            urls.iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        match self {
            Self::Server(url) => write!(f, "{url}"),
            Self::Cluster(seeds) => write!(f, "cluster via {}", list(seeds)),
            Self::Sentinel(at) => write!(
                f,
                "sentinel master `{}` via {}",
                at.master,
                list(&at.sentinels)
            ),
        }
    }
}

/// A user and where its password comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Login {
    /// The ACL user (Redis's `default` if none).
    pub username: Option<String>,
    /// Where the password comes from, if there is one.
    pub password: Option<PasswordFrom>,
}

/// Where a password comes from. Its `Debug` never shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PasswordFrom {
    /// Written in the file (`password`).
    Inline(Secret),
    /// An environment variable (`password_env`), read when the file is.
    Env {
        /// The variable.
        name: String,
        /// Its value.
        value: Secret,
    },
    /// A file (`password_file`, a mounted Kubernetes secret), read at every connection.
    File(PathBuf),
}

impl PasswordFrom {
    /// Where it comes from, for an operator's eyes: never the password.
    pub fn describe(&self) -> String {
        match self {
            Self::Inline(_) => "written in the configuration file".to_owned(),
            Self::Env { name, .. } => format!("the environment variable {name}"),
            Self::File(path) => format!("the file {}", path.display()),
        }
    }
}

/// `[store.tls]`: files and the name to check.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA that signed Redis's certificate (the system's roots if none).
    pub ca_file: Option<PathBuf>,
    /// This client's certificate (mutual TLS).
    pub cert_file: Option<PathBuf>,
    /// This client's private key (mutual TLS).
    pub key_file: Option<PathBuf>,
    /// The name Redis's certificate must hold, if not the host it is reached at.
    pub server_name: Option<String>,
}

/// Replicas a write must reach before it is answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitFor {
    /// How many replicas.
    pub replicas: u32,
    /// How long to wait for them.
    pub timeout: Duration,
}

/// How limiterd connects to Redis: what a reload cannot change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConnection {
    /// Where.
    pub at: RedisAt,
    /// Each call's timeout.
    pub timeout: Duration,
    /// The data nodes' login.
    pub login: Login,
    /// TLS for the data nodes.
    pub tls: Option<TlsFiles>,
    /// Each master's circuit breaker.
    pub breaker: BreakerConfig,
    /// Replicas to wait for, if any.
    pub wait: Option<WaitFor>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTls {
    ca_file: Option<Spanned<String>>,
    cert_file: Option<Spanned<String>>,
    key_file: Option<Spanned<String>>,
    server_name: Option<Spanned<String>>,
}

/// A password field: any TOML value, so a type error never echoes it.
type RawSecret = Option<Spanned<toml::Value>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSentinel {
    master: Spanned<String>,
    sentinels: Spanned<Vec<Spanned<String>>>,
    username: Option<Spanned<String>>,
    password: RawSecret,
    password_env: Option<Spanned<String>>,
    password_file: Option<Spanned<String>>,
    tls: Option<Spanned<RawTls>>,
}

/// The Redis fields of `[store]`.
pub(super) struct RawRedis<'a> {
    pub(super) whole: &'a Spanned<super::RawStore>,
    pub(super) url: &'a Option<Spanned<String>>,
    pub(super) cluster: &'a Option<Spanned<Vec<Spanned<String>>>>,
    pub(super) sentinel: &'a Option<Spanned<RawSentinel>>,
    pub(super) timeout_ms: &'a Option<Spanned<u64>>,
    pub(super) username: &'a Option<Spanned<String>>,
    pub(super) password: &'a RawSecret,
    pub(super) password_env: &'a Option<Spanned<String>>,
    pub(super) password_file: &'a Option<Spanned<String>>,
    pub(super) tls: &'a Option<Spanned<RawTls>>,
    pub(super) breaker_failures: &'a Option<Spanned<u64>>,
    pub(super) breaker_open_ms: &'a Option<Spanned<u64>>,
    pub(super) wait_replicas: &'a Option<Spanned<u64>>,
    pub(super) wait_timeout_ms: &'a Option<Spanned<u64>>,
}

fn url(source: &Source<'_>, field: &str, text: &Spanned<String>) -> Result<RedisUrl, ConfigError> {
    RedisUrl::parse(text.get_ref()).map_err(|e| source.at(text, format!("`{field}`: {e}")))
}

/// Reads the Redis fields of `[store]`.
pub(super) fn parse_redis(
    source: &Source<'_>,
    raw: &RawRedis<'_>,
) -> Result<RedisConnection, ConfigError> {
    let at = match (raw.url, raw.cluster, raw.sentinel) {
        (Some(u), None, None) => RedisAt::Server(url(source, "url", u)?),
        (None, Some(cluster), None) => {
            if cluster.get_ref().is_empty() {
                return Err(source.at(
                    cluster,
                    "`cluster = []`: list at least one seed node, \"redis://host:port\"",
                ));
            }
            let seeds = cluster
                .get_ref()
                .iter()
                .map(|u| url(source, "cluster", u))
                .collect::<Result<Vec<_>, _>>()?;
            RedisAt::Cluster(seeds)
        }
        (None, None, Some(sentinel)) => RedisAt::Sentinel(parse_sentinel(source, sentinel)?),
        (None, None, None) => {
            return Err(source.at(
                raw.whole,
                "a redis store needs `url = \"redis://host:port\"` (one server), \
                 `cluster = [\"redis://host:port\", ...]` (a Redis Cluster's seed nodes) \
                 or a `[store.sentinel]` table (Redis Sentinel)",
            ));
        }
        _ => {
            let second = raw
                .cluster
                .as_ref()
                .map(Spanned::span)
                .or(raw.sentinel.as_ref().map(Spanned::span));
            return Err(source.error(
                second,
                "give one of `url` (one server), `cluster` (a Redis Cluster's seed nodes) or `[store.sentinel]`, not several",
            ));
        }
    };
    let timeout = match raw.timeout_ms {
        None => crate::store::DEFAULT_TIMEOUT,
        Some(ms) if (1..=60_000).contains(ms.get_ref()) => Duration::from_millis(*ms.get_ref()),
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
    let login = parse_login(
        source,
        "",
        raw.username,
        raw.password,
        raw.password_env,
        raw.password_file,
    )?;
    check_tls_scheme(source, raw, &at)?;
    let tls = match raw.tls {
        None => None,
        Some(tls) => Some(parse_tls(source, "store.tls", tls)?),
    };
    Ok(RedisConnection {
        at,
        timeout,
        login,
        tls,
        breaker: parse_breaker(source, raw)?,
        wait: parse_wait(source, raw, timeout)?,
    })
}

/// `rediss://` and `[store.tls]` go together for a server or a cluster.
fn check_tls_scheme(
    source: &Source<'_>,
    raw: &RawRedis<'_>,
    at: &RedisAt,
) -> Result<(), ConfigError> {
    let tls = raw.tls.as_ref();
    let urls: &[RedisUrl] = match at {
        RedisAt::Server(url) => std::slice::from_ref(url),
        RedisAt::Cluster(seeds) => seeds,
        RedisAt::Sentinel(_) => &[],
    };
    let plain = urls.iter().any(|u| !u.tls());
    if let (true, Some(span)) = (plain, tls.map(Spanned::span)) {
        return Err(source.error(
            Some(span),
            "`[store.tls]` is given but the URL says redis://; write rediss:// to connect with TLS (or remove the table)",
        ));
    }
    let any_tls = urls.iter().any(RedisUrl::tls) || tls.is_some();
    if any_tls && !cfg!(feature = "tls") {
        return Err(source.at(
            raw.whole,
            "this limiterd was built without TLS (the `tls` feature, on by default): rebuild with it to use rediss://",
        ));
    }
    Ok(())
}

fn parse_sentinel(
    source: &Source<'_>,
    raw: &Spanned<RawSentinel>,
) -> Result<SentinelAt, ConfigError> {
    let sentinel = raw.get_ref();
    if sentinel.master.get_ref().trim().is_empty() {
        return Err(source.at(
            &sentinel.master,
            "`master` names the master the sentinels monitor (`sentinel monitor NAME ...`)",
        ));
    }
    if sentinel.sentinels.get_ref().is_empty() {
        return Err(source.at(
            &sentinel.sentinels,
            "`sentinels = []`: list at least one sentinel, \"redis://host:26379\"",
        ));
    }
    let sentinels = sentinel
        .sentinels
        .get_ref()
        .iter()
        .map(|u| url(source, "sentinels", u))
        .collect::<Result<Vec<_>, _>>()?;
    let login = parse_login(
        source,
        "sentinel.",
        &sentinel.username,
        &sentinel.password,
        &sentinel.password_env,
        &sentinel.password_file,
    )?;
    let tls = match &sentinel.tls {
        None => None,
        Some(tls) => Some(parse_tls(source, "store.sentinel.tls", tls)?),
    };
    Ok(SentinelAt {
        master: sentinel.master.get_ref().clone(),
        sentinels,
        login,
        tls,
    })
}

fn parse_login(
    source: &Source<'_>,
    prefix: &str,
    username: &Option<Spanned<String>>,
    password: &RawSecret,
    password_env: &Option<Spanned<String>>,
    password_file: &Option<Spanned<String>>,
) -> Result<Login, ConfigError> {
    let given: Vec<_> = [
        password.as_ref().map(|p| ("password", p.span())),
        password_env.as_ref().map(|p| ("password_env", p.span())),
        password_file.as_ref().map(|p| ("password_file", p.span())),
    ]
    .into_iter()
    .flatten()
    .collect();
    if let [(first, _), (second, span), ..] = given.as_slice() {
        return Err(source.error(
            Some(span.clone()),
            format!("give one of `{prefix}{first}` and `{prefix}{second}`, not both"),
        ));
    }
    let password = if let Some(value) = password {
        match value.get_ref() {
            toml::Value::String(text) if !text.is_empty() => {
                Some(PasswordFrom::Inline(Secret::new(text.clone())))
            }
            _ => {
                return Err(source.at(
                    value,
                    format!("`{prefix}password` must be a non-empty string (better: `{prefix}password_file` or `{prefix}password_env`, which keep it out of this file)"),
                ));
            }
        }
    } else if let Some(name) = password_env {
        let value = Secret::from_env(name.get_ref())
            .map_err(|e| source.at(name, format!("`{prefix}password_env`: {e}")))?;
        Some(PasswordFrom::Env {
            name: name.get_ref().clone(),
            value,
        })
    } else if let Some(file) = password_file {
        let path = source.path(file.get_ref());
        Secret::from_file(&path)
            .map_err(|e| source.at(file, format!("`{prefix}password_file`: {e}")))?;
        Some(PasswordFrom::File(path))
    } else {
        None
    };
    Ok(Login {
        username: username.as_ref().map(|u| u.get_ref().clone()),
        password,
    })
}

fn parse_tls(
    source: &Source<'_>,
    table: &str,
    raw: &Spanned<RawTls>,
) -> Result<TlsFiles, ConfigError> {
    let tls = raw.get_ref();
    let path = |field: &Option<Spanned<String>>| field.as_ref().map(|f| source.path(f.get_ref()));
    let files = TlsFiles {
        ca_file: path(&tls.ca_file),
        cert_file: path(&tls.cert_file),
        key_file: path(&tls.key_file),
        server_name: tls.server_name.as_ref().map(|n| n.get_ref().clone()),
    };
    match (&tls.cert_file, &tls.key_file) {
        (Some(cert), None) => {
            return Err(source.at(
                cert,
                format!("`[{table}] cert_file` needs `key_file` (its private key) for mutual TLS"),
            ));
        }
        (None, Some(key)) => {
            return Err(source.at(
                key,
                format!("`[{table}] key_file` needs `cert_file` (its certificate) for mutual TLS"),
            ));
        }
        _ => {}
    }
    #[cfg(feature = "tls")]
    files
        .options()
        .and_then(|options| options.check())
        .map_err(|e| source.at(raw, format!("`[{table}]`: {e}")))?;
    Ok(files)
}

fn parse_breaker(source: &Source<'_>, raw: &RawRedis<'_>) -> Result<BreakerConfig, ConfigError> {
    let mut breaker = BreakerConfig::default();
    if let Some(n) = raw.breaker_failures {
        breaker.failures_to_open = u32::try_from(*n.get_ref())
            .ok()
            .filter(|n| *n <= 1_000)
            .ok_or_else(|| {
                source.at(
                    n,
                    "`breaker_failures`: outages in a row that open a master's breaker, 0 (never) to 1000",
                )
            })?;
    }
    if let Some(ms) = raw.breaker_open_ms {
        if !(1..=600_000).contains(ms.get_ref()) {
            return Err(source.at(
                ms,
                "`breaker_open_ms`: how long an open breaker waits before it probes, 1 to 600000",
            ));
        }
        breaker.open_for = Duration::from_millis(*ms.get_ref());
    }
    Ok(breaker)
}

fn parse_wait(
    source: &Source<'_>,
    raw: &RawRedis<'_>,
    timeout: Duration,
) -> Result<Option<WaitFor>, ConfigError> {
    let Some(replicas) = raw.wait_replicas else {
        if let Some(ms) = raw.wait_timeout_ms {
            return Err(source.at(ms, "`wait_timeout_ms` applies with `wait_replicas` only"));
        }
        return Ok(None);
    };
    let count = u32::try_from(*replicas.get_ref())
        .ok()
        .filter(|n| (1..=16).contains(n))
        .ok_or_else(|| {
            source.at(
                replicas,
                "`wait_replicas`: replicas that must acknowledge each write, 1 to 16",
            )
        })?;
    let limit = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
    let wait = match raw.wait_timeout_ms {
        None => (limit / 2).max(1),
        Some(ms) if *ms.get_ref() >= 1 && *ms.get_ref() < limit => *ms.get_ref(),
        Some(ms) => {
            return Err(source.at(
                ms,
                format!(
                    "`wait_timeout_ms = {}`: wait less than the call timeout (`timeout_ms = {limit}`), at least 1",
                    ms.get_ref()
                ),
            ));
        }
    };
    if limit < 2 {
        return Err(source.at(
            replicas,
            "`wait_replicas` needs `timeout_ms` of at least 2, to wait less than the call",
        ));
    }
    Ok(Some(WaitFor {
        replicas: count,
        timeout: Duration::from_millis(wait),
    }))
}
