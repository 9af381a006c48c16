//! [`KeyedLimiter`]: an algorithm, a clock and a [`Store`] of per-key states.

use std::borrow::Borrow;
use std::hash::Hash;

use limiter_core::{
    Algorithm, Clock, Decision, DecisionError, DefaultClock, Limit, LimitError, Limiter, Recording,
    Refunding,
};

use crate::sharded::ShardedStore;
use crate::store::{Store, StoreStats};

/// A limiter of algorithm `A` per key `K`, reading clock `C`, keeping states in store `St`
/// ([`ShardedStore`] by default; [`BoundedStore`](crate::BoundedStore) caps the number of keys).
#[derive(Debug)]
pub struct KeyedLimiter<A, K, C = DefaultClock, St = ShardedStore<K>> {
    algorithm: A,
    store: St,
    clock: C,
    _key: std::marker::PhantomData<fn(&K)>,
}

impl<A: Algorithm, K: Hash + Eq + Clone + Send + Sync> KeyedLimiter<A, K> {
    /// A keyed limiter for `limit` on a new [`DefaultClock`] and an empty [`ShardedStore`].
    pub fn new(limit: Limit) -> Result<Self, LimitError> {
        Self::with_clock(limit, DefaultClock::new())
    }
}

impl<A: Algorithm, K: Hash + Eq + Clone + Send + Sync, C: Clock> KeyedLimiter<A, K, C> {
    /// A keyed limiter for `limit` reading `clock`, on an empty [`ShardedStore`].
    pub fn with_clock(limit: Limit, clock: C) -> Result<Self, LimitError> {
        Self::with_store(limit, clock, ShardedStore::new())
    }
}

impl<A, K, C, St> KeyedLimiter<A, K, C, St>
where
    A: Algorithm,
    K: Hash + Eq,
    C: Clock,
    St: Store<K>,
{
    /// A keyed limiter for `limit` reading `clock`, keeping its states in `store` (which should
    /// be empty: a store's states are only meaningful to the limit that wrote them).
    pub fn with_store(limit: Limit, clock: C, store: St) -> Result<Self, LimitError> {
        Ok(Self {
            algorithm: A::new(limit)?,
            store,
            clock,
            _key: std::marker::PhantomData,
        })
    }

    /// A keyed limiter of `algorithm`, already built (one that takes more than a [`Limit`],
    /// such as a calendar window), reading `clock`, keeping its states in `store`; refused
    /// ([`check_clock`]) where the algorithm reads Unix time and the clock does not keep the
    /// wall clock's rate.
    ///
    /// [`check_clock`]: limiter_core::check_clock
    pub fn from_algorithm(algorithm: A, clock: C, store: St) -> Result<Self, LimitError> {
        limiter_core::check_clock(&algorithm, &clock)?;
        Ok(Self {
            algorithm,
            store,
            clock,
            _key: std::marker::PhantomData,
        })
    }

    /// Decides one unit for `key` now.
    pub fn check_key<Q>(&self, key: &Q) -> Result<Decision, DecisionError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_key_n(key, 1)
    }

    /// Decides `cost` units for `key` now.
    pub fn check_key_n<Q>(&self, key: &Q, cost: u64) -> Result<Decision, DecisionError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_key_at(key, cost, self.clock.now())
    }

    /// Reports `key`'s state without consuming anything or inserting the key.
    pub fn peek_key<Q>(&self, key: &Q) -> Result<Decision, DecisionError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.check_key_n(key, 0)
    }

    /// Decides `cost` units for `key` at `now`.
    pub fn check_key_at<Q>(&self, key: &Q, cost: u64, now: u64) -> Result<Decision, DecisionError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.store.apply(&self.algorithm, key, cost, now)
    }

    /// Records `cost` units of usage that already happened for `key`, now: never refused, it
    /// may leave the key in debt, and its later calls are denied until the debt is paid back
    /// at the limit's rate (see [`Algorithm::record`] for the decision it returns). A record of
    /// a positive cost inserts the key.
    pub fn record_key<Q>(&self, key: &Q, cost: u64) -> Result<Decision, DecisionError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.record_key_at(key, cost, self.clock.now())
    }

    /// Records `cost` units of usage for `key` at `now` (see [`record_key`](Self::record_key)).
    pub fn record_key_at<Q>(&self, key: &Q, cost: u64, now: u64) -> Result<Decision, DecisionError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        self.store
            .apply(&Recording(&self.algorithm), key, cost, now)
    }

    /// Gives back `units` that a call on `key` was granted at the clock's reading `granted_at`
    /// (a call refused elsewhere after this limiter admitted it), at `now`: the key's state
    /// after ([`Algorithm::refund`]: at most `units` come back, none that already came back on
    /// their own, such as a window's that has passed). An absent key is left absent.
    pub fn refund_key_at<Q>(
        &self,
        key: &Q,
        units: u64,
        granted_at: u64,
        now: u64,
    ) -> Result<Decision, DecisionError>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let refunding = Refunding {
            algorithm: &self.algorithm,
            granted_at,
        };
        self.store.apply(&refunding, key, units, now)
    }

    /// Drops every key whose state is full now, returning how many were dropped. A full state
    /// decides exactly like an absent key, so this never changes a decision. The stores also do
    /// this on their own as new keys arrive; call it to return memory at once.
    pub fn reclaim_full(&self) -> u64 {
        self.store.reclaim(&self.algorithm, self.clock.now())
    }

    /// How many keys are held, and how many have been reclaimed or evicted.
    pub fn stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// The number of keys held (full ones not yet reclaimed included).
    pub fn len(&self) -> u64 {
        self.store.stats().keys
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The algorithm, with its derived parameters.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// The store holding the per-key states.
    pub fn store(&self) -> &St {
        &self.store
    }
}

impl<A, K, C, St> Limiter for KeyedLimiter<A, K, C, St>
where
    A: Algorithm,
    K: Hash + Eq + Clone,
    C: Clock,
    St: Store<K>,
{
    type Key = K;

    fn limit(&self) -> &Limit {
        self.algorithm.limit()
    }

    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn decide_at(&self, key: &K, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        self.check_key_at(key, cost, now)
    }

    fn record_at(&self, key: &K, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        self.record_key_at(key, cost, now)
    }
}
