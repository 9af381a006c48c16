//! [`Algorithm`]: a rate-limiting algorithm as a pure transition on one `u64` state word, and
//! [`StateCell`], the atomic word it is applied to by compare-and-swap.
//!
//! Keeping the transition pure is what lets the same algorithm run in a direct limiter, in any
//! keyed store, inside a stack that decides several layers with one `now`, and (reimplemented in
//! Lua) in Redis, with the two tested against each other.
//!
//! Besides a request ([`Algorithm::decide`], which a full limit refuses), a state takes usage
//! that already happened ([`Algorithm::record`], never refused, which may leave it in debt);
//! [`Recording`] presents an algorithm's `record` as its `decide`, so every cell and store that
//! applies algorithms records usage with no code of its own.

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

    /// Whether the algorithm turns the clock's readings into Unix time (a calendar's windows),
    /// so it needs a clock that keeps the wall clock's rate ([`Clock::keeps_wall_rate`]): a
    /// stack refuses it on a clock that does not. `false` unless the algorithm's docs state
    /// otherwise.
    ///
    /// [`Clock::keeps_wall_rate`]: crate::Clock::keeps_wall_rate
    fn reads_unix_time(&self) -> bool {
        false
    }

    /// Decides a call of `cost` units at `now` (nanoseconds since the clock's epoch) on `state`.
    ///
    /// Cost 0 is a peek. [`Step::next`] is `None` when nothing must be written: a denial or a
    /// peek never changes state. A written state is never [`StateCell::RETIRED`], which stores
    /// reserve to mark a cell they are removing.
    fn decide(&self, state: u64, cost: u64, now: u64) -> Result<Step, DecisionError>;

    /// Records `cost` units of usage that already happened (tokens a response used, bytes
    /// already sent) on `state` at `now`. Unlike [`decide`](Self::decide) it is never refused,
    /// whatever the cost (a cost above the burst included): the state may be left *in debt*,
    /// past its capacity, and later calls are then denied until the debt is paid back at the
    /// limit's rate. A state holds at most twice its capacity in use ([`Usage::MAX_DEBT`]):
    /// usage recorded past that is not kept.
    ///
    /// The decision says whether the state is within its limit after the record (`allowed`;
    /// exactly at the limit counts as within), the whole units left, in `retry_after` the wait
    /// until a call of one unit would be admitted again, and in `reset_after` the wait until
    /// the state is full. Cost 0 is a peek. [`Step::next`] is `Some` whenever `cost > 0`, and
    /// never [`StateCell::RETIRED`].
    ///
    /// With records, the admission bound an algorithm states counts recorded units too: over
    /// any span, the units admitted plus the units recorded before the span's last admission
    /// stay within it (records after the last admission are usage the limit could not refuse).
    fn record(&self, state: u64, cost: u64, now: u64) -> Result<Step, DecisionError>;

    /// Whether `state` is full at `now`: it then decides exactly like [`FRESH`](Self::FRESH) at
    /// `now` and at every later reading, so a store may forget it. (A reading earlier than `now`,
    /// from a clock that went back, may still tell the two apart.)
    fn is_full(&self, state: u64, now: u64) -> bool;

    /// How much of the limit's capacity `state` has in use at `now`, rounded up (more than the
    /// capacity for a state in debt). A stack uses it to carry a key's consumption over when
    /// the limit chosen for the key changes.
    fn usage(&self, state: u64, now: u64) -> Usage;

    /// A state with `usage` of this limit's capacity in use at `now` (the same fraction, rounded
    /// up, so a change of limit never favours the caller; a debt carries over as debt, up to
    /// [`Usage::MAX_DEBT`]).
    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError>;

    /// `state` after `units` granted at `granted_at` are given back at `now`, or `None` when
    /// nothing is left to give back (the units have already come back on their own). A refund
    /// returns at most `units` and never takes the state above full.
    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64>;
}

/// The part of a limit's capacity in use: `used` out of `capacity` (`capacity >= 1`), in
/// whatever unit the algorithm counts (ticks of debt, units in a window). `used` exceeds
/// `capacity` for a state in debt (usage recorded past the limit), by at most the capacity
/// again ([`MAX_DEBT`](Self::MAX_DEBT)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    used: u64,
    capacity: u64,
}

impl Usage {
    /// The most a state holds in use, as a multiple of its capacity: a key can owe at most one
    /// more limit's worth. Every algorithm saturates its records there.
    pub const MAX_DEBT: u64 = 2;

