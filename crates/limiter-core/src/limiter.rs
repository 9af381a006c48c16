//! [`Limiter`]: the trait every in-process limiter implements, direct or keyed, of any algorithm.

use crate::{Decision, DecisionError, Limit};

/// A limiter that decides calls in process, synchronously. It cannot fail except on input that
/// can never be decided ([`DecisionError`]); a denial is a [`Decision`].
///
/// A direct limiter has `Key = ()`; a keyed one takes its key type. Everything funnels into
/// [`decide_at`](Self::decide_at), which takes `now` from the caller so that a stack can decide
/// all its layers at one instant.
pub trait Limiter: Send + Sync {
    /// What a call names: `()` for a direct limiter, the key type for a keyed one.
    type Key: ?Sized;

    /// The limit enforced.
    fn limit(&self) -> &Limit;

    /// The limiter's clock reading, in nanoseconds since the clock's epoch.
    fn now(&self) -> u64;

    /// Decides `cost` units for `key` at `now`. Cost 0 is a peek and changes nothing.
    fn decide_at(&self, key: &Self::Key, cost: u64, now: u64) -> Result<Decision, DecisionError>;

    /// Decides `cost` units for `key` at the limiter's own clock reading.
    fn decide(&self, key: &Self::Key, cost: u64) -> Result<Decision, DecisionError> {
        self.decide_at(key, cost, self.now())
    }

    /// Records `cost` units of usage that already happened for `key` at `now`: never refused,
    /// it may leave the key in debt (see [`Algorithm::record`](crate::Algorithm::record)).
    fn record_at(&self, key: &Self::Key, cost: u64, now: u64) -> Result<Decision, DecisionError>;

    /// Records `cost` units of usage for `key` at the limiter's own clock reading.
    fn record(&self, key: &Self::Key, cost: u64) -> Result<Decision, DecisionError> {
        self.record_at(key, cost, self.now())
    }
}
