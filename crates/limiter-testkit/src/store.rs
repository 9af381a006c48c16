//! [`NeverForget`]: the reference store. It keeps every key it has written, under one mutex, and
//! never reclaims or evicts anything; the real stores must decide exactly as it does.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Mutex, PoisonError};

use limiter_core::{Algorithm, Decision, DecisionError};
use limiter_store::{Store, StoreStats};

/// A store that remembers every key forever: the reference for "reclaiming changes nothing".
#[derive(Debug, Default)]
pub struct NeverForget<K> {
    states: Mutex<HashMap<K, u64>>,
}

impl<K> NeverForget<K> {
    /// An empty reference store.
    pub fn new() -> Self {
        Self {
            states: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq + Clone + Send + Sync> Store<K> for NeverForget<K> {
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
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        let state = states.get(key).copied().unwrap_or(A::FRESH);
        let step = algorithm.decide(state, cost, now)?;
        if let Some(next) = step.next {
            states.insert(key.to_owned(), next);
        }
        Ok(step.decision)
    }

    fn reclaim<A: Algorithm>(&self, _algorithm: &A, _now: u64) -> u64 {
        0
    }

    fn stats(&self) -> StoreStats {
        let states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        StoreStats {
            keys: states.len() as u64,
            ..StoreStats::default()
        }
    }
}
