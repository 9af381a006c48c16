//! [`Store`]: where a keyed limiter keeps one state word per key, and [`StoreStats`], what a
//! store reports about its size and what it has forgotten.

use std::borrow::Borrow;
use std::hash::Hash;

use limiter_core::{Algorithm, Decision, DecisionError};

/// Per-key state for a keyed limiter: one [`StateCell`](limiter_core::StateCell) word per key,
/// created on the first call that writes and forgotten once it is full again.
///
/// A store holds the states of one algorithm; [`KeyedLimiter`](crate::KeyedLimiter) pairs it
/// with that algorithm and passes it to every call. Every store keeps these rules, which the
/// conformance suite checks on each:
///
/// - An absent key decides exactly like [`Algorithm::FRESH`].
/// - A call that writes nothing (a denial or a peek) never inserts a key.
/// - Concurrent calls on one key are serialised by the key's compare-and-swap: no store admits
///   more than one caller alone could.
/// - A key is dropped without loss only when its state is full at the reading of the call that
///   drops it (it then decides like an absent key at that reading and every later one). With a
///   clock that goes back, an earlier reading can tell the two apart.
pub trait Store<K>: Send + Sync {
    /// Decides `cost` units for `key` at `now` with `algorithm`, inserting the key only if the
    /// call writes. `key` may be borrowed (`&str` for a `String` key): it is turned into an
    /// owned key only when it is inserted.
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
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized;

    /// Drops every key whose state is full at `now` and returns how many were dropped. Stores
    /// also do this on their own as calls arrive; this runs it at once, for every key.
    fn reclaim<A: Algorithm>(&self, algorithm: &A, now: u64) -> u64;

    /// How many keys the store holds and how many it has dropped.
    fn stats(&self) -> StoreStats;
}

/// What a store holds and what it has dropped since it was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Keys held now, full ones not yet reclaimed included.
    pub keys: u64,
    /// Keys dropped because their state was full: these losslessly became absent.
    pub reclaimed: u64,
    /// Keys evicted under capacity pressure ([`BoundedStore`](crate::BoundedStore) only). Each
    /// one that was not full was reset: its next call starts from a full state.
    pub evicted: u64,
}
