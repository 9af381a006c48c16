//! [`DirectLimiter`]: one limiter, one state word, no key.

use crossbeam_utils::CachePadded;

use crate::{
    Algorithm, Clock, Decision, DecisionError, DefaultClock, Limit, LimitError, Limiter, Recording,
    StateCell,
};

/// A single limiter of algorithm `A` reading clock `C`: one `u64` of state updated by
/// compare-and-swap.
///
/// Algorithm crates name it for their algorithm, such as `limiter_token_bucket::TokenBucket`.
#[derive(Debug)]
pub struct DirectLimiter<A, C = DefaultClock> {
    // Padded so the word written by every admission does not share a cache line with the
    // read-only algorithm parameters that every call reads.
    cell: CachePadded<StateCell>,
    algorithm: A,
    clock: C,
}

impl<A: Algorithm> DirectLimiter<A> {
    /// A full limiter for `limit` on a new [`DefaultClock`].
    pub fn new(limit: Limit) -> Result<Self, LimitError> {
        Self::with_clock(limit, DefaultClock::new())
    }
}

impl<A: Algorithm, C: Clock> DirectLimiter<A, C> {
    /// A full limiter for `limit` reading `clock`.
    pub fn with_clock(limit: Limit, clock: C) -> Result<Self, LimitError> {
        Ok(Self {
            cell: CachePadded::new(StateCell::new(A::FRESH)),
            algorithm: A::new(limit)?,
            clock,
        })
    }

    /// A full limiter of `algorithm`, already built (one that takes more than a [`Limit`],
    /// such as a calendar window), reading `clock`; refused ([`check_clock`]) where the
    /// algorithm reads Unix time and the clock does not keep the wall clock's rate.
    ///
    /// [`check_clock`]: crate::check_clock
    pub fn from_algorithm(algorithm: A, clock: C) -> Result<Self, LimitError> {
        crate::check_clock(&algorithm, &clock)?;
        Ok(Self {
            cell: CachePadded::new(StateCell::new(A::FRESH)),
            algorithm,
            clock,
        })
    }

    /// Decides one unit now.
    #[inline]
    pub fn check(&self) -> Result<Decision, DecisionError> {
        self.check_n(1)
    }

    /// Decides `cost` units now.
    #[inline]
    pub fn check_n(&self, cost: u64) -> Result<Decision, DecisionError> {
        self.check_at(cost, self.clock.now())
    }

    /// Reports the current state without consuming anything (a call of cost 0).
    pub fn peek(&self) -> Result<Decision, DecisionError> {
        self.check_n(0)
    }

    /// Decides `cost` units at `now`, for callers that read the clock once for several limiters.
    #[inline]
    pub fn check_at(&self, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        self.cell.apply(&self.algorithm, cost, now)
    }

    /// Records `cost` units of usage that already happened, now: never refused, it may leave
    /// the limiter in debt, and later calls are denied until the debt is paid back at the
    /// limit's rate (see [`Algorithm::record`] for the decision it returns).
    pub fn record(&self, cost: u64) -> Result<Decision, DecisionError> {
        self.record_at(cost, self.clock.now())
    }

    /// Records `cost` units of usage at `now` (see [`record`](Self::record)).
    pub fn record_at(&self, cost: u64, now: u64) -> Result<Decision, DecisionError> {
        self.cell.apply(&Recording(&self.algorithm), cost, now)
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

impl<A: Algorithm, C: Clock> Limiter for DirectLimiter<A, C> {
    type Key = ();

    fn limit(&self) -> &Limit {
        self.algorithm.limit()
    }

    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn decide_at(&self, _key: &(), cost: u64, now: u64) -> Result<Decision, DecisionError> {
        self.check_at(cost, now)
    }

    fn record_at(&self, _key: &(), cost: u64, now: u64) -> Result<Decision, DecisionError> {
        DirectLimiter::record_at(self, cost, now)
    }
}
