//! [`PermitCount`]: the pure transition of a key's permits, the number held in one word, as an
//! [`Algorithm`] so the workspace's stores keep it (one lock-free word per key, a key dropped
//! once it holds none); and [`Releasing`], the same word counted down.

use limiter_core::{Algorithm, Decision, DecisionError, Limit, LimitError, Step, Usage};

/// The most permits one key may hold: far below [`StateCell::RETIRED`](limiter_core::StateCell),
/// which a state word never takes.
pub const MAX_PERMITS: u64 = u32::MAX as u64;

/// A key's permits: its state is the number held, `0` (no permit held) is fresh and full, so a
/// store forgets a key as soon as its last permit is released. An acquire of `units` is
/// admitted iff `held + units <= count`; time plays no part (a permit is held until it is
/// released), so a denial's waits are the shortest there is (1 ns): when a permit frees is not
/// known here, and an adapter answering a client picks its own hint.
#[derive(Clone, Copy, Debug)]
pub struct PermitCount {
    limit: Limit,
}

impl PermitCount {
    /// The permits one key may hold.
    pub fn count(&self) -> u64 {
        self.limit.count()
    }

    fn answer(&self, held: u64, allowed: bool) -> Decision {
        let left = self.count().saturating_sub(held);
        if allowed {
            Decision::allow(self.count(), left, 0)
        } else {
            Decision::deny(self.count(), left, 1, 1)
        }
    }
}

impl Algorithm for PermitCount {
    const NAME: &'static str = "concurrency";
    const FRESH: u64 = 0;

    /// At most `limit.count()` permits held per key (1 to [`MAX_PERMITS`]); the period plays
    /// no part in process.
    fn new(limit: Limit) -> Result<Self, LimitError> {
        let count = limit.count();
        if count == 0 || count > MAX_PERMITS {
            return Err(LimitError::Unsupported {
                algorithm: Self::NAME,
                reason: format!(
                    "{count} permits per key: a key holds 1 to {MAX_PERMITS} permits; give a count in that range"
                ),
            });
        }
        Ok(Self { limit })
    }

    fn limit(&self) -> &Limit {
        &self.limit
    }

    fn decide(&self, held: u64, units: u64, _now: u64) -> Result<Step, DecisionError> {
        if units > self.count() {
            return Err(DecisionError::CostExceedsBurst {
                cost: units,
                burst: self.count(),
            });
        }
        let after = held.saturating_add(units);
        let allowed = after <= self.count();
        let next = (allowed && units > 0).then_some(after);
        Ok(Step {
            decision: self.answer(if allowed { after } else { held }, allowed),
            next,
        })
    }

    /// Permits taken whatever is held (a holder the limiter could not refuse), up to twice the
    /// count.
    fn record(&self, held: u64, units: u64, _now: u64) -> Result<Step, DecisionError> {
        let after = held.saturating_add(units).min(2 * self.count());
        Ok(Step {
            decision: self.answer(after, after <= self.count()),
            next: (units > 0).then_some(after),
        })
    }

    fn is_full(&self, held: u64, _now: u64) -> bool {
        held == 0
    }

    fn usage(&self, held: u64, _now: u64) -> Usage {
        Usage::new(held, self.count())
    }

    fn with_usage(&self, usage: Usage, _now: u64) -> Result<u64, DecisionError> {
        Ok(usage.scaled_to(self.count()))
    }

    fn refund(&self, held: u64, units: u64, _granted_at: u64, _now: u64) -> Option<u64> {
        (held > 0).then(|| held.saturating_sub(units))
    }
}

/// [`PermitCount`] counted down: each call releases `units` permits. Never refused, never
/// below zero, and a key holding none is not written (so a release never inserts a key).
#[derive(Clone, Copy, Debug)]
pub struct Releasing<'a>(pub &'a PermitCount);

impl Algorithm for Releasing<'_> {
    const NAME: &'static str = PermitCount::NAME;
    const FRESH: u64 = PermitCount::FRESH;

    /// A `Releasing` wraps a [`PermitCount`] already built.
    fn new(limit: Limit) -> Result<Self, LimitError> {
        Err(LimitError::Unsupported {
            algorithm: Self::NAME,
            reason: format!("{limit}: a Releasing wraps a PermitCount already built"),
        })
    }

    fn limit(&self) -> &Limit {
        self.0.limit()
    }

    fn decide(&self, held: u64, units: u64, now: u64) -> Result<Step, DecisionError> {
        let after = self.0.refund(held, units, now, now);
        Ok(Step {
            decision: self.0.answer(after.unwrap_or(held), true),
            next: after.filter(|_| units > 0),
        })
    }

    fn record(&self, held: u64, units: u64, now: u64) -> Result<Step, DecisionError> {
        self.decide(held, units, now)
    }

    fn is_full(&self, held: u64, now: u64) -> bool {
        self.0.is_full(held, now)
    }

    fn usage(&self, held: u64, now: u64) -> Usage {
        self.0.usage(held, now)
    }

    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError> {
        self.0.with_usage(usage, now)
    }

    fn refund(&self, held: u64, units: u64, granted_at: u64, now: u64) -> Option<u64> {
        self.0.refund(held, units, granted_at, now)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn three() -> PermitCount {
        PermitCount::new(Limit::new(3, Duration::from_secs(30))).expect("valid")
    }

    #[test]
    fn acquires_up_to_the_count_and_a_denial_writes_nothing() {
        let permits = three();
        let step = permits.decide(2, 1, 0).expect("fits");
        assert_eq!((step.next, step.decision.remaining()), (Some(3), 0));
        let denied = permits.decide(3, 1, 0).expect("decidable");
        assert!(denied.decision.is_denied());
        assert_eq!(denied.next, None);
        assert_eq!(
            permits.decide(0, 4, 0).unwrap_err(),
            DecisionError::CostExceedsBurst { cost: 4, burst: 3 }
        );
    }

    #[test]
    fn a_release_counts_down_never_below_zero_and_never_writes_an_empty_key() {
        let permits = three();
        let release = Releasing(&permits);
        assert_eq!(release.decide(2, 1, 0).unwrap().next, Some(1));
        assert_eq!(release.decide(1, 5, 0).unwrap().next, Some(0));
        assert_eq!(release.decide(0, 1, 0).unwrap().next, None);
        assert!(permits.is_full(0, 0) && !permits.is_full(1, 0));
    }

    #[test]
    fn counts_out_of_range_are_refused_naming_the_range() {
        for count in [0, MAX_PERMITS + 1] {
            let err = PermitCount::new(Limit::new(count, Duration::from_secs(1))).unwrap_err();
            assert!(err.to_string().contains("1 to 4294967295"), "{err}");
        }
    }
}
