//! [`Algorithm`]: a rate-limiting algorithm as a pure transition on one `u64` state word, and
//! [`StateCell`], the atomic word it is applied to by compare-and-swap.
//!
//! Keeping the transition pure is what lets the same algorithm run in a direct limiter, in any
//! keyed store, inside a stack that decides several layers with one `now`, and (reimplemented in
//! Lua) in Redis, with the two tested against each other.

use crate::sync::{AtomicU64, Ordering};
use crate::{Accuracy, Decision, DecisionError, Limit, LimitError};

/// The least clock range, in nanoseconds after the clock's epoch, every algorithm must be able
/// to decide in for a limit it accepts: 2^56 ns, about 2.3 years of uptime on the default clock.
/// Algorithms whose state is absolute time refuse a limit that would leave less, and refuse a
/// reading past their range with [`DecisionError::ClockOutOfRange`] rather than decide it wrongly.
pub const MIN_CLOCK_RANGE: u64 = 1 << 56;

/// A rate-limiting algorithm: `(old state, cost, now) -> (Decision, new state)`, with no IO and
/// no interior mutability.
pub trait Algorithm: Send + Sync + Sized {
    /// A short name for messages, such as `"token bucket"`.
    const NAME: &'static str;

    /// The state of a key never seen. A state that [`is_full`](Self::is_full) decides exactly
    /// like this one, so a store may drop it. Never [`StateCell::RETIRED`].
    const FRESH: u64;

    /// The algorithm for `limit`, or an error saying why this algorithm cannot represent it.
    fn new(limit: Limit) -> Result<Self, LimitError>;

    /// The limit this algorithm enforces.
    fn limit(&self) -> &Limit;

    /// How far below the limit's exact rate this algorithm may admit for its limit (never
    /// above it): [`Accuracy::EXACT`] unless the algorithm's docs state otherwise.
    fn accuracy(&self) -> Accuracy {
        Accuracy::EXACT
    }

    /// Decides a call of `cost` units at `now` (nanoseconds since the clock's epoch) on `state`.
    ///
    /// Cost 0 is a peek. [`Step::next`] is `None` when nothing must be written: a denial or a
    /// peek never changes state. A written state is never [`StateCell::RETIRED`], which stores
    /// reserve to mark a cell they are removing.
    fn decide(&self, state: u64, cost: u64, now: u64) -> Result<Step, DecisionError>;

    /// Whether `state` is full at `now`: it then decides exactly like [`FRESH`](Self::FRESH) at
    /// `now` and at every later reading, so a store may forget it. (A reading earlier than `now`,
    /// from a clock that went back, may still tell the two apart.)
    fn is_full(&self, state: u64, now: u64) -> bool;

    /// How much of the limit's capacity `state` has in use at `now`, rounded up. A stack uses
    /// it to carry a key's consumption over when the limit chosen for the key changes.
    fn usage(&self, state: u64, now: u64) -> Usage;

    /// A state with `usage` of this limit's capacity in use at `now` (the same fraction, rounded
    /// up, so a change of limit never favours the caller).
    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError>;

    /// `state` after `units` granted at `granted_at` are given back at `now`, or `None` when
    /// nothing is left to give back (the units have already come back on their own). A refund
    /// returns at most `units` and never takes the state above full.
    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64>;
}

/// The part of a limit's capacity in use: `used` out of `capacity` (`used <= capacity`,
/// `capacity >= 1`), in whatever unit the algorithm counts (ticks of debt, units in a window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    used: u64,
    capacity: u64,
}

impl Usage {
    /// `used` out of `capacity`; `used` is capped at `capacity`, and a zero capacity counts as
    /// one.
    pub const fn new(used: u64, capacity: u64) -> Self {
        let capacity = if capacity == 0 { 1 } else { capacity };
        let used = if used > capacity { capacity } else { used };
        Self { used, capacity }
    }

    /// Nothing in use.
    pub const NONE: Self = Self::new(0, 1);

    /// The part in use.
    pub const fn used(&self) -> u64 {
        self.used
    }

    /// The whole capacity.
    pub const fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The same fraction of `capacity`, rounded up.
    pub fn scaled_to(&self, capacity: u64) -> u64 {
        let scaled =
            (u128::from(self.used) * u128::from(capacity)).div_ceil(u128::from(self.capacity));
        // used <= self.capacity, so the result is at most `capacity`.
        u64::try_from(scaled).unwrap_or(capacity)
    }
}

