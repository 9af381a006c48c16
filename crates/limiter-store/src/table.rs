//! [`ShardedTable`]: the sharded, self-reclaiming hash table under
//! [`ShardedStore`](crate::ShardedStore), public so other per-key structures (a stack's entries)
//! reuse it.
//!
//! Entries are stored inline in one of a power of two cache-padded shards, each a read-write
//! lock over a hashbrown table. An entry's place is fixed while its shard's lock is held, read
//! or write; only an insert or a reclaim (write lock) moves or drops entries.

use std::hash::BuildHasher;
use std::sync::PoisonError;

use crossbeam_utils::CachePadded;
use hashbrown::HashTable;

use crate::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The default hasher: foldhash, randomly seeded per table.
pub type DefaultHasher = foldhash::fast::RandomState;

/// A read guard on one shard.
pub type ShardReadGuard<'a, E> = RwLockReadGuard<'a, Shard<E>>;
/// A write guard on one shard.
pub type ShardWriteGuard<'a, E> = RwLockWriteGuard<'a, Shard<E>>;

/// Entries of type `E`, hashed with `S` to one of a power of two shards.
///
/// Callers hash each entry's key once with [`hash_one`](Self::hash_one) and pass the hash to
/// every lookup. A caller that needs several shards at once must lock them in ascending
/// [`shard_index`](Self::shard_index) order (the locks prefer waiting writers, so any other
/// order can deadlock).
pub struct ShardedTable<E, S = DefaultHasher> {
    shards: Box<[CachePadded<RwLock<Shard<E>>>]>,
    hasher: S,
}

/// One shard: a hashbrown table, the room it was last built with, and what it has reclaimed.
#[derive(Debug)]
pub struct Shard<E> {
    table: HashTable<E>,
    /// The table's capacity when it was last built, before any removal left a tombstone.
    room: usize,
    reclaimed: u64,
    /// Times the table was built anew (each an allocation): what the sizing keeps rare.
    rebuilds: u64,
}

impl<E, S> ShardedTable<E, S> {
    /// An empty table with [`default_shards`](Self::default_shards), hashing with `hasher`.
    pub fn with_hasher(hasher: S) -> Self {
        Self::with_shards_and_hasher(Self::default_shards(), hasher)
    }

    /// Four shards per available core.
    pub fn default_shards() -> usize {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        cores.saturating_mul(4)
    }

