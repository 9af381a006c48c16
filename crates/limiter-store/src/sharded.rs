//! [`ShardedStore`]: the default store, an unbounded sharded map that drops full keys itself.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::PoisonError;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;
use limiter_core::{Algorithm, Decision, DecisionError, StateCell};

use crate::store::{Store, StoreStats};
use crate::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The default hasher: foldhash, randomly seeded per store.
pub type DefaultHasher = foldhash::fast::RandomState;

/// The default [`Store`], unbounded and self-reclaiming. Keys hash once (foldhash by default) to one of a power
/// of two cache-padded shards, each a read-write lock over a hashbrown table of `(key, cell)`
/// pairs stored inline: 17 bytes of table per `u64` key, before the table's spare room.
///
/// # Reclamation, amortised on the call path
///
/// A full key decides like an absent one, so a shard drops its full keys whenever it is about to
/// grow: an insert that finds its shard's table with no room left first sweeps it, then rebuilds
/// it with at least a quarter free (twice as large when the sweep freed less than a quarter,
/// smaller when it freed more than three quarters). Each sweep of `c` slots is paid for by at
/// least `c / 4` inserts before the next, and a shard's room stays within about 8/3 of the most
/// keys in it that were not full at once. No thread runs in the background.
///
/// # Why this map
///
/// `benches/benches/stores.rs` compares it, in one run, with DashMap, papaya and scc, each with
/// SipHash and foldhash. Lookups here hash once and take a shard read lock, so calls on existing
/// keys never block each other; the inline entries are what keep a key near 36 bytes, where
/// papaya boxes every entry. The hasher is a type parameter: pass `std::hash::RandomState` to
/// [`ShardedStore::with_hasher`] for SipHash when keys come from an adversary who can observe
/// timing closely.
pub struct ShardedStore<K, S = DefaultHasher> {
    shards: Box<[CachePadded<RwLock<Shard<K>>>]>,
    hasher: S,
}

struct Shard<K> {
    table: HashTable<(K, StateCell)>,
    /// The table's capacity when it was last built, before any removal left a tombstone.
    room: usize,
    reclaimed: u64,
}

impl<K> ShardedStore<K> {
    /// An empty store with four shards per available core, hashing with foldhash.
    pub fn new() -> Self {
        Self::with_hasher(DefaultHasher::default())
    }
}

impl<K> Default for ShardedStore<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K, S> ShardedStore<K, S> {
    /// An empty store with four shards per available core, hashing keys with `hasher`.
    pub fn with_hasher(hasher: S) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        Self::with_shards_and_hasher(cores.saturating_mul(4), hasher)
    }

    /// An empty store with `shards` shards (rounded up to a power of two, between 1 and 4096),
    /// hashing keys with `hasher`.
    pub fn with_shards_and_hasher(shards: usize, hasher: S) -> Self {
        let shards = shards.clamp(1, 4096).next_power_of_two();
        Self {
            shards: (0..shards)
                .map(|_| {
                    CachePadded::new(RwLock::new(Shard {
                        table: HashTable::new(),
                        room: 0,
                        reclaimed: 0,
                    }))
                })
                .collect(),
            hasher,
        }
    }

    /// The number of shards.
    pub fn shards(&self) -> usize {
        self.shards.len()
    }

    /// The number of keys the tables have room for without growing: the store's memory is
    /// about 17 bytes per slot for a `u64` key (the key, the state word, a control byte).
    pub fn capacity(&self) -> usize {
        self.shards
            .iter()
            .map(|shard| read(shard).table.capacity())
            .sum()
    }

    fn shard(&self, hash: u64) -> &RwLock<Shard<K>> {
        // hashbrown picks buckets with the low bits and tags with the top seven; the shard
        // takes bits from the middle, so the three stay independent. `len` is a power of two.
        let index = (hash >> 32) as usize & (self.shards.len() - 1);
        &self.shards[index]
    }
}

