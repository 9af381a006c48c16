//! [`DynAlgorithm`]: an [`Algorithm`] chosen at run time, so one layer can hold a token bucket
//! beside a sliding window and a plan can choose among limits at run time; [`PlanLimit`] holds
//! one: the built-in algorithms by value (their transitions inlined into the stack's paths, the
//! answer kept in registers), any other behind a pointer.

use limiter_core::{Algorithm, Decision, DecisionError, Limit, Step, Usage};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_token_bucket::Gcra;

/// The object-safe face of [`Algorithm`]; every algorithm has it.
pub(crate) trait DynAlgorithm: Send + Sync {
    fn name(&self) -> &'static str;
    fn fresh(&self) -> u64;
    fn limit(&self) -> &Limit;
    fn reads_unix_time(&self) -> bool;
    fn is_full(&self, state: u64, now: u64) -> bool;
    fn usage(&self, state: u64, now: u64) -> Usage;
    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError>;
    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64>;
    /// [`Algorithm::decide`] in place: the answer into `decision`, the next state (if any)
    /// into `word`. The step never travels back through a returned struct: the caller would
    /// copy it out before the callee's writes had landed, a stall measured at a quarter of a
    /// stacked call's deciding.
    fn decide(
        &self,
        word: &mut u64,
        cost: u64,
        now: u64,
        decision: &mut Decision,
    ) -> Result<(), DecisionError>;
    /// [`Algorithm::record`] in place, as [`decide`](Self::decide) does it: the state after
    /// the record into `word` (a record of a positive cost always writes).
    fn record(
        &self,
        word: &mut u64,
        cost: u64,
        now: u64,
        decision: &mut Decision,
    ) -> Result<(), DecisionError>;
    /// [`decide`](Self::decide) for the lean path: the answer into `decision`, and the state
    /// to write (`word` itself when nothing changes) returned in registers, where a
    /// `Result<(), DecisionError>` and the state go back through memory; `None` when the call
    /// cannot be decided, which [`decide`](Self::decide) then explains.
    fn decide_word(&self, word: u64, cost: u64, now: u64, decision: &mut Decision) -> Option<u64>;
}

/// One limit of a plan: a built-in algorithm by value, or one of the user's behind a pointer.
pub(crate) enum PlanLimit {
    TokenBucket(Gcra),
    SlidingWindow(SlidingCounter),
    FixedWindow(FixedCounter),
    Other(Box<dyn DynAlgorithm>),
}

/// Calls `$method` on whichever algorithm `$self` holds, statically for the built-in ones.
macro_rules! dispatch {
    ($self:expr, $a:ident => $call:expr) => {
        match $self {
            PlanLimit::TokenBucket($a) => $call,
            PlanLimit::SlidingWindow($a) => $call,
            PlanLimit::FixedWindow($a) => $call,
            PlanLimit::Other(boxed) => {
                let $a = &**boxed;
                $call
            }
        }
    };
}

impl DynAlgorithm for PlanLimit {
    #[inline]
    fn name(&self) -> &'static str {
        dispatch!(self, a => a.name())
    }
    #[inline]
    fn fresh(&self) -> u64 {
        dispatch!(self, a => DynAlgorithm::fresh(a))
    }
    #[inline]
    fn limit(&self) -> &Limit {
        dispatch!(self, a => DynAlgorithm::limit(a))
    }
    #[inline]
    fn reads_unix_time(&self) -> bool {
        dispatch!(self, a => DynAlgorithm::reads_unix_time(a))
    }
    #[inline]
    fn is_full(&self, state: u64, now: u64) -> bool {
        dispatch!(self, a => DynAlgorithm::is_full(a, state, now))
    }
    #[inline]
    fn usage(&self, state: u64, now: u64) -> Usage {
        dispatch!(self, a => DynAlgorithm::usage(a, state, now))
    }
    #[inline]
    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError> {
        dispatch!(self, a => DynAlgorithm::with_usage(a, usage, now))
    }
    #[inline]
    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64> {
        dispatch!(self, a => DynAlgorithm::refund(a, state, units, granted_at, now))
    }
    #[inline]
    fn decide(
        &self,
        word: &mut u64,
        cost: u64,
        now: u64,
        decision: &mut Decision,
    ) -> Result<(), DecisionError> {
        dispatch!(self, a => DynAlgorithm::decide(a, word, cost, now, decision))
    }
    #[inline]
    fn record(
        &self,
        word: &mut u64,
        cost: u64,
        now: u64,
        decision: &mut Decision,
    ) -> Result<(), DecisionError> {
        dispatch!(self, a => DynAlgorithm::record(a, word, cost, now, decision))
    }
    #[inline]
    fn decide_word(&self, word: u64, cost: u64, now: u64, decision: &mut Decision) -> Option<u64> {
        dispatch!(self, a => DynAlgorithm::decide_word(a, word, cost, now, decision))
    }
}

impl PlanLimit {
    /// [`decide_word`](DynAlgorithm::decide_word)'s answer and word by value, the usual limit
    /// (a token bucket) decided inline so both stay in registers: through the dispatch a
    /// stack of three spent about 90 instructions a layer, inline about 40.
    #[inline(always)]
    pub(crate) fn decide_inline(&self, word: u64, cost: u64, now: u64) -> Option<(Decision, u64)> {
        match self {
            PlanLimit::TokenBucket(bucket) => Algorithm::decide(bucket, word, cost, now)
                .ok()
                .map(|step| (step.decision, step.next.unwrap_or(word))),
            other => {
                let mut answer = Decision::allow(0, 0, 0);
                other
                    .decide_word(word, cost, now, &mut answer)
                    .map(|after| (answer, after))
            }
        }
    }
}

impl<A: Algorithm> DynAlgorithm for A {
    fn name(&self) -> &'static str {
        A::NAME
    }
    fn fresh(&self) -> u64 {
        A::FRESH
    }
    fn limit(&self) -> &Limit {
        Algorithm::limit(self)
    }
    fn reads_unix_time(&self) -> bool {
        Algorithm::reads_unix_time(self)
    }
    fn is_full(&self, state: u64, now: u64) -> bool {
        Algorithm::is_full(self, state, now)
    }
    fn usage(&self, state: u64, now: u64) -> Usage {
        Algorithm::usage(self, state, now)
    }
    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError> {
        Algorithm::with_usage(self, usage, now)
    }
    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64> {
        Algorithm::refund(self, state, units, granted_at, now)
    }
    fn decide(
        &self,
        word: &mut u64,
        cost: u64,
        now: u64,
        decision: &mut Decision,
    ) -> Result<(), DecisionError> {
        Algorithm::decide(self, *word, cost, now).map(|step| in_place(step, word, decision))
    }
    fn record(
        &self,
        word: &mut u64,
        cost: u64,
        now: u64,
        decision: &mut Decision,
    ) -> Result<(), DecisionError> {
        Algorithm::record(self, *word, cost, now).map(|step| in_place(step, word, decision))
    }
    #[inline]
    fn decide_word(&self, word: u64, cost: u64, now: u64, decision: &mut Decision) -> Option<u64> {
        let step = Algorithm::decide(self, word, cost, now).ok()?;
        *decision = step.decision;
        Some(step.next.unwrap_or(word))
    }
}

/// A step's answer into `decision` and its next state (if any) into `word`.
#[inline]
fn in_place(step: Step, word: &mut u64, decision: &mut Decision) {
    *decision = step.decision;
    if let Some(next) = step.next {
        *word = next;
    }
}
