//! [`BoundedStore`]: at most `max_keys` keys, on moka with a least-recently-used policy.

use std::borrow::Borrow;
use std::collections::VecDeque;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use limiter_core::{Algorithm, Decision, DecisionError, StateCell};
use moka::ops::compute::{CompResult, Op};
use moka::policy::EvictionPolicy;
use moka::sync::Cache;

use crate::store::{Store, StoreStats};
use crate::table::DefaultHasher;

/// A [`Store`] of at most `max_keys` keys, on moka with a least-recently-used policy, with full
/// keys dropped losslessly as new keys arrive.
///
/// # What it forgets, and when
///
/// - **Idle keys, losslessly.** Once a key's state is full again (the time its limit needs to
///   refill completely after its last admission) it decides like an absent key, and the store
///   drops it. This is the idle expiry, per key and exactly as long as it can be without losing
///   anything: shorter would reset keys, longer would only hold memory. It is driven by the
///   limiter's own clock, so it follows a `ManualClock` in tests.
/// - **Least recently used keys, under capacity pressure.** When more than `max_keys` keys are
///   not full at once, moka evicts the least recently used. An evicted key that was not full is
///   *reset*: its next call starts from a full state, so over time it may admit more than its
///   limit. This is the one lossy case; [`StoreStats::evicted`] counts every capacity eviction
///   (including any of a key that happened to be full, which loses nothing).
///
/// # How idle keys are found without a background thread
///
/// The store keeps its keys and their cells in insertion order in a ring. Each insert of a new
/// key looks at the two oldest entries of the ring: a key that is full is retired and removed
/// (under moka's per-key lock, by [`StateCell::retire_if_full`], so a concurrent write either
/// lands first and keeps the key or finds the cell retired and starts over), and one that is
/// not goes to the back. The ring holds a clone of each key and of its `Arc`; it is capped at
/// twice `max_keys`.
///
/// moka's own time-to-idle is not used: it reads moka's clock, not the limiter's, and it removes
/// an entry before anything can retire its cell, so a caller that had just read the entry would
/// write to a removed cell and lose that write.
///
/// moka applies its capacity bound as its maintenance runs, on the call path every few hundred
/// writes, so the number of keys can briefly exceed `max_keys` by that much.
pub struct BoundedStore<K, S = DefaultHasher> {
    cache: Cache<K, Arc<StateCell>, S>,
    /// Keys in the order they were inserted, with their cells, for the amortised sweep of full
    /// keys: holding the cell lets the sweep test a key with one load, not a cache lookup.
    ring: Mutex<VecDeque<(K, Arc<StateCell>)>>,
    max_keys: u64,
    reclaimed: AtomicU64,
    evicted: Arc<AtomicU64>,
}

/// Why a store could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A bounded store was asked to hold no keys.
    #[error("a bounded store needs room for at least one key; set max_keys to 1 or more")]
    ZeroCapacity,
}

impl<K> BoundedStore<K>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
{
    /// A store of at most `max_keys` keys, hashing with foldhash.
    pub fn new(max_keys: u64) -> Result<Self, StoreError> {
        Self::with_hasher(max_keys, DefaultHasher::default())
    }
}

impl<K, S> BoundedStore<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
{
    /// A store of at most `max_keys` keys, hashing with `hasher`.
    pub fn with_hasher(max_keys: u64, hasher: S) -> Result<Self, StoreError> {
        if max_keys == 0 {
            return Err(StoreError::ZeroCapacity);
        }
        let evicted = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&evicted);
        let cache = Cache::builder()
            .max_capacity(max_keys)
            .eviction_policy(EvictionPolicy::lru())
            .eviction_listener(move |_key, cell: Arc<StateCell>, cause| {
                if cause.was_evicted() {
                    // A caller still holding the cell finds it retired and starts over on a
                    // new one: the reset this eviction makes, counted here.
                    cell.retire();
                    // Relaxed: a statistic; it orders no other memory.
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            })
            .build_with_hasher(hasher);
        Ok(Self {
            cache,
            ring: Mutex::new(VecDeque::new()),
            max_keys,
            reclaimed: AtomicU64::new(0),
            evicted,
        })
    }

    /// The most keys the store holds (after moka's maintenance has run).
    pub fn max_keys(&self) -> u64 {
        self.max_keys
    }

