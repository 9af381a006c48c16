//! Policies' concurrency limits (`algorithm = "concurrency"`): a permit per admitted call, held
//! until the caller releases it (`POST /v1/ratelimit/release`) or its time to live passes, at
//! most `count` at once per identifier (or in all, for a global limit). In memory a permit is
//! an entry in this process's table; on Redis it is a member of the key's sorted set, so a
//! fleet shares the count ([`super::RedisPermits`]), and a policy that falls back
//! (`on_failure = "fallback"`) keeps a table in this process that stands in while Redis fails,
//! with this node's share of the count (`count / fleet_size`, so the fleet never holds more
//! than `count`; a share of 0 refuses). Either way a caller that never releases (it crashed,
//! it forgot) loses its permit after the time to live.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use limiter_core::Clock;

use super::{Acquired, Keying, OnFailure, RedisBackend, RedisPermits};

/// One shard of a permit table: per key, each held permit's number and expiry (a reading).
type Shard = HashMap<String, Vec<(u64, u64)>>;

/// Shards of an in-memory permit table: calls on different identifiers rarely share a lock.
const SHARDS: usize = 16;

/// A policy's concurrency limit (`algorithm = "concurrency"`): at most `count` permits held
/// at once per identifier (or in all, `key = "global"`), each released by the caller or
/// expiring `ttl` after it was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConcurrencyLimit {
    /// The most permits held at once.
    pub count: u64,
    /// How long a permit lives unless released.
    pub ttl: std::time::Duration,
    /// Per identifier or global.
    pub keying: Keying,
}

/// What an acquire answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Taken {
    /// A permit was taken: its id, and the permits held with it.
    Held {
        /// The permit's id, to release it.
        id: String,
        /// Permits the key holds now, this one included.
        held: u64,
    },
    /// Every permit is held; nothing was taken.
    Busy {
        /// Permits held.
        held: u64,
        /// Until the first held permit expires, in nanoseconds (a release may come sooner).
        retry_after_ns: u64,
    },
}

/// The permits' store failed: why, and whether the policy refuses then (`on_failure =
/// "closed"`; open admits without a permit; fallback takes one from its table instead).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PermitFailure {
    /// What failed.
    pub message: String,
    /// Whether the policy refuses while its store fails.
    pub closed: bool,
}

/// A policy's permits on its store.
#[derive(Clone, Debug)]
pub struct PolicyPermits {
    limit: ConcurrencyLimit,
    store: Store,
    on_failure: OnFailure,
}

#[derive(Clone, Debug)]
enum Store {
    Memory(Arc<MemoryPermits>),
    /// The fleet's permits, and the table standing in while Redis fails (a falling-back
    /// policy's).
    Redis(RedisPermits, Option<Fallback>),
}

/// The permits a falling-back policy hands out in this process while Redis fails: its table,
/// and its limit with this node's share of the count.
#[derive(Clone, Debug)]
struct Fallback {
    table: Arc<MemoryPermits>,
    limit: ConcurrencyLimit,
}

/// What starts the id of a permit the fallback table handed out, so its release goes there.
const LOCAL: &str = "local-";

impl Fallback {
    fn acquire(&self, key: &str) -> Taken {
        match self.table.acquire(key, self.limit) {
            Taken::Held { id, held } => Taken::Held {
                id: format!("{LOCAL}{id}"),
                held,
            },
            busy => busy,
        }
    }
}

impl PolicyPermits {
    /// `limit`'s permits in this process's `table`.
    pub(crate) fn memory(limit: ConcurrencyLimit, table: Arc<MemoryPermits>) -> Self {
        Self {
            limit,
            store: Store::Memory(table),
            on_failure: OnFailure::default(),
        }
    }

    /// `limit`'s permits on Redis, under `name` (part of each key); with `fallback` (given to a
    /// falling-back policy) standing in while Redis fails, holding `count / fleet` per key.
    pub(crate) fn redis(
        limit: ConcurrencyLimit,
        backend: &RedisBackend,
        name: &str,
        on_failure: OnFailure,
        fallback: Option<(Arc<MemoryPermits>, u64)>,
    ) -> Result<Self, limiter_stack::BuildError> {
        let permits = backend
            .permits(name, limit.count, limit.ttl)?
            .with_prefix(super::KEY_PREFIX)?;
        let fallback = fallback.map(|(table, fleet)| Fallback {
            table,
            limit: ConcurrencyLimit {
                count: limit.count / fleet.max(1),
                ..limit
            },
        });
        Ok(Self {
            limit,
            store: Store::Redis(permits, fallback),
            on_failure,
        })
    }

