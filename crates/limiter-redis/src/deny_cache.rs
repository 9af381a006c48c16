//! [`DenyCache`]: keys Redis recently denied, answered locally until they could be admitted.
//!
//! When Redis denies cost `c` on a key with `retry_after` `r`, no call of cost `c` or more on
//! that key can be admitted before `r` has passed: time only restores capacity, and every other
//! node can only consume more. The deadline is taken from the local clock reading *before* the
//! request was sent, so it is never later than Redis's own. A call of a smaller cost, or after
//! the deadline, goes to Redis. Two things break the premise: a backend failure (Redis may
//! come back empty), which clears the cache, and a refund, which forgets the keys it touched
//! and moves the cache's refund epoch on, so that a denial Redis made before the refund, whose
//! answer arrives after it, is not recorded (a denial is recorded only with the epoch read
//! before its request was sent, checked under the shard's lock; the epoch moves on before the
//! keys are forgotten). A denial covers only calls under the limit it was decided under: a
//! call that names the key under another limit goes to Redis, which rescales the key. (A key
//! whose limit moves back and forth between callers can be drained faster under the other
//! limit; a call under the first may then be denied locally until its deadline although Redis
//! would admit it. Keys under one limit, the usual case, never are.)
#![deny(clippy::arithmetic_side_effects)]

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex, PoisonError};

use limiter_core::Decision;

const SHARDS: usize = 16;

/// Which limit a denial was decided under: the script's fields for it
/// ([`RedisLimit::script_fields`](crate::RedisLimit::script_fields)).
pub(crate) type LimitId = (u8, [u64; 4]);

/// What Redis said about one limit of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Denied {
    /// The limit it was decided under: a call under another limit (the caller changed it, and
    /// Redis rescales the key) is not covered.
    pub(crate) limit: LimitId,
    /// Local clock reading (ns) before which the denial stands.
    pub(crate) until: u64,
    /// The smallest cost known to be denied until then.
    pub(crate) cost: u64,
    /// Redis's answer for that limit.
    pub(crate) decision: Decision,
}

/// A bounded map from Redis key to its standing denial.
#[derive(Debug)]
pub(crate) struct DenyCache {
    shards: Box<[Mutex<HashMap<String, Denied>>]>,
    per_shard: usize,
    hasher: RandomState,
    /// Refunds so far: a denial decided before one is not recorded after it. A lock, not an
    /// atomic: it is read once per round trip, and the lock orders it with the shards'.
    /// Shared by every node's cache of one backend (a request reads it before it knows which
    /// node answers; counting every node's refunds only records fewer denials).
    refunds: Arc<Mutex<u64>>,
}

impl DenyCache {
    /// A cache of at most about `capacity` keys (0 disables it).
    #[cfg(test)]
    pub(crate) fn new(capacity: usize) -> Self {
        Self::sharing(capacity, Arc::default())
    }

