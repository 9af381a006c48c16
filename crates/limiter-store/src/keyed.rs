//! [`KeyedLimiter`]: one state word per key in a sharded concurrent map.

use std::hash::{BuildHasher, Hash, RandomState};

use dashmap::DashMap;
use limiter_core::{
    Algorithm, Clock, Decision, DecisionError, Limit, LimitError, Limiter, MonotonicClock,
    StateCell,
};

/// A limiter of algorithm `A` per key `K`, reading clock `C`, hashing with `S`.
///
/// Each key's state is one [`StateCell`] updated by compare-and-swap while a shard read lock
/// is held, so calls on existing keys never wait for each other. Only the first admitted call for
/// a key takes a shard's write lock, to insert it.
#[derive(Debug)]
pub struct KeyedLimiter<A, K, C = MonotonicClock, S = RandomState>
where
    K: Hash + Eq,
    S: BuildHasher + Clone,
{
    algorithm: A,
    states: DashMap<K, StateCell, S>,
    clock: C,
}

impl<A: Algorithm, K: Hash + Eq + Clone + Send + Sync> KeyedLimiter<A, K> {
    /// An empty keyed limiter for `limit` on a new [`MonotonicClock`].
    pub fn new(limit: Limit) -> Result<Self, LimitError> {
        Self::with_clock(limit, MonotonicClock::new())
    }
}

impl<A: Algorithm, K: Hash + Eq + Clone + Send + Sync, C: Clock> KeyedLimiter<A, K, C> {
    /// An empty keyed limiter for `limit` reading `clock`.
    pub fn with_clock(limit: Limit, clock: C) -> Result<Self, LimitError> {
        Self::with_clock_and_hasher(limit, clock, RandomState::new())
    }
}

impl<A, K, C, S> KeyedLimiter<A, K, C, S>
where
    A: Algorithm,
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock,
    S: BuildHasher + Clone + Send + Sync,
{
    /// An empty keyed limiter for `limit` reading `clock`, hashing keys with `hasher`.
    pub fn with_clock_and_hasher(limit: Limit, clock: C, hasher: S) -> Result<Self, LimitError> {
        Ok(Self {
            algorithm: A::new(limit)?,
            states: DashMap::with_hasher(hasher),
            clock,
        })
    }

    /// Decides one unit for `key` now.
    pub fn check_key(&self, key: &K) -> Result<Decision, DecisionError> {
        self.check_key_n(key, 1)
    }

    /// Decides `cost` units for `key` now.
    pub fn check_key_n(&self, key: &K, cost: u64) -> Result<Decision, DecisionError> {
        self.check_key_at(key, cost, self.clock.now())
    }

    /// Reports `key`'s state without consuming anything or inserting the key.
    pub fn peek_key(&self, key: &K) -> Result<Decision, DecisionError> {
        self.check_key_n(key, 0)
    }

    /// Decides `cost` units for `key` at `now`.
    pub fn check_key_at(&self, key: &K, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        if let Some(cell) = self.states.get(key) {
            return cell.apply(&self.algorithm, cost, now);
        }
        // An absent key is a fresh state. A call that writes nothing (a denial or a peek) must
        // not insert it: that is what keeps denied floods of new keys from growing the map.
        let step = self.algorithm.decide(A::FRESH, cost, now)?;
        if step.next.is_none() {
            return Ok(step.decision);
        }
        // Another caller may insert the key between the lookup and here; `entry` then finds
        // its cell and the CAS decides against that caller's state.
        self.states
            .entry(key.clone())
            .or_insert_with(|| StateCell::new(A::FRESH))
            .downgrade()
            .apply(&self.algorithm, cost, now)
    }

    /// Drops every key whose state is full now, returning how many were dropped. A full state
    /// decides exactly like an absent key, so this never changes a decision.
    pub fn reclaim_full(&self) -> usize {
        let now = self.clock.now();
        let before = self.states.len();
        // `retain` holds each shard's write lock while it runs, so no CAS can change a cell
        // between the fullness check and its removal.
        self.states
            .retain(|_, cell| !self.algorithm.is_full(cell.load(), now));
        before.saturating_sub(self.states.len())
    }

    /// The number of keys held.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// The algorithm, with its derived parameters.
    pub fn algorithm(&self) -> &A {
        &self.algorithm
    }

    /// The clock this limiter reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }
}

impl<A, K, C, S> Limiter for KeyedLimiter<A, K, C, S>
where
    A: Algorithm,
    K: Hash + Eq + Clone + Send + Sync,
    C: Clock,
    S: BuildHasher + Clone + Send + Sync,
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
}