    /// `used` out of `capacity`; `used` is capped at [`MAX_DEBT`](Self::MAX_DEBT) times the
    /// capacity, and a zero capacity counts as one.
    pub const fn new(used: u64, capacity: u64) -> Self {
        let capacity = if capacity == 0 { 1 } else { capacity };
        let most = capacity.saturating_mul(Self::MAX_DEBT);
        let used = if used > most { most } else { used };
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

    /// Whether more than the whole capacity is in use (the state is in debt).
    pub const fn is_in_debt(&self) -> bool {
        self.used > self.capacity
    }

    /// The same fraction of `capacity`, rounded up (at most `MAX_DEBT * capacity`).
    pub fn scaled_to(&self, capacity: u64) -> u64 {
        let scaled =
            (u128::from(self.used) * u128::from(capacity)).div_ceil(u128::from(self.capacity));
        // used <= MAX_DEBT * self.capacity, so the result is at most MAX_DEBT * capacity.
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }
}

/// An algorithm whose [`decide`](Algorithm::decide) records: each call is usage that already
/// happened ([`Algorithm::record`]), never refused, so every call of a positive cost writes,
/// even one whose decision says the state is now over its limit. Cells and stores write
/// whatever a step's `next` holds, so they record with no code of their own:
///
/// ```
/// use limiter_core::{Algorithm, Recording, StateCell};
/// # use limiter_core::{Decision, DecisionError, Limit, LimitError, Step, Usage};
/// # #[derive(Debug)] struct Counter(Limit);
/// # impl Algorithm for Counter {
/// #     const NAME: &'static str = "counter";
/// #     const FRESH: u64 = 0;
/// #     fn new(limit: Limit) -> Result<Self, LimitError> { Ok(Self(limit)) }
/// #     fn limit(&self) -> &Limit { &self.0 }
/// #     fn decide(&self, s: u64, cost: u64, _: u64) -> Result<Step, DecisionError> {
/// #         let ok = s + cost <= self.0.count();
/// #         let d = if ok { Decision::allow(self.0.count(), self.0.count() - s - cost, 0) }
/// #                 else { Decision::deny(self.0.count(), 0, 1, 1) };
/// #         Ok(Step { decision: d, next: (ok && cost > 0).then_some(s + cost) })
/// #     }
/// #     fn record(&self, s: u64, cost: u64, _: u64) -> Result<Step, DecisionError> {
/// #         let next = (s + cost).min(2 * self.0.count());
/// #         let ok = next <= self.0.count();
/// #         let d = if ok { Decision::allow(self.0.count(), self.0.count() - next, 0) }
/// #                 else { Decision::deny(self.0.count(), 0, 1, 1) };
/// #         Ok(Step { decision: d, next: (cost > 0).then_some(next) })
/// #     }
/// #     fn is_full(&self, s: u64, _: u64) -> bool { s == 0 }
/// #     fn usage(&self, s: u64, _: u64) -> Usage { Usage::new(s, self.0.count()) }
/// #     fn with_usage(&self, u: Usage, _: u64) -> Result<u64, DecisionError> { Ok(u.scaled_to(self.0.count())) }
/// #     fn refund(&self, s: u64, units: u64, _: u64, _: u64) -> Option<u64> { Some(s.saturating_sub(units)) }
/// # }
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // Three per window: a response that used five leaves the state two in debt.
/// let counter = Counter::new(Limit::per_second(3))?;
/// let cell = StateCell::new(Counter::FRESH);
/// let recorded = cell.apply(&Recording(&counter), 5, 0)?;
/// assert!(recorded.is_denied()); // over its limit now
/// assert!(cell.apply(&counter, 1, 0)?.is_denied()); // and the next request waits
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Recording<'a, A>(pub &'a A);

impl<A: Algorithm> Algorithm for Recording<'_, A> {
    const NAME: &'static str = A::NAME;
    const FRESH: u64 = A::FRESH;

    /// A `Recording` wraps an algorithm already built: it cannot be built from a limit.
    fn new(limit: Limit) -> Result<Self, LimitError> {
        Err(not_built_from_a_limit(A::NAME, "Recording", limit))
    }

    fn limit(&self) -> &Limit {
        self.0.limit()
    }

    fn accuracy(&self) -> Accuracy {
        self.0.accuracy()
    }

    fn reads_unix_time(&self) -> bool {
        self.0.reads_unix_time()
    }

    #[inline]
    fn decide(&self, state: u64, cost: u64, now: u64) -> Result<Step, DecisionError> {
        self.0.record(state, cost, now)
    }

    fn record(&self, state: u64, cost: u64, now: u64) -> Result<Step, DecisionError> {
        self.0.record(state, cost, now)
    }

    fn is_full(&self, state: u64, now: u64) -> bool {
        self.0.is_full(state, now)
    }

    fn usage(&self, state: u64, now: u64) -> Usage {
        self.0.usage(state, now)
    }

    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError> {
        self.0.with_usage(usage, now)
    }

    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64> {
        self.0.refund(state, units, granted_at, now)
    }
}