    /// An empty table with `shards` shards (rounded up to a power of two, between 1 and 4096).
    pub fn with_shards_and_hasher(shards: usize, hasher: S) -> Self {
        let shards = shards.clamp(1, 4096).next_power_of_two();
        Self {
            shards: (0..shards)
                .map(|_| {
                    CachePadded::new(RwLock::new(Shard {
                        table: HashTable::new(),
                        room: 0,
                        reclaimed: 0,
                        rebuilds: 0,
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

    /// The hasher.
    pub fn hasher(&self) -> &S {
        &self.hasher
    }

    /// The shard an entry of hash `hash` lives in.
    pub fn shard_index(&self, hash: u64) -> usize {
        // hashbrown picks buckets with the low bits and tags with the top seven; the shard
        // takes bits from the middle, so the three stay independent. `len` is a power of two.
        (hash >> 32) as usize & (self.shards.len() - 1)
    }

    /// Read-locks shard `index` (taken modulo the number of shards).
    pub fn read(&self, index: usize) -> ShardReadGuard<'_, E> {
        read(&self.shards[index & (self.shards.len() - 1)])
    }

    /// Write-locks shard `index` (taken modulo the number of shards).
    pub fn write(&self, index: usize) -> ShardWriteGuard<'_, E> {
        write(&self.shards[index & (self.shards.len() - 1)])
    }

    /// The number of entries the tables have room for without growing.
    pub fn capacity(&self) -> usize {
        self.shards.iter().map(|s| read(s).table.capacity()).sum()
    }

    /// Entries held, and entries reclaimed since the table was built.
    pub fn counts(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(len, reclaimed), s| {
            let s = read(s);
            (
                len.saturating_add(s.table.len() as u64),
                reclaimed.saturating_add(s.reclaimed),
            )
        })
    }

    /// Drops every entry `is_full` says may go, shard by shard under each write lock, shrinking
    /// shards left less than a quarter full; returns how many were dropped.
    pub fn reclaim(&self, is_full: impl Fn(&E) -> bool, rehash: impl Fn(&E) -> u64) -> u64 {
        self.shards
            .iter()
            .map(|shard| {
                let mut shard = write(shard);
                let dropped = shard.drop_full(&is_full);
                if shard.table.len() < shard.room / 4 {
                    let keep = shard.table.len().saturating_mul(2);
                    shard.rebuild(keep, &rehash);
                }
                dropped
            })
            .sum()
    }
}

impl<E, S: BuildHasher> ShardedTable<E, S> {
    /// Hashes `key` with the table's hasher.
    pub fn hash_one(&self, key: impl std::hash::Hash) -> u64 {
        self.hasher.hash_one(key)
    }
}

impl<E> Shard<E> {
    /// The entry of hash `hash` that `eq` accepts.
    pub fn find(&self, hash: u64, eq: impl FnMut(&E) -> bool) -> Option<&E> {
        self.table.find(hash, eq)
    }

    /// Inserts `entry`, which must not be present. If the table has no room left it first drops
    /// the entries `is_full` accepts, then makes at least a quarter of it free: twice as large
    /// if the sweep left it three quarters full, smaller if it left less than a quarter, and
    /// otherwise as it is when the removals freed that quarter (else rebuilt at the same size,
    /// without the tombstones they left). Each sweep of `c` slots is so paid for by at least
    /// `c / 4` inserts, and the room stays within about 8/3 of the most entries that were not
    /// full at once. (Keys that are full again by their next visit, rotating through a small
    /// table, rebuilt it on every sweep: an allocation every few inserts.)
    pub fn insert(
        &mut self,
        hash: u64,
        entry: E,
        is_full: impl Fn(&E) -> bool,
        rehash: impl Fn(&E) -> u64,
    ) -> &E {
        if self.table.len() >= self.table.capacity() {
            self.drop_full(&is_full);
            let (left, room) = (self.table.len(), self.room);
            let quarter = room / 4;
            let target = if left >= room.saturating_sub(quarter) {
                Some(room.saturating_mul(2).max(3))
            } else if left < quarter {
                Some(left.saturating_mul(2).max(3))
            } else if self.table.capacity().saturating_sub(left) < quarter.max(1) {
                Some(room)
            } else {
                None
            };
            if let Some(target) = target {
                self.rebuild(target, &rehash);
            }
        }
        self.table.insert_unique(hash, entry, rehash).into_mut()
    }

    /// Drops the entries `is_full` accepts (without rebuilding), returning how many: for a
    /// caller that caps a shard's entries and needs room before an insert.
    pub fn sweep(&mut self, is_full: impl Fn(&E) -> bool) -> u64 {
        self.drop_full(is_full)
    }

    /// Removes and returns the entry of hash `hash` that `eq` accepts.
    pub fn remove(&mut self, hash: u64, eq: impl FnMut(&E) -> bool) -> Option<E> {
        self.table.find_entry(hash, eq).ok().map(|e| e.remove().0)
    }

    /// Entries in this shard.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Whether the shard holds no entry.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// Drops the full entries, returning how many.
    fn drop_full(&mut self, is_full: impl Fn(&E) -> bool) -> u64 {
        let before = self.table.len();
        self.table.retain(|entry| !is_full(entry));
        let dropped = before.saturating_sub(self.table.len()) as u64;
        self.reclaimed = self.reclaimed.saturating_add(dropped);
        dropped
    }

    /// Moves every entry into a new table with room for `target` entries.
    fn rebuild(&mut self, target: usize, rehash: impl Fn(&E) -> u64) {
        let mut table = HashTable::with_capacity(target.max(self.table.len()));
        for entry in self.table.drain() {
            table.insert_unique(rehash(&entry), entry, &rehash);
        }
        self.room = table.capacity();
        self.table = table;
        self.rebuilds = self.rebuilds.saturating_add(1);
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

impl<E, S> std::fmt::Debug for ShardedTable<E, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys: usize = self.shards.iter().map(|s| read(s).table.len()).sum();
        f.debug_struct("ShardedTable")
            .field("shards", &self.shards.len())
            .field("entries", &keys)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shard of `u64` entries, each hashed as itself.
    fn shard() -> Shard<u64> {
        Shard {
            table: HashTable::new(),
            room: 0,
            reclaimed: 0,
            rebuilds: 0,
        }
    }

    fn insert(shard: &mut Shard<u64>, key: u64, is_full: impl Fn(&u64) -> bool) {
        shard.insert(key, key, is_full, |e| *e);
    }

    #[test]
    fn keys_full_again_by_the_next_sweep_do_not_rebuild_the_table_each_time() {
        let mut shard = shard();
        for key in 0..3_000 {
            insert(&mut shard, key, |_| true);
        }
        assert!(shard.reclaimed >= 2_990, "{shard:?}");
        // Built once, when the first key came; every later sweep emptied it in place.
        assert_eq!(shard.rebuilds, 1, "{shard:?}");
        assert!(shard.table.capacity() <= 7, "{shard:?}");
    }

    #[test]
    fn a_sweep_still_grows_a_table_of_live_keys_and_shrinks_an_emptied_one() {
        let mut shard = shard();
        for key in 0..1_000 {
            insert(&mut shard, key, |_| false);
        }
        let grown = shard.room;
        assert!(grown >= 1_000 && shard.table.len() == 1_000, "{shard:?}");
        // Every key full now: the next sweep finds them all and shrinks the table.
        while shard.table.len() < shard.table.capacity() {
            let key = 1_000 + shard.table.len() as u64;
            insert(&mut shard, key, |_| false);
        }
        insert(&mut shard, u64::MAX, |e| *e != u64::MAX);
        assert_eq!(shard.table.len(), 1, "{shard:?}");
        assert!(
            shard.room < grown / 4,
            "{} of {grown}: {shard:?}",
            shard.room
        );
    }
}
