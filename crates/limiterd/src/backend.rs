//! limiterd's one door to its store crate: every type and function the service takes from
//! limiter-redis is named here, and nowhere else in limiterd (`cargo xtask lint`), so what the
//! service depends on of its store (connections and their settings, failure policies, leases,
//! limits checked for Redis, stacks and batches, permits, the overrides' records, health) is
//! one list to read. A second store would add its own here.

pub use limiter_redis::{
    Acquired, BackendBuilder, BackendError, BreakerConfig, DEFAULT_TIMEOUT, LEASE_TTL_RANGE, Lease,
    LeasedStack, MAX_PERMIT_TTL, MAX_PERMITS, OnFailure, QuotaAnswer, RedisBackend, RedisLimit,
    RedisPermits, RedisQuota, RedisRecords, RedisStack, RedisUrl, Secret, Slack, StoreHealth,
    decide_batch, slot_ranges,
};
#[cfg(feature = "tls")]
pub use limiter_redis::{TlsError, TlsOptions};

/// The first part of every Redis key limiterd writes (stacks, leases, permits, quotas, the
/// overrides), so an operator's ACL rule names one key pattern: `~limiterd:*`.
pub const KEY_PREFIX: &str = "limiterd";

/// unkey's overrides on Redis: the records `overrides` under limiterd's prefix
/// (`limiterd:{records:overrides}:…`, where they have always been).
pub fn overrides_records(backend: &RedisBackend) -> Result<RedisRecords, String> {
    backend
        .records("overrides")
        .and_then(|records| records.with_prefix(KEY_PREFIX))
        .map_err(|e| e.to_string())
}
