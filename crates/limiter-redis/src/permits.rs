//! [`RedisPermits`]: at most `count` permits held per key across a fleet, each with an expiry.
//! A key's permits are one sorted set (each permit's id scored by when it expires, by Redis's
//! clock); one script call takes, releases or renews a permit, dropping expired ones first, so
//! the count is exact across processes and a holder that dies (SIGKILL, a lost node) loses its
//! permits once their time to live has passed, and nothing else.
//!
//! Beside the keys, every permit is also written to its name's index, one sorted set of every
//! key's permits (`<prefix>:permits:{<name>}`, scored by expiry the same way), so the fleet's
//! total is one `ZCARD` away ([`RedisPermits::held_total`]). On one server or Sentinel the
//! key's script writes it in the same call. On a cluster the index lives in its own slot, so
//! it is written by a second call after the key's script: a write of it that fails leaves the
//! total off by that permit until the permit is released or expires, never longer (a permit
//! whose key's script failed is never indexed).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::Value;

use crate::backend::RedisBackend;
use crate::error::{BackendError, BuildError};
use crate::stack::DEFAULT_PREFIX;
use crate::stack::build::check_name;

/// The most permits a key may hold.
pub const MAX_PERMITS: u64 = 1_000_000;

/// The longest time to live a permit may have: a day (longer work renews).
pub const MAX_PERMIT_TTL: Duration = Duration::from_secs(24 * 60 * 60);

/// What the scripts that write the name's index start with: `index(set, expiry, id)`, which
/// writes permit `id` to the index `set` until `expiry`, dropping expired entries and keeping
/// the index as long as its last permit. The key's scripts call it on `KEYS[2]` where the index
/// is given (on the key's node: one server or Sentinel); on a cluster [`INDEX`] does.
macro_rules! indexing {
    () => {
        "local function index(set, expiry, id) \
  redis.call('ZREMRANGEBYSCORE', set, '-inf', now) \
  redis.call('ZADD', set, expiry, id) \
  local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES') \
  redis.call('PEXPIRE', set, math.max(1, tonumber(last[2]) - now)) \
end "
    };
}

/// What every script starts with: `refused(set, reply)` is an error reply naming `set` and the
/// fix when `reply` (a `redis.pcall`'s) is Redis's error, as it is when `set` holds another type
/// (an operator's or another program's key under the prefix), which is left as found; `nil`
/// otherwise.
macro_rules! refusing {
    () => {
        "local function refused(set, reply) \
  if type(reply) == 'table' and reply.err then \
    return redis.error_reply('limiter: key ' .. set .. ' cannot be read (' .. tostring(reply.err) .. '); delete it or change the prefix') \
  end \
end "
    };
}

/// What the scripts that change a key start with: `expired(set)` drops `set`'s expired permits,
/// answering [`refusing`]'s error reply when `set` holds another type. Every set a script
/// writes is checked so before its first write: a script that stopped halfway would leave a
/// permit taken that its caller was told failed.
macro_rules! expiring {
    () => {
        concat!(
            refusing!(),
            "local function expired(set) \
  return refused(set, redis.pcall('ZREMRANGEBYSCORE', set, '-inf', now)) \
end "
        )
    };
}

/// Drops expired permits, then takes one if fewer than `count` are held: `{1, held, expiry}`
/// or `{0, held, ms until the first expiry}`. `ARGV = [now?, count, ttl_ms, id]`.
const ACQUIRE: &str = concat!(
    indexing!(),
    expiring!(),
    "local refused = expired(KEYS[1]) or (KEYS[2] and expired(KEYS[2])) \
if refused then return refused end \
local held = redis.call('ZCARD', KEYS[1]) \
if held < tonumber(ARGV[2]) then \
  local expiry = now + tonumber(ARGV[3]) \
  redis.call('ZADD', KEYS[1], expiry, ARGV[4]) \
  if KEYS[2] then index(KEYS[2], expiry, ARGV[4]) end \
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES') \
  redis.call('PEXPIRE', KEYS[1], math.max(1, tonumber(last[2]) - now)) \
  return {1, held + 1, expiry} \
end \
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES') \
return {0, held, tonumber(first[2]) - now}"
);