    fn failed(&self, error: &super::BackendError) -> PermitFailure {
        PermitFailure {
            message: error.to_string(),
            closed: self.on_failure == OnFailure::Closed,
        }
    }

    /// The limit.
    pub fn limit(&self) -> ConcurrencyLimit {
        self.limit
    }

    /// Whether the permits are on Redis (else in this process).
    pub fn on_redis(&self) -> bool {
        matches!(self.store, Store::Redis(..))
    }

    fn key<'a>(&self, identifier: &'a str) -> &'a str {
        match self.limit.keying {
            Keying::Identifier => identifier,
            Keying::Global => "",
        }
    }

    /// Takes a permit for `identifier` if fewer than `count` are held: what was taken, and
    /// the Redis failure the fallback table answered for (`None`: the store answered). A
    /// store that fails otherwise answers its error (the policy's failure policy decides).
    pub async fn acquire(
        &self,
        identifier: &str,
    ) -> Result<(Taken, Option<String>), PermitFailure> {
        let key = self.key(identifier);
        match &self.store {
            Store::Memory(table) => Ok((table.acquire(key, self.limit), None)),
            Store::Redis(permits, fallback) => match permits.acquire(key).await {
                Ok(Acquired::Held(permit)) => Ok((
                    Taken::Held {
                        id: permit.id().to_owned(),
                        held: permit.held(),
                    },
                    None,
                )),
                Ok(Acquired::Busy {
                    held, retry_after, ..
                }) => Ok((
                    Taken::Busy {
                        held,
                        retry_after_ns: u64::try_from(retry_after.as_nanos()).unwrap_or(u64::MAX),
                    },
                    None,
                )),
                Err(e) => match fallback {
                    Some(fallback) => Ok((fallback.acquire(key), Some(e.to_string()))),
                    None => Err(self.failed(&e)),
                },
            },
        }
    }

    /// Releases `identifier`'s permit `id`: whether it was held (false once it expired or was
    /// released already).
    pub async fn release(&self, identifier: &str, id: &str) -> Result<bool, String> {
        let key = self.key(identifier);
        match &self.store {
            Store::Memory(table) => Ok(table.release(key, id)),
            Store::Redis(permits, fallback) => match (fallback, id.strip_prefix(LOCAL)) {
                (Some(fallback), Some(local)) => Ok(fallback.table.release(key, local)),
                _ => permits.release(key, id).await.map_err(|e| e.to_string()),
            },
        }
    }

    /// Permits `identifier` holds now, and the Redis failure a falling-back policy's table
    /// answered for (while Redis fails it answers what this node holds; a store that fails
    /// otherwise answers its error).
    pub async fn held(&self, identifier: &str) -> Result<(u64, Option<String>), PermitFailure> {
        let key = self.key(identifier);
        match &self.store {
            Store::Memory(table) => Ok((table.held(key), None)),
            Store::Redis(permits, fallback) => match permits.held(key).await {
                Ok(held) => Ok((held, None)),
                Err(e) => match fallback {
                    Some(fallback) => Ok((fallback.table.held(key), Some(e.to_string()))),
                    None => Err(self.failed(&e)),
                },
            },
        }
    }

    /// Every permit held now: in this process's table, or on Redis the fleet's (every
    /// process's, from the name's index); on Redis, its error when it does not answer or the
    /// index is not one limiterd wrote (naming the key). The metrics' gauge.
    pub async fn held_total(&self) -> Result<u64, String> {
        match &self.store {
            Store::Memory(table) => Ok(table.total()),
            Store::Redis(permits, _) => permits.held_total().await.map_err(|e| e.to_string()),
        }
    }
}

