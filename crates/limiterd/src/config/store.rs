//! The `[store]` table: in memory (optionally bounded), or Redis (one server or a cluster's
//! seed nodes) with its timeout, failure policy and fleet size.

use std::time::Duration;

use limiter_redis::OnFailure;
use toml::Spanned;

use super::*;

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

pub(super) fn parse_store(
    source: &Source<'_>,
    store: &Spanned<RawStore>,
) -> Result<Store, ConfigError> {
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