/// Drops expired permits, then releases `id` (from the index too, where it is given): 1 if it
/// was held. `ARGV = [now?, id]`.
const RELEASE: &str = concat!(
    expiring!(),
    "local refused = expired(KEYS[1]) or (KEYS[2] and expired(KEYS[2])) \
if refused then return refused end \
if KEYS[2] then redis.call('ZREM', KEYS[2], ARGV[2]) end \
return redis.call('ZREM', KEYS[1], ARGV[2])"
);

/// Drops expired permits, then moves `id`'s expiry to `now + ttl` if it is still held: the new
/// expiry, or 0. `ARGV = [now?, ttl_ms, id]`.
const RENEW: &str = concat!(
    indexing!(),
    expiring!(),
    "local refused = expired(KEYS[1]) or (KEYS[2] and expired(KEYS[2])) \
if refused then return refused end \
if not redis.call('ZSCORE', KEYS[1], ARGV[3]) then return 0 end \
local expiry = now + tonumber(ARGV[2]) \
redis.call('ZADD', KEYS[1], 'XX', expiry, ARGV[3]) \
if KEYS[2] then index(KEYS[2], expiry, ARGV[3]) end \
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES') \
redis.call('PEXPIRE', KEYS[1], math.max(1, tonumber(last[2]) - now)) \
return expiry"
);

/// On a cluster, where the index is in a slot of its own: indexes permit `id` until `expiry`
/// (taken or renewed; expired ones dropped first) and keeps the index as long as its last
/// permit. `ARGV = [now?, expiry, id]`.
const INDEX: &str = concat!(
    indexing!(),
    expiring!(),
    "local refused = expired(KEYS[1]) if refused then return refused end \
index(KEYS[1], ARGV[2], ARGV[3]) return 1"
);

/// On a cluster: drops permit `id` from the index. `ARGV = [id]`.
const UNINDEX: &str = concat!(
    refusing!(),
    "local gone = redis.pcall('ZREM', KEYS[1], ARGV[1]) \
return refused(KEYS[1], gone) or gone"
);

/// Drops expired permits from the index and counts the rest. `ARGV = [now?]`.
const TOTAL: &str = concat!(
    expiring!(),
    "local refused = expired(KEYS[1]) if refused then return refused end \
return redis.call('ZCARD', KEYS[1])"
);

/// Permits held and not expired: read only. `ARGV = [now?]`.
const HELD: &str = concat!(
    refusing!(),
    "local held = redis.pcall('ZCOUNT', KEYS[1], '(' .. now, '+inf') \
return refused(KEYS[1], held) or held"
);

/// Permits per key on Redis (see the module docs). Cheap to clone: it shares the backend.
///
/// ```no_run
/// use std::time::Duration;
/// use limiter_redis::{Acquired, RedisBackend};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// // At most 10 reports running per customer, fleet-wide; a permit lives 30 s unless renewed.
/// let reports = backend.permits("reports", 10, Duration::from_secs(30))?;
/// match reports.acquire("acme").await? {
///     Acquired::Held(permit) => {
///         // ... the work, renewing every few seconds if it runs long ...
///         reports.renew("acme", permit.id()).await?;
///         reports.release("acme", permit.id()).await?;
///     }
///     Acquired::Busy { retry_after, .. } => println!("429: retry after {retry_after:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RedisPermits {
    backend: RedisBackend,
    prefix: String,
    name: String,
    count: u64,
    ttl_ms: u64,
}

/// What an acquire answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// A permit was taken.
    Held(RedisPermit),
    /// Every permit of the key is held; nothing was taken.
    Busy {
        /// Permits the key holds.
        held: u64,
        /// The most it may hold.
        count: u64,
        /// Until the first held permit expires (a release may free one sooner).
        retry_after: Duration,
    },
}

