//! The `[store]` table: in memory (optionally bounded), or Redis (`redis_store.rs`: one server, a
//! cluster's seed nodes or Sentinel, with its login, TLS, breaker and timeout) with a failure
//! policy and fleet size.

use crate::store::OnFailure;
use toml::Spanned;

use super::redis_store::{RawRedis, RedisConnection, parse_redis};
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
        /// How to reach it (a reload cannot change it).
        connection: Box<RedisConnection>,
        /// What a policy does when Redis fails, unless it says otherwise.
        on_failure: OnFailure,
        /// How many limiterd processes share the policies: while Redis is out, each one's
        /// fallback enforces its share (`1/fleet_size`) of every limit.
        fleet_size: u64,
    },
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
        "memory" => parse_memory(source, raw),
        "redis" => parse_redis_store(source, store),
        other => Err(source.at(
            &raw.kind,
            format!("store `kind = {other:?}`: use \"memory\" or \"redis\""),
        )),
    }
}

/// `kind = "memory"`: `max_keys`, and no Redis field.
fn parse_memory(source: &Source<'_>, raw: &RawStore) -> Result<Store, ConfigError> {
    let max_keys = match &raw.max_keys {
        None => None,
        Some(n) if (1..=1_000_000_000).contains(n.get_ref()) => usize::try_from(*n.get_ref()).ok(),
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
        (raw.sentinel.as_ref().map(Spanned::span), "sentinel"),
        (raw.timeout_ms.as_ref().map(Spanned::span), "timeout_ms"),
        (raw.on_failure.as_ref().map(Spanned::span), "on_failure"),
        (raw.fleet_size.as_ref().map(Spanned::span), "fleet_size"),
        (raw.username.as_ref().map(Spanned::span), "username"),
        (raw.password.as_ref().map(Spanned::span), "password"),
        (raw.password_env.as_ref().map(Spanned::span), "password_env"),
        (
            raw.password_file.as_ref().map(Spanned::span),
            "password_file",
        ),
        (raw.tls.as_ref().map(Spanned::span), "tls"),
        (
            raw.breaker_failures.as_ref().map(Spanned::span),
            "breaker_failures",
        ),
        (
            raw.breaker_open_ms.as_ref().map(Spanned::span),
            "breaker_open_ms",
        ),
        (
            raw.wait_replicas.as_ref().map(Spanned::span),
            "wait_replicas",
        ),
        (
            raw.wait_timeout_ms.as_ref().map(Spanned::span),
            "wait_timeout_ms",
        ),
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

/// `kind = "redis"`: the connection, the failure policy and `fleet_size`; no `max_keys`.
fn parse_redis_store(source: &Source<'_>, store: &Spanned<RawStore>) -> Result<Store, ConfigError> {
    let raw = store.get_ref();
    if let Some(n) = &raw.max_keys {
        return Err(source.at(
            n,
            "`max_keys` applies to `kind = \"memory\"`: Redis keys expire on their own",
        ));
    }
    let connection = parse_redis(
        source,
        &RawRedis {
            whole: store,
            url: &raw.url,
            cluster: &raw.cluster,
            sentinel: &raw.sentinel,
            timeout_ms: &raw.timeout_ms,
            username: &raw.username,
            password: &raw.password,
            password_env: &raw.password_env,
            password_file: &raw.password_file,
            tls: &raw.tls,
            breaker_failures: &raw.breaker_failures,
            breaker_open_ms: &raw.breaker_open_ms,
            wait_replicas: &raw.wait_replicas,
            wait_timeout_ms: &raw.wait_timeout_ms,
        },
    )?;
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
        connection: Box::new(connection),
        on_failure,
        fleet_size,
    })
}
