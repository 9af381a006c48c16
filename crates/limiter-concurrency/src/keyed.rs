//! [`KeyedConcurrency`]: at most `count` permits held per key, counted in one lock-free word per
//! key in a [`ShardedStore`]; and [`Held`], a permit released when dropped.

use std::borrow::Borrow;
use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::ops::Deref;
use std::sync::Arc;

use limiter_core::{Algorithm, Clock, DefaultClock, Limit, LimitError};
use limiter_store::{DefaultHasher, ShardedStore, Store, StoreStats};

use crate::permits::{PermitCount, Recent, Releasing};
use crate::sync::AtomicU64;

/// Why an acquire took no permit. Nothing was taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refused {
    /// Every permit of the key is held: retry once one is released (when is not known here).
    #[error("all {count} permits of this key are held ({held} now); retry once one is released")]
    Busy {
        /// Permits the key holds.
        held: u64,
        /// The most it may hold.
        count: u64,
    },
    /// More permits asked at once than a key may ever hold: no release can admit it.
    #[error(
        "{units} permits asked at once, but a key holds at most {count}; ask for at most {count}"
    )]
    TooMany {
        /// Permits asked.
        units: u64,
        /// The most a key may hold.
        count: u64,
    },
    /// Zero permits asked: a permit of nothing limits nothing.
    #[error("zero permits asked; ask for at least one")]
    Zero,
}

/// At most `count` permits held at once per key: "at most N in flight per customer".
///
/// Each key's permits are one word in a [`ShardedStore`], taken and released by
/// compare-and-swap (lock-free on a key already held; a new key takes its shard's lock, as in
/// every keyed limiter here). A key holding no permit decides like one never seen, so the store
/// forgets it, after a grace: memory follows the keys with permits held and those inserted in
/// about the last second, not every key ever seen. (The grace is what spares a key whose
/// permits come and go from being forgotten and inserted again, under its shard's write lock,
/// by every sweep; the clock is read only when a key is inserted.) [`reclaim`](Self::reclaim)
/// forgets every key holding none at once. An acquire is all or nothing and a refused one
/// changes nothing.
///
/// ```
/// use limiter_concurrency::{KeyedConcurrency, Refused};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let exports = KeyedConcurrency::<String>::new(2)?;
/// let first = exports.try_acquire("acme")?;
/// let second = exports.try_acquire("acme")?;
/// assert!(matches!(exports.try_acquire("acme"), Err(Refused::Busy { held: 2, count: 2 })));
/// assert!(exports.try_acquire("globex").is_ok()); // another key, its own permits
/// drop(first); // the export ended: its permit is released
/// let third = exports.try_acquire("acme")?;
/// assert_eq!(third.release(), 1); // released explicitly: `second` still holds one
/// # drop(second);
/// # Ok(()) }
/// ```
pub struct KeyedConcurrency<K, S = DefaultHasher> {
    permits: PermitCount,
    store: ShardedStore<K, S>,
    /// Read when a key is inserted, to stamp it (the grace above).
    clock: Box<dyn Clock>,
    /// The newest insert's reading: what a sweep measures the grace against. Only a hint (a
    /// stale value keeps keys longer).
    recent: AtomicU64,
}

impl<K, S> fmt::Debug for KeyedConcurrency<K, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedConcurrency")
            .field("count", &self.permits.count())
            .finish_non_exhaustive()
    }
}

impl<K: Hash + Eq + Clone + Send + Sync + 'static> KeyedConcurrency<K> {
    /// At most `count` permits per key (1 to [`MAX_PERMITS`](crate::MAX_PERMITS)).
    pub fn new(count: u64) -> Result<Self, LimitError> {
        Self::with_store(count, ShardedStore::new())
    }
}

impl<K, S> KeyedConcurrency<K, S>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync,
{
    /// As [`new`](Self::new), in `store` (its shards and hasher chosen: SipHash,
    /// `std::hash::RandomState`, where keys come from an adversary who can time the calls).
    ///
    /// ```
    /// use limiter_concurrency::KeyedConcurrency;
    /// use limiter_store::ShardedStore;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = ShardedStore::with_hasher(std::hash::RandomState::new());
    /// let exports = KeyedConcurrency::<String, _>::with_store(1, store)?;
    /// let held = exports.try_acquire("acme")?;
    /// assert!(exports.try_acquire("acme").is_err());
    /// drop(held);
    /// assert!(exports.try_acquire("acme").is_ok());
    /// # Ok(()) }
    /// ```
    pub fn with_store(count: u64, store: ShardedStore<K, S>) -> Result<Self, LimitError> {
        Self::with_store_and_clock(count, store, DefaultClock::new())
    }

    /// As [`with_store`](Self::with_store), stamping inserted keys with `clock`'s readings
    /// (a `ManualClock` in tests of the grace a released key gets).
    pub fn with_store_and_clock(
        count: u64,
        store: ShardedStore<K, S>,
        clock: impl Clock + 'static,
    ) -> Result<Self, LimitError> {
        Ok(Self {
            permits: PermitCount::new(Limit::from_nanos(count, 1))?,
            store,
            recent: AtomicU64::new(clock.now()),
            clock: Box::new(clock),
        })
    }

    /// The most permits a key may hold.
    pub fn count(&self) -> u64 {
        self.permits.count()
    }