/// Drops the keys of `shard` whose permits all expired by `now`, when the shard has grown to a
/// power of two of at least 1,024 keys: keys whose callers never released are forgotten, at an
/// amortised constant cost per new key.
fn sweep_if_due(shard: &mut Shard, now: u64) {
    let keys = shard.len();
    if keys >= 1_024 && keys.is_power_of_two() {
        shard.retain(|_, held| held.iter().any(|&(_, expiry)| expiry > now));
    }
}

/// One policy's permits in this process: per key, each held permit's id and expiry (a clock
/// reading), expired ones dropped whenever the key is touched, a key dropped once it holds
/// none.
pub struct MemoryPermits {
    shards: Box<[Mutex<Shard>]>,
    clock: Arc<dyn Clock>,
    next_id: AtomicU64,
    /// Mixed into ids so they are not the count of permits taken.
    salt: u64,
}

impl std::fmt::Debug for MemoryPermits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryPermits").finish_non_exhaustive()
    }
}

impl MemoryPermits {
    /// An empty table on `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        use std::hash::{BuildHasher, Hasher};
        let mut seed = std::collections::hash_map::RandomState::new().build_hasher();
        seed.write_usize(SHARDS);
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            clock,
            next_id: AtomicU64::new(1),
            salt: seed.finish(),
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, Shard> {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher =
            std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
                .build_hasher();
        hasher.write(key.as_bytes());
        let index = usize::try_from(hasher.finish() % SHARDS as u64).unwrap_or(0);
        // A poisoned shard holds whole entries only: every write is one push or retain.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn acquire(&self, key: &str, limit: ConcurrencyLimit) -> Taken {
        let now = self.clock.now();
        let ttl = u64::try_from(limit.ttl.as_nanos()).unwrap_or(u64::MAX);
        let mut shard = self.shard(key);
        if !shard.contains_key(key) {
            sweep_if_due(&mut shard, now);
        }
        let held = shard.entry(key.to_owned()).or_default();
        held.retain(|&(_, expiry)| expiry > now);
        let count = u64::try_from(held.len()).unwrap_or(u64::MAX);
        if count >= limit.count {
            let first = held.iter().map(|&(_, expiry)| expiry).min().unwrap_or(now);
            return Taken::Busy {
                held: count,
                retry_after_ns: first.saturating_sub(now).max(1),
            };
        }
        // Relaxed: a counter made unique, never ordered against anything.
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        held.push((n, now.saturating_add(ttl)));
        Taken::Held {
            id: format!("{:016x}{n:x}", self.salt ^ n.rotate_left(32)),
            held: count + 1,
        }
    }

    fn release(&self, key: &str, id: &str) -> bool {
        let Some(n) = self.number_of(id) else {
            return false;
        };
        let now = self.clock.now();
        let mut shard = self.shard(key);
        let Some(held) = shard.get_mut(key) else {
            return false;
        };
        held.retain(|&(_, expiry)| expiry > now);
        let before = held.len();
        held.retain(|&(m, _)| m != n);
        let released = held.len() < before;
        if held.is_empty() {
            shard.remove(key);
        }
        released
    }

    fn held(&self, key: &str) -> u64 {
        let now = self.clock.now();
        let shard = self.shard(key);
        shard.get(key).map_or(0, |held| {
            let live = held.iter().filter(|&&(_, expiry)| expiry > now).count();
            u64::try_from(live).unwrap_or(u64::MAX)
        })
    }

    fn total(&self) -> u64 {
        let now = self.clock.now();
        self.shards
            .iter()
            .map(|shard| {
                let shard = shard.lock().unwrap_or_else(PoisonError::into_inner);
                let live = shard
                    .values()
                    .flatten()
                    .filter(|&&(_, expiry)| expiry > now)
                    .count();
                u64::try_from(live).unwrap_or(u64::MAX)
            })
            .sum()
    }

    /// The number an id was made from, if it is one of this table's.
    fn number_of(&self, id: &str) -> Option<u64> {
        let (salted, n) = id.split_at_checked(16)?;
        let salted = u64::from_str_radix(salted, 16).ok()?;
        let n = u64::from_str_radix(n, 16).ok()?;
        (salted == self.salt ^ n.rotate_left(32)).then_some(n)
    }
}