    /// After inserting `key` with `cell`: queues it, and drops the two oldest queued keys if
    /// they are full.
    fn sweep_after_insert<A: Algorithm>(
        &self,
        key: K,
        cell: &Arc<StateCell>,
        algorithm: &A,
        now: u64,
    ) {
        let oldest = {
            let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            ring.push_back((key, Arc::clone(cell)));
            let cap = usize::try_from(self.max_keys.saturating_mul(2)).unwrap_or(usize::MAX);
            while ring.len() > cap {
                // Keys dropped from the ring untested are left to the capacity bound.
                ring.pop_front();
            }
            [ring.pop_front(), ring.pop_front()]
        };
        let mut keep = Vec::new();
        for (key, cell) in oldest.into_iter().flatten() {
            if cell.is_retired() {
                continue; // evicted, or replaced by a newer cell with its own place in the ring
            }
            if !algorithm.is_full(cell.load(), now)
                || !self.drop_if_full(&key, &cell, algorithm, now)
            {
                keep.push((key, cell));
            }
        }
        if !keep.is_empty() {
            let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            ring.extend(keep);
        }
    }

    /// Removes `key` if `cell` is still its cell and is full at `now`, returning whether it
    /// was removed.
    fn drop_if_full<A: Algorithm>(
        &self,
        key: &K,
        cell: &Arc<StateCell>,
        algorithm: &A,
        now: u64,
    ) -> bool {
        let result = self
            .cache
            .entry_by_ref(key)
            .and_compute_with(|entry| match entry {
                // Under moka's per-key lock: no other removal or insert of this key can run, and
                // a caller writing to the cell either lands before the retirement (and the key
                // stays) or finds it retired (and starts over on a new cell).
                Some(entry)
                    if Arc::ptr_eq(entry.value(), cell) && cell.retire_if_full(algorithm, now) =>
                {
                    Op::Remove
                }
                _ => Op::Nop,
            });
        let removed = matches!(result, CompResult::Removed(_));
        if removed {
            // Relaxed: a statistic; it orders no other memory.
            self.reclaimed.fetch_add(1, Ordering::Relaxed);
        }
        removed
    }
}

impl<K, S> Store<K> for BoundedStore<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Clone + Send + Sync + 'static,
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
        loop {
            let cell = match self.cache.get(key) {
                Some(cell) => cell,
                None => {
                    // A call that writes nothing must not insert the key (see ShardedStore).
                    let step = algorithm.decide(A::FRESH, cost, now)?;
                    let Some(next) = step.next else {
                        return Ok(step.decision);
                    };
                    let entry = self
                        .cache
                        .entry_by_ref(key)
                        .or_insert_with(|| Arc::new(StateCell::new(next)));
                    if entry.is_fresh() {
                        // Inserted with this call's state: `step` is its answer.
                        self.sweep_after_insert(key.to_owned(), entry.value(), algorithm, now);
                        return Ok(step.decision);
                    }
                    entry.into_value()
                }
            };
            if let Some(decision) = cell.apply_live(algorithm, cost, now)? {
                return Ok(decision);
            }
            // The cell was retired: it is being, or has been, removed. Look the key up again.
            std::hint::spin_loop();
        }
    }

    fn reclaim<A: Algorithm>(&self, algorithm: &A, now: u64) -> u64 {
        let full: Vec<(Arc<K>, Arc<StateCell>)> = self
            .cache
            .iter()
            .filter(|(_, cell)| algorithm.is_full(cell.load(), now))
            .collect();
        let dropped = full
            .iter()
            .filter(|(key, cell)| self.drop_if_full(key, cell, algorithm, now))
            .count() as u64;
        self.cache.run_pending_tasks();
        dropped
    }

    fn stats(&self) -> StoreStats {
        // Apply moka's pending writes and evictions so the count is current.
        self.cache.run_pending_tasks();
        StoreStats {
            keys: self.cache.entry_count(),
            // Relaxed: statistics, read after moka's maintenance, ordering nothing else.
            reclaimed: self.reclaimed.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }
}

impl<K, S> fmt::Debug for BoundedStore<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedStore")
            .field("max_keys", &self.max_keys)
            .field("keys", &self.cache.entry_count())
            .field("evicted", &self.evicted.load(Ordering::Relaxed)) // Relaxed: a statistic
            .finish_non_exhaustive()
    }
}
