//! limiterd's store room: everything the service keeps in a store, and the one door to its
//! store crate. Every type and function the service takes from limiter-redis is named here
//! (the re-exports below), and nowhere else in limiterd (`cargo xtask lint`), so what the
//! service depends on of its store (connections and their settings, failure policies, leases,
//! limits checked for Redis, stacks and batches, permits, quotas, the overrides' records,
//! health) is one list to read. A second store would add its own here.
//!
//! - [`permits`]: policies' concurrency limits, a permit per admitted call, in memory or on
//!   Redis (with a falling-back policy's stand-in).
//! - [`quotas`]: policies' calendar quotas on Redis, kept beside their stacks (with a
//!   falling-back policy's stand-in).
//! - [`overrides`]: where unkey's overrides are kept: this process's memory, a file, or
//!   Redis records every instance shares.
//! - [`Keying`]: how a limit is keyed (per identifier, or one global key), which every store
//!   names its keys by.
//!
//! The room depends on no other module of limiterd: the configuration and the stacks build
//! on it.

pub mod overrides;
pub mod permits;
pub mod quotas;

pub use limiter_redis::{
    Acquired, BackendBuilder, BackendError, BreakerConfig, DEFAULT_TIMEOUT, LEASE_TTL_RANGE, Lease,
    LeasedStack, MAX_PERMIT_TTL, MAX_PERMITS, OnFailure, QuotaAnswer, RedisBackend, RedisLimit,
    RedisPermits, RedisQuota, RedisRecords, RedisStack, RedisUrl, Secret, Since, Slack,
    StoreHealth, decide_batch, slot_ranges,
};
#[cfg(feature = "tls")]
pub use limiter_redis::{TlsError, TlsOptions};

/// The first part of every Redis key limiterd writes (stacks, leases, permits, quotas, the
/// overrides), so an operator's ACL rule names one key pattern: `~limiterd:*`.
pub const KEY_PREFIX: &str = "limiterd";

/// How a limit is keyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Keying {
    /// A state per identifier.
    Identifier,
    /// One state for every identifier.
    Global,
}

impl Keying {
    /// The name of the layer a policy's limits of this keying make (in metrics, headers and
    /// Redis keys).
    pub fn layer_name(self) -> &'static str {
        match self {
            Self::Identifier => "identifier",
            Self::Global => "global",
        }
    }
}