/// A permit taken on Redis: its id (to release or renew it, from any process) and when it
/// expires unless renewed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisPermit {
    id: String,
    expires_at_ms: u64,
    held: u64,
}

impl RedisPermit {
    /// The permit's id: random, unique per permit.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// When it expires unless renewed, in milliseconds since the Unix epoch by Redis's clock.
    pub fn expires_at_ms(&self) -> u64 {
        self.expires_at_ms
    }

    /// Permits the key held once this one was taken (this one included).
    pub fn held(&self) -> u64 {
        self.held
    }
}

impl RedisBackend {
    /// Permits named `name` (part of each key's Redis key,
    /// `limiter:permits:<name>:{<key>}`; [`with_prefix`](RedisPermits::with_prefix) changes
    /// the first part): at most `count` held per key (1 to [`MAX_PERMITS`]), each expiring
    /// `ttl` after it is taken or renewed (1 ms to [`MAX_PERMIT_TTL`]). A name that is empty
    /// or holds `{` or `}` is refused.
    pub fn permits(
        &self,
        name: &str,
        count: u64,
        ttl: Duration,
    ) -> Result<RedisPermits, BuildError> {
        check_name("permits", name, true)?;
        let refused = |reason: String| BuildError::Permits {
            name: name.to_owned(),
            reason,
        };
        if count == 0 || count > MAX_PERMITS {
            return Err(refused(format!(
                "{count} permits per key: give 1 to {MAX_PERMITS}"
            )));
        }
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        if ttl_ms == 0 || ttl > MAX_PERMIT_TTL {
            return Err(refused(format!(
                "a time to live of {ttl:?}: give 1 ms to {MAX_PERMIT_TTL:?} (renew longer work)"
            )));
        }
        Ok(RedisPermits {
            backend: self.clone(),
            prefix: DEFAULT_PREFIX.to_owned(),
            name: name.to_owned(),
            count,
            ttl_ms,
        })
    }
}