/// The outcome of one pure transition.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Step {
    /// The answer to the call.
    pub decision: Decision,
    /// The state to write, or `None` when the call changes nothing (a denial or a peek).
    pub next: Option<u64>,
}

/// One limiter's state word, updated by compare-and-swap: lock-free, and a denial or a peek
/// performs no write at all.
///
/// A store that removes cells while callers may still hold them (one whose lookups take no
/// lock) first *retires* the cell: [`retire_if_full`](Self::retire_if_full) swaps a full state
/// for [`RETIRED`](Self::RETIRED) by compare-and-swap, so either a caller's write lands first
/// (and the cell is no longer full, so it stays) or the retirement does (and the caller's
/// [`apply_live`](Self::apply_live) sees it and looks the key up again). No write is ever lost
/// to a removal.
#[derive(Debug)]
pub struct StateCell {
    word: AtomicU64,
}

impl StateCell {
    /// The word of a retired cell. No algorithm writes it (see [`Algorithm::decide`]).
    pub const RETIRED: u64 = u64::MAX;

    /// A cell holding `word`.
    pub fn new(word: u64) -> Self {
        Self {
            word: AtomicU64::new(word),
        }
    }

    /// The current state word.
    pub fn load(&self) -> u64 {
        // Relaxed: the word is the whole state and publishes no other memory.
        self.word.load(Ordering::Relaxed)
    }

    /// Decides a call of `cost` at `now` and, if it consumes anything, writes the new state.
    ///
    /// Every admission is a successful compare-and-swap from the exact state it was decided on,
    /// so concurrent calls are serialised by the word's modification order and can never admit
    /// more than one caller alone could.
    // Always inlined: the hot path of every direct check; inlined, a caller that reads only
    // part of the decision computes only that part.
    #[inline(always)]
    pub fn apply<A: Algorithm>(
        &self,
        algorithm: &A,
        cost: u64,
        now: u64,
    ) -> Result<Decision, DecisionError> {
        // Relaxed (here and in the exchange below): the word is the whole state, so no other
        // memory needs ordering with it. What bounds admissions is that every successful
        // exchange reads the value immediately before it in the word's single modification
        // order; a stale load only makes the exchange fail and the loop decide again.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            let step = algorithm.decide(current, cost, now)?;
            let Some(next) = step.next else {
                return Ok(step.decision);
            };
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(step.decision),
                Err(actual) => current = actual,
            }
        }
    }

    /// Like [`apply`](Self::apply) for a cell a store may retire: `Ok(None)` means the cell was
    /// retired before the call could be decided on it, and nothing was written; the caller must
    /// find the key's live cell (or create it) and try again.
    pub fn apply_live<A: Algorithm>(
        &self,
        algorithm: &A,
        cost: u64,
        now: u64,
    ) -> Result<Option<Decision>, DecisionError> {
        // Relaxed, as in `apply`: retirement is a value of the same word, so the word's single
        // modification order alone decides whether a write or the retirement came first.
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            if current == Self::RETIRED {
                return Ok(None);
            }
            let step = algorithm.decide(current, cost, now)?;
            let Some(next) = step.next else {
                return Ok(Some(step.decision));
            };
            match self.word.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return Ok(Some(step.decision)),
                Err(actual) => current = actual,
            }
        }
    }

    /// Retires the cell if its state is full at `now`, returning whether it is retired. A full
    /// state decides like a fresh one, so a store that then removes the cell changes no decision.
    pub fn retire_if_full<A: Algorithm>(&self, algorithm: &A, now: u64) -> bool {
        let mut current = self.word.load(Ordering::Relaxed);
        loop {
            if current == Self::RETIRED {
                return true;
            }
            if !algorithm.is_full(current, now) {
                return false;
            }
            match self.word.compare_exchange_weak(
                current,
                Self::RETIRED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => current = actual,
            }
        }
    }

    /// Retires the cell whatever its state and returns the state it held (the eviction a
    /// bounded store makes under capacity pressure; that state is lost).
    pub fn retire(&self) -> u64 {
        self.word.swap(Self::RETIRED, Ordering::Relaxed)
    }

    /// Whether the cell has been retired.
    pub fn is_retired(&self) -> bool {
        self.load() == Self::RETIRED
    }
}