    /// A cache of at most about `capacity` keys (0 disables it) counting refunds in `refunds`,
    /// which other nodes' caches share.
    pub(crate) fn sharing(capacity: usize, refunds: Arc<Mutex<u64>>) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: capacity.div_ceil(SHARDS),
            hasher: RandomState::new(),
            refunds,
        }
    }

    fn shard(&self, key: &str) -> std::sync::MutexGuard<'_, HashMap<String, Denied>> {
        let hash = self.hasher.hash_one(key);
        // SHARDS is a power of two and the index is masked into range.
        let index = usize::try_from(hash).unwrap_or(0) & (SHARDS - 1);
        // A map is valid after any panic: entries are replaced whole.
        self.shards[index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The standing denial that covers `cost` under `limit` on `key` at `now`, if any.
    pub(crate) fn lookup(&self, key: &str, limit: LimitId, cost: u64, now: u64) -> Option<Denied> {
        if self.per_shard == 0 || cost == 0 {
            return None;
        }
        let mut shard = self.shard(key);
        match shard.get(key) {
            Some(denied) if now < denied.until && cost >= denied.cost && denied.limit == limit => {
                Some(*denied)
            }
            Some(denied) if now >= denied.until => {
                shard.remove(key);
                None
            }
            _ => None,
        }
    }

    /// The refund epoch, read before a request is sent.
    pub(crate) fn epoch(&self) -> u64 {
        *self.refunds.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records Redis's denial of `denied.cost` on `key`, decided for a request sent at refund
    /// epoch `epoch`; nothing if a refund has happened since.
    pub(crate) fn record(&self, key: &str, denied: Denied, epoch: u64) {
        if self.per_shard == 0 {
            return;
        }
        let mut shard = self.shard(key);
        // Under the shard's lock: a refund that forgets this key either moved the epoch on
        // before this check, or forgets the key after this record.
        if self.epoch() != epoch {
            return;
        }
        if shard.len() >= self.per_shard && !shard.contains_key(key) {
            let now = denied
                .until
                .saturating_sub(denied.decision.retry_after_nanos());
            shard.retain(|_, d| d.until > now);
            if shard.len() >= self.per_shard {
                return; // full of live denials: not caching one only costs a round trip
            }
        }
        shard.insert(key.to_owned(), denied);
    }

    /// A refund gave units back on `keys`: their denials no longer stand, and denials decided
    /// before it are not recorded after it.
    pub(crate) fn forget(&self, keys: &[String]) {
        // Moved on before the keys are forgotten: a denial recorded between the two, under
        // its shard's lock, is then forgotten; one recorded after sees the new epoch.
        {
            let mut refunds = self.refunds.lock().unwrap_or_else(PoisonError::into_inner);
            *refunds = refunds.wrapping_add(1);
        }
        for key in keys {
            self.shard(key).remove(key);
        }
    }

    /// Forgets everything (Redis failed, and may come back without its state).
    pub(crate) fn clear(&self) {
        for shard in &self.shards {
            shard.lock().unwrap_or_else(PoisonError::into_inner).clear();
        }
    }

    /// Keys held.
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: LimitId = (1, [1, 2, 3, 4]);

    fn denied(until: u64, cost: u64) -> Denied {
        Denied {
            limit: LIMIT,
            until,
            cost,
            decision: Decision::deny(10, 0, until, until),
        }
    }

    #[test]
    fn covers_only_equal_or_larger_costs_before_the_deadline() {
        let cache = DenyCache::new(100);
        cache.record("k", denied(100, 3), 0);
        assert_eq!(cache.lookup("k", LIMIT, 3, 99).map(|d| d.cost), Some(3));
        assert_eq!(cache.lookup("k", LIMIT, 5, 0).map(|d| d.cost), Some(3));
        assert_eq!(
            cache.lookup("k", LIMIT, 2, 0),
            None,
            "a smaller cost may fit"
        );
        assert_eq!(
            cache.lookup("k", LIMIT, 0, 0),
            None,
            "a peek always goes to Redis"
        );
        assert_eq!(cache.lookup("other", LIMIT, 3, 0), None);
        assert_eq!(
            cache.lookup("k", LIMIT, 3, 100),
            None,
            "at the deadline it may be admitted"
        );
        assert_eq!(cache.len(), 0, "an expired denial is dropped when seen");
    }

    #[test]
    fn covers_only_calls_under_the_limit_it_was_decided_under() {
        let cache = DenyCache::new(100);
        cache.record("k", denied(100, 1), 0);
        assert!(cache.lookup("k", LIMIT, 1, 0).is_some());
        let raised = (1, [1, 2, 6, 4]);
        assert_eq!(
            cache.lookup("k", raised, 1, 0),
            None,
            "a call under a changed limit goes to Redis"
        );
        assert!(
            cache.lookup("k", LIMIT, 1, 0).is_some(),
            "and leaves it standing"
        );
    }

    #[test]
    fn stays_bounded_and_clears() {
        let cache = DenyCache::new(32);
        for i in 0..1_000 {
            cache.record(&format!("k{i}"), denied(100, 1), 0);
        }
        assert!(cache.len() <= 32, "{} keys held", cache.len());
        cache.clear();
        assert_eq!(cache.len(), 0);
        let off = DenyCache::new(0);
        off.record("k", denied(100, 1), 0);
        assert_eq!(off.lookup("k", LIMIT, 1, 0), None);
    }

    #[test]
    fn a_refund_forgets_its_keys_and_refuses_denials_decided_before_it() {
        let cache = DenyCache::new(64);
        let before = cache.epoch();
        cache.record("a", denied(100, 1), before);
        cache.record("b", denied(100, 1), before);
        cache.forget(&["a".to_owned()]);
        assert_eq!(
            cache.lookup("a", LIMIT, 1, 0),
            None,
            "the refunded key is forgotten"
        );
        assert!(cache.lookup("b", LIMIT, 1, 0).is_some(), "other keys stand");
        // A denial Redis made before the refund, arriving after it, is not recorded.
        cache.record("a", denied(100, 1), before);
        assert_eq!(cache.lookup("a", LIMIT, 1, 0), None);
        // One decided after the refund is.
        cache.record("a", denied(100, 1), cache.epoch());
        assert!(cache.lookup("a", LIMIT, 1, 0).is_some());
    }
}