impl RedisPermits {
    /// The same permits under keys starting `prefix` (`limiter` unless changed, as a stack's),
    /// so a least-privilege ACL user's key pattern (`~<prefix>:*`) covers them. A prefix that
    /// is empty or holds `{` or `}` is refused.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, BuildError> {
        check_name("prefix", prefix, true)?;
        self.prefix = prefix.to_owned();
        Ok(self)
    }

    /// The most permits a key may hold.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The backend's local clock reading (a held permit's renewal schedule).
    pub(crate) fn local_now(&self) -> u64 {
        self.backend.local_now()
    }

    /// A permit's time to live.
    pub fn ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms)
    }

    /// Takes a permit for `key` if fewer than `count` are held (expired ones dropped first). A
    /// Redis failure is an error, never a permit: the caller's failure policy decides.
    pub async fn acquire(&self, key: &str) -> Result<Acquired, BackendError> {
        let id = permit_id();
        let reply = self
            .run(
                key,
                ACQUIRE,
                &[&self.count.to_string(), &self.ttl_ms.to_string(), &id],
            )
            .await?;
        let [taken, held, at] = numbers(&reply)?;
        if taken == 1 && self.backend.is_cluster() {
            self.index(at, &id).await;
        }
        Ok(if taken == 1 {
            Acquired::Held(RedisPermit {
                id,
                expires_at_ms: at,
                held,
            })
        } else {
            Acquired::Busy {
                held,
                count: self.count,
                retry_after: Duration::from_millis(at.max(1)),
            }
        })
    }

    /// Releases `key`'s permit `id`: whether it was held (false once it expired or was released
    /// already, so a release is idempotent).
    pub async fn release(&self, key: &str, id: &str) -> Result<bool, BackendError> {
        let args = [id];
        if !self.backend.is_cluster() {
            return Ok(number(&self.run(key, RELEASE, &args).await?)? == 1);
        }
        // Both at once: the index's entry goes whether or not the key still held it.
        let index = self.index_key();
        let (reply, _) = tokio::join!(
            self.run(key, RELEASE, &args),
            self.backend.eval_on_key(&index, UNINDEX, false, &args)
        );
        Ok(number(&reply?)? == 1)
    }

    /// Moves `key`'s permit `id`'s expiry to a full time to live from now, answering the new
    /// expiry (ms since the Unix epoch), or `None` when the permit is no longer held.
    pub async fn renew(&self, key: &str, id: &str) -> Result<Option<u64>, BackendError> {
        let reply = self
            .run(key, RENEW, &[&self.ttl_ms.to_string(), id])
            .await?;
        let expiry = Some(number(&reply)?).filter(|&expiry| expiry > 0);
        if let Some(expiry) = expiry.filter(|_| self.backend.is_cluster()) {
            self.index(expiry, id).await;
        }
        Ok(expiry)
    }

    /// Permits `key` holds now (expired ones not counted).
    pub async fn held(&self, key: &str) -> Result<u64, BackendError> {
        number(&self.run(key, HELD, &[]).await?)
    }

    /// Permits held now across every key of this name, by every process (expired ones not
    /// counted): the fleet's total, from the name's index (see the module docs; one call on
    /// the master serving the index).
    pub async fn held_total(&self) -> Result<u64, BackendError> {
        number(
            &self
                .backend
                .eval_on_key(&self.index_key(), TOTAL, true, &[])
                .await?,
        )
    }

    /// The name's index of every key's permits.
    fn index_key(&self) -> String {
        // The name as hash tag: one slot per name, apart from its keys' (a name holds no braces).
        format!("{}:permits:{{{}}}", self.prefix, self.name)
    }

    /// On a cluster, indexes permit `id` until `expiry` (ms). A failure is not the caller's: the
    /// permit is held all the same, and the total misses it until it is released or expires.
    async fn index(&self, expiry: u64, id: &str) {
        let index = self.index_key();
        let _ = self
            .backend
            .eval_on_key(&index, INDEX, true, &[&expiry.to_string(), id])
            .await;
    }

    /// Runs `body` on `key`'s sorted set, `now` read first (see
    /// [`RedisBackend::eval_on_key`]).
    /// On one server or Sentinel the name's index is given too (`KEYS[2]`: the scripts write
    /// it in the same call); on a cluster it is in another slot, and the callers write it apart.
    async fn run(
        &self,
        key: &str,
        body: &'static str,
        args: &[&str],
    ) -> Result<Value, BackendError> {
        // The key's own hash tag: on a cluster, keys spread over the masters.
        let redis_key = format!("{}:permits:{}:{{{key}}}", self.prefix, self.name);
        if self.backend.is_cluster() {
            self.backend.eval_on_key(&redis_key, body, true, args).await
        } else {
            let index = self.index_key();
            self.backend
                .eval_on_keys(&redis_key, &[&index], body, true, args)
                .await
        }
    }
}

/// A fresh permit id: a hash under a randomly seeded key (std seeds each process's keys from the
/// OS) of this process's id and a counter, then the counter, in hex: unique across processes
/// without coordination.
fn permit_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    // Relaxed: a counter only made unique, never ordered against anything.
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(n);
    hasher.write_u32(std::process::id());
    format!("{:016x}{n:x}", hasher.finish())
}

fn number(reply: &Value) -> Result<u64, BackendError> {
    match reply {
        Value::Int(n) => u64::try_from(*n).map_err(|_| bad(reply)),
        _ => Err(bad(reply)),
    }
}

fn numbers(reply: &Value) -> Result<[u64; 3], BackendError> {
    match reply {
        Value::Array(items) if items.len() == 3 => Ok([
            number(&items[0])?,
            number(&items[1])?,
            // A wait is never negative, but the first expiry may have been passed by rounding.
            match &items[2] {
                Value::Int(n) => u64::try_from(*n).unwrap_or(0),
                other => return Err(bad(other)),
            },
        ]),
        _ => Err(bad(reply)),
    }
}

fn bad(reply: &Value) -> BackendError {
    BackendError::BadReply(format!("a permit script answered {reply:?}"))
}