/// An algorithm that gives units back: as a store applies it, a call of `cost` units at `now`
/// refunds that many units granted at `granted_at` ([`Algorithm::refund`]); its answer is the
/// state's after the refund (a peek), and a fresh state, or one whose units already came back,
/// is left as it is. limiter-store's `KeyedLimiter::refund_key_at` applies it to a key's state
/// as a decision would be applied.
#[derive(Clone, Copy, Debug)]
pub struct Refunding<'a, A> {
    /// The algorithm whose units come back.
    pub algorithm: &'a A,
    /// When they were granted, on the algorithm's clock.
    pub granted_at: u64,
}

impl<A: Algorithm> Algorithm for Refunding<'_, A> {
    const NAME: &'static str = A::NAME;
    const FRESH: u64 = A::FRESH;

    /// A `Refunding` wraps an algorithm already built: it cannot be built from a limit.
    fn new(limit: Limit) -> Result<Self, LimitError> {
        Err(not_built_from_a_limit(A::NAME, "Refunding", limit))
    }

    fn limit(&self) -> &Limit {
        self.algorithm.limit()
    }

    fn accuracy(&self) -> Accuracy {
        self.algorithm.accuracy()
    }

    fn reads_unix_time(&self) -> bool {
        self.algorithm.reads_unix_time()
    }

    fn decide(&self, state: u64, units: u64, now: u64) -> Result<Step, DecisionError> {
        let next = if state == A::FRESH || units == 0 {
            None
        } else {
            self.algorithm.refund(state, units, self.granted_at, now)
        };
        let decision = self
            .algorithm
            .decide(next.unwrap_or(state), 0, now)?
            .decision;
        Ok(Step { decision, next })
    }

    fn record(&self, state: u64, units: u64, now: u64) -> Result<Step, DecisionError> {
        self.decide(state, units, now)
    }

    fn is_full(&self, state: u64, now: u64) -> bool {
        self.algorithm.is_full(state, now)
    }

    fn usage(&self, state: u64, now: u64) -> Usage {
        self.algorithm.usage(state, now)
    }

    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError> {
        self.algorithm.with_usage(usage, now)
    }

    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64> {
        self.algorithm.refund(state, units, granted_at, now)
    }
}

/// Refuses `algorithm` on `clock` where the algorithm turns the clock's readings into Unix time
/// ([`Algorithm::reads_unix_time`], a calendar's windows) and the clock does not keep the wall
/// clock's rate ([`Clock::keeps_wall_rate`]: the default clock on the CPU's time-stamp counter),
/// whose windows would end early or late by the clock's drift. What every limiter built from
/// an algorithm already made checks ([`DirectLimiter::from_algorithm`], the store's
/// `KeyedLimiter::from_algorithm`); a stack checks each layer's limits the same way.
///
/// `limiter_calendar::CalendarCounter` is such an algorithm; its docs show the clocks it takes.
///
/// [`Clock::keeps_wall_rate`]: crate::Clock::keeps_wall_rate
/// [`DirectLimiter::from_algorithm`]: crate::DirectLimiter::from_algorithm
pub fn check_clock<A: Algorithm, C: crate::Clock>(
    algorithm: &A,
    clock: &C,
) -> Result<(), LimitError> {
    if !algorithm.reads_unix_time() || clock.keeps_wall_rate() {
        return Ok(());
    }
    Err(LimitError::Unsupported {
        algorithm: A::NAME,
        // The algorithm's name leads the message; its nominal limit (a month as 30 days) would
        // only mislead.
        reason: "it turns the clock's readings into Unix time, and this clock does not keep the \
                 wall clock's rate (the default clock reads the CPU's time-stamp counter at one \
                 calibration's rate, half a minute a month off on the development VM), so its \
                 windows would end early or late; read `MonotonicClock`"
            .to_owned(),
    })
}

/// Why a wrapper of an algorithm (`wrapper`) cannot be built from `limit`: it wraps one
/// already built.
fn not_built_from_a_limit(algorithm: &'static str, wrapper: &str, limit: Limit) -> LimitError {
    LimitError::Unsupported {
        algorithm,
        reason: format!(
            "{limit}: a {wrapper} wraps an algorithm already built; build the algorithm, then \
             wrap a reference to it"
        ),
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
/// performs no write at all (a [`Recording`] writes every record of a positive cost).
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
                // Relaxed: the word's modification order alone orders the exchange (see above).
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
                // Relaxed: as in `apply`, the word's modification order alone orders the exchange.
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
        // Relaxed: retirement is a value of the word itself, so whether a write or the
        // retirement came first is decided by the word's modification order alone (see
        // `apply_live`); nothing else is published with it.
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
                // Relaxed: the exchange is ordered by the word's modification order alone (see `apply`).
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
        // Relaxed: the swap is one step of the word's modification order; a call that read the
        // word before it fails its exchange and finds the cell retired (`apply_live`).
        self.word.swap(Self::RETIRED, Ordering::Relaxed)
    }

    /// Whether the cell has been retired.
    pub fn is_retired(&self) -> bool {
        self.load() == Self::RETIRED
    }
}