impl<K, S> Store<K> for ShardedStore<K, S>
where
    K: Hash + Eq + Clone + Send + Sync,
    S: BuildHasher + Send + Sync,
{
    fn apply<A: Algorithm>(
        &self,
        algorithm: &A,
        key: &K,
        cost: u64,
        now: u64,
    ) -> Result<Decision, DecisionError> {
        let hash = self.hasher.hash_one(key);
        let shard = self.shard(hash);
        {
            // Calls on a present key hold the read lock across the CAS, so a sweep (which takes
            // the write lock) never removes a cell between a caller's lookup and its write.
            let shard = read(shard);
            if let Some((_, cell)) = shard.table.find(hash, |(k, _)| k == key) {
                return cell.apply(algorithm, cost, now);
            }
        }
        // An absent key is a fresh state. A call that writes nothing (a denial or a peek) must
        // not insert it: that is what keeps denied floods of new keys from growing the map.
        let step = algorithm.decide(A::FRESH, cost, now)?;
        let Some(next) = step.next else {
            return Ok(step.decision);
        };
        let mut shard = write(shard);
        // Another caller may have inserted the key since the lookup: decide against its state.
        if let Some((_, cell)) = shard.table.find(hash, |(k, _)| k == key) {
            return cell.apply(algorithm, cost, now);
        }
        let rehash = |(k, _): &(K, StateCell)| self.hasher.hash_one(k);
        shard.make_room(algorithm, now, rehash);
        // Still absent under the write lock: the state is FRESH, so `step` is this call's answer.
        shard
            .table
            .insert_unique(hash, (key.clone(), StateCell::new(next)), rehash);
        Ok(step.decision)
    }

    fn reclaim<A: Algorithm>(&self, algorithm: &A, now: u64) -> u64 {
        let rehash = |(k, _): &(K, StateCell)| self.hasher.hash_one(k);
        self.shards
            .iter()
            .map(|shard| {
                let mut shard = write(shard);
                let dropped = shard.drop_full(algorithm, now);
                if shard.table.len() < shard.room / 4 {
                    let keep = shard.table.len().saturating_mul(2);
                    shard.rebuild(keep, rehash);
                }
                dropped
            })
            .sum()
    }

    fn stats(&self) -> StoreStats {
        self.shards
            .iter()
            .fold(StoreStats::default(), |stats, shard| {
                let shard = read(shard);
                StoreStats {
                    keys: stats.keys.saturating_add(shard.table.len() as u64),
                    reclaimed: stats.reclaimed.saturating_add(shard.reclaimed),
                    evicted: 0,
                }
            })
    }
}

impl<K> Shard<K> {
    /// Drops the full keys, returning how many.
    fn drop_full<A: Algorithm>(&mut self, algorithm: &A, now: u64) -> u64 {
        let before = self.table.len();
        self.table
            .retain(|(_, cell)| !algorithm.is_full(cell.load(), now));
        let dropped = before.saturating_sub(self.table.len()) as u64;
        self.reclaimed = self.reclaimed.saturating_add(dropped);
        dropped
    }

    /// Before an insert: if the table has no room left, drops its full keys, then rebuilds it
    /// with at least a quarter free: twice as large if the sweep left it three quarters full,
    /// smaller if it left less than a quarter, the same size (without the tombstones the
    /// removals left) otherwise. Every change of size happens here, so `room` stays true.
    fn make_room<A: Algorithm>(
        &mut self,
        algorithm: &A,
        now: u64,
        rehash: impl Fn(&(K, StateCell)) -> u64,
    ) {
        if self.table.len() < self.table.capacity() {
            return;
        }
        self.drop_full(algorithm, now);
        let (left, room) = (self.table.len(), self.room);
        let target = if left >= room.saturating_sub(room / 4) {
            room.saturating_mul(2).max(3)
        } else if left < room / 4 {
            left.saturating_mul(2).max(3)
        } else {
            room
        };
        self.rebuild(target, rehash);
    }

    /// Moves every entry into a new table with room for `target` keys.
    fn rebuild(&mut self, target: usize, rehash: impl Fn(&(K, StateCell)) -> u64) {
        let mut table = HashTable::with_capacity(target.max(self.table.len()));
        for entry in self.table.drain() {
            table.insert_unique(rehash(&entry), entry, &rehash);
        }
        self.room = table.capacity();
        self.table = table;
    }
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    // A panic in a caller's `Hash` or `Eq` poisons the lock but leaves the table whole
    // (hashbrown is panic-safe), so later calls go on using it.
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

impl<K, S> fmt::Debug for ShardedStore<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: usize = self.shards.iter().map(|s| read(s).table.len()).sum();
        f.debug_struct("ShardedStore")
            .field("shards", &self.shards.len())
            .field("keys", &keys)
            .finish_non_exhaustive()
    }
}
