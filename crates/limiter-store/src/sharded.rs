//! [`ShardedStore`]: the default store, an unbounded sharded map that drops full keys itself.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};

use limiter_core::{Algorithm, Decision, DecisionError, StateCell};

use crate::store::{Store, StoreStats};
use crate::table::{DefaultHasher, ShardedTable};

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
    table: ShardedTable<(K, StateCell), S>,
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
        Self {
            table: ShardedTable::with_hasher(hasher),
        }
    }

    /// An empty store with `shards` shards (rounded up to a power of two, between 1 and 4096),
    /// hashing keys with `hasher`.
    pub fn with_shards_and_hasher(shards: usize, hasher: S) -> Self {
        Self {
            table: ShardedTable::with_shards_and_hasher(shards, hasher),
        }
    }

    /// The number of shards.
    pub fn shards(&self) -> usize {
        self.table.shards()
    }

    /// The number of keys the tables have room for without growing: the store's memory is
    /// about 17 bytes per slot for a `u64` key (the key, the state word, a control byte).
    pub fn capacity(&self) -> usize {
        self.table.capacity()
    }
}

impl<K, S> Store<K> for ShardedStore<K, S>
where
    K: Hash + Eq + Clone + Send + Sync,
    S: BuildHasher + Send + Sync,
{
    fn apply<A, Q>(
        &self,
        algorithm: &A,
        key: &Q,
        cost: u64,
        now: u64,
    ) -> Result<Decision, DecisionError>
    where
        A: Algorithm,
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.table.hash_one(key);
        let shard = self.table.shard_index(hash);
        {
            // Calls on a present key hold the read lock across the CAS, so a sweep (which takes
            // the write lock) never removes a cell between a caller's lookup and its write.
            let shard = self.table.read(shard);
            if let Some((_, cell)) = shard.find(hash, |(k, _)| k.borrow() == key) {
                return cell.apply(algorithm, cost, now);
            }
        }
        // An absent key is a fresh state. A call that writes nothing (a denial or a peek) must
        // not insert it: that is what keeps denied floods of new keys from growing the map.
        let step = algorithm.decide(A::FRESH, cost, now)?;
        let Some(next) = step.next else {
            return Ok(step.decision);
        };
        let mut shard = self.table.write(shard);
        // Another caller may have inserted the key since the lookup: decide against its state.
        if let Some((_, cell)) = shard.find(hash, |(k, _)| k.borrow() == key) {
            return cell.apply(algorithm, cost, now);
        }
        // Still absent under the write lock: the state is FRESH, so `step` is this call's answer.
        shard.insert(
            hash,
            (key.to_owned(), StateCell::new(next)),
            |(_, cell)| algorithm.is_full(cell.load(), now),
            |(k, _)| self.table.hash_one(k),
        );
        Ok(step.decision)
    }

    fn reclaim<A: Algorithm>(&self, algorithm: &A, now: u64) -> u64 {
        self.table.reclaim(
            |(_, cell)| algorithm.is_full(cell.load(), now),
            |(k, _)| self.table.hash_one(k),
        )
    }

    fn stats(&self) -> StoreStats {
        let (keys, reclaimed) = self.table.counts();
        StoreStats {
            keys,
            reclaimed,
            evicted: 0,
        }
    }
}

impl<K, S> fmt::Debug for ShardedStore<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardedStore")
            .field("table", &self.table)
            .finish()
    }
}