    /// Takes one permit for `key`, released when the answer is dropped.
    pub fn try_acquire<Q>(&self, key: &Q) -> Result<Permit<'_, K, S>, Refused>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.try_acquire_n(key, 1)
    }

    /// Takes `units` permits for `key` at once (all or none), released together when the
    /// answer is dropped.
    pub fn try_acquire_n<Q>(&self, key: &Q, units: u64) -> Result<Permit<'_, K, S>, Refused>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.take(key, units)?;
        Ok(Held::new(self, key.to_owned(), units))
    }

    /// As [`try_acquire_n`](Self::try_acquire_n), the permit owning a handle on the limiter
    /// (for a permit that outlives the borrow: a response body, a spawned task).
    pub fn try_acquire_owned<Q>(
        self: &Arc<Self>,
        key: &Q,
        units: u64,
    ) -> Result<OwnedPermit<K, S>, Refused>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.take(key, units)?;
        Ok(Held::new(Arc::clone(self), key.to_owned(), units))
    }

    /// Permits `key` holds now.
    pub fn held<Q>(&self, key: &Q) -> u64
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        // A peek (0 units) is always decidable and writes nothing.
        self.store
            .apply(&self.permits, key, 0, 0)
            .map_or(0, |d| self.count().saturating_sub(d.remaining()))
    }

    /// Keys holding at least one permit, and keys released to none not yet forgotten.
    pub fn len(&self) -> u64 {
        self.store.stats().keys
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets every key that holds no permit now, returning how many.
    pub fn reclaim(&self) -> u64 {
        self.store.reclaim(&self.permits, 0)
    }

    /// What the store holds and has forgotten.
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }

    fn take<Q>(&self, key: &Q, units: u64) -> Result<(), Refused>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let count = self.count();
        if units == 0 {
            return Err(Refused::Zero);
        }
        let grace = Recent {
            permits: &self.permits,
            clock: &*self.clock,
            recent: &self.recent,
        };
        let decision = self
            .store
            .apply(&grace, key, units, 0)
            .map_err(|_| Refused::TooMany { units, count })?;
        if decision.is_denied() {
            return Err(Refused::Busy {
                held: count.saturating_sub(decision.remaining()),
                count,
            });
        }
        Ok(())
    }

    /// Releases `units` of `key`'s permits, answering what it holds after.
    fn release(&self, key: &K, units: u64) -> u64 {
        // Releasing is never refused: its only error is a cost above the burst, which it
        // never checks.
        let after = self.store.apply(&Releasing(&self.permits), key, units, 0);
        after.map_or(0, |d| self.count().saturating_sub(d.remaining()))
    }
}

/// Permits held for one key, released when dropped (or by [`release`](Held::release)); `H` is
/// how the permit reaches its limiter: a borrow ([`Permit`]) or an `Arc` ([`OwnedPermit`]).
#[must_use = "a permit is released as soon as it is dropped"]
pub struct Held<H, K, S = DefaultHasher>
where
    H: Deref<Target = KeyedConcurrency<K, S>>,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync,
{
    limiter: H,
    key: K,
    units: u64,
}

/// A permit borrowing its limiter.
pub type Permit<'a, K, S = DefaultHasher> = Held<&'a KeyedConcurrency<K, S>, K, S>;

/// A permit owning a handle on its limiter.
pub type OwnedPermit<K, S = DefaultHasher> = Held<Arc<KeyedConcurrency<K, S>>, K, S>;

impl<H, K, S> Held<H, K, S>
where
    H: Deref<Target = KeyedConcurrency<K, S>>,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync,
{
    fn new(limiter: H, key: K, units: u64) -> Self {
        Self {
            limiter,
            key,
            units,
        }
    }

    /// The key whose permits these are.
    pub fn key(&self) -> &K {
        &self.key
    }

    /// How many permits this holds.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// Releases the permits now, answering how many the key still holds (others' permits).
    pub fn release(mut self) -> u64 {
        let units = std::mem::take(&mut self.units);
        self.limiter.release(&self.key, units)
    }
}

impl<H, K, S> Drop for Held<H, K, S>
where
    H: Deref<Target = KeyedConcurrency<K, S>>,
    K: Hash + Eq + Clone + Send + Sync + 'static,
    S: BuildHasher + Send + Sync,
{
    fn drop(&mut self) {
        if self.units > 0 {
            self.limiter.release(&self.key, self.units);
        }
    }
}

impl<H, K, S> fmt::Debug for Held<H, K, S>
where
    H: Deref<Target = KeyedConcurrency<K, S>>,
    K: Hash + Eq + Clone + Send + Sync + fmt::Debug + 'static,
    S: BuildHasher + Send + Sync,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.key)
            .field("units", &self.units)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_and_too_many_are_refused_naming_the_fix_and_take_nothing() {
        let limiter = KeyedConcurrency::<u32>::new(2).unwrap();
        assert_eq!(limiter.try_acquire_n(&1, 0).unwrap_err(), Refused::Zero);
        let too_many = limiter.try_acquire_n(&1, 3).unwrap_err();
        assert_eq!(too_many, Refused::TooMany { units: 3, count: 2 });
        assert!(too_many.to_string().contains("ask for at most 2"));
        assert_eq!((limiter.held(&1), limiter.len()), (0, 0));
        assert!(KeyedConcurrency::<u32>::new(0).is_err());
    }
}
