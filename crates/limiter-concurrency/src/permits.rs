//! [`PermitCount`]: the pure transition of a key's permits, the number held in one word, as an
//! [`Algorithm`] so the workspace's stores keep it (one lock-free word per key, a key dropped
//! once it holds none); [`Releasing`], the same word counted down; and the keyed limiter's
//! grace for a key released to none (`Recent`), so a key whose permits come and go is not
//! forgotten and inserted again by every sweep of its shard.

use limiter_core::{Algorithm, Clock, Decision, DecisionError, Limit, LimitError, Step, Usage};

use crate::sync::{AtomicU64, Ordering};

/// The most permits one key may hold: far below [`StateCell::RETIRED`](limiter_core::StateCell),
/// which a state word never takes.
pub const MAX_PERMITS: u64 = u32::MAX as u64;

/// The low bits of a state that count the permits held (at most twice [`MAX_PERMITS`], what a
/// record may reach, fits in 33); the 24 above are free for a stamp, never all ones with them.
const HELD_BITS: u32 = 40;

/// The permits a state holds.
#[inline(always)]
fn held(state: u64) -> u64 {
    state & ((1 << HELD_BITS) - 1)
}

/// The stamp bits of a state.
#[inline(always)]
fn stamp_bits(state: u64) -> u64 {
    state & !((1 << HELD_BITS) - 1)
}

/// A key's permits: its state is the number held (in its low 40 bits; the bits above are the
/// keyed limiter's stamp, which plays no part in a decision), `0` held is fresh and full, so a
/// store may forget a key as soon as its last permit is released. An acquire of `units` is
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

    fn decide(&self, state: u64, units: u64, _now: u64) -> Result<Step, DecisionError> {
        let held = held(state);
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
    fn record(&self, state: u64, units: u64, _now: u64) -> Result<Step, DecisionError> {
        let after = held(state).saturating_add(units).min(2 * self.count());
        Ok(Step {
            decision: self.answer(after, after <= self.count()),
            next: (units > 0).then_some(after),
        })
    }

    fn is_full(&self, state: u64, _now: u64) -> bool {
        held(state) == 0
    }

    fn usage(&self, state: u64, _now: u64) -> Usage {
        Usage::new(held(state), self.count())
    }

    fn with_usage(&self, usage: Usage, _now: u64) -> Result<u64, DecisionError> {
        Ok(usage.scaled_to(self.count()))
    }

    fn refund(&self, state: u64, units: u64, _granted_at: u64, _now: u64) -> Option<u64> {
        let held = held(state);
        (held > 0).then(|| held.saturating_sub(units))
    }
}

/// [`PermitCount`] counted down: each call releases `units` permits. Never refused, never
/// below zero, and a key holding none is not written (so a release never inserts a key). The
/// state's stamp bits are kept.
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

    #[inline]
    fn decide(&self, state: u64, units: u64, now: u64) -> Result<Step, DecisionError> {
        let after = self.0.refund(state, units, now, now);
        Ok(Step {
            decision: self.0.answer(after.unwrap_or(held(state)), true),
            next: after
                .filter(|_| units > 0)
                .map(|after| after | stamp_bits(state)),
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

/// How long a key released to none outlives a sweep: [`GRACE_STAMPS`] stamps of
/// 2^[`STAMP_SHIFT`] ns, about a second.
const STAMP_SHIFT: u32 = 27;
const GRACE_STAMPS: u64 = 8;
/// Stamps count modulo 2^24 (about 26 days): an old stamp that wraps round reads as recent
/// again for one grace, which only keeps a key that long.
const STAMP_MASK: u64 = (1 << (64 - HELD_BITS)) - 1;

/// The stamp of time `nanos`: never 0, the stamp of a key never stamped.
fn stamp_at(nanos: u64) -> u64 {
    ((nanos >> STAMP_SHIFT) & STAMP_MASK).max(1)
}

/// [`PermitCount`] as the keyed limiter's store applies it: a key is stamped with the time it
/// was inserted (the clock is read then, and only then), and a key holding none is full only
/// once its stamp is [`GRACE_STAMPS`] old, by the newest insert's reading (`recent`). A sweep
/// (which only an insert makes) so keeps every key inserted in about the last second: a key
/// whose permits come and go is inserted again at most about once a second, not after every
/// sweep of its shard (an insert takes the shard's write lock and may rebuild its table). Memory follows the keys with permits held and those inserted in the
/// last second or so; an explicit reclaim (with [`PermitCount`] itself) forgets every key
/// holding none.
pub(crate) struct Recent<'a> {
    pub(crate) permits: &'a PermitCount,
    pub(crate) clock: &'a dyn Clock,
    /// The newest insert's clock reading. Only a hint: a stale one keeps keys longer.
    pub(crate) recent: &'a AtomicU64,
}

impl Recent<'_> {
    /// `state`'s stamp, or for a key never stamped (an insert), the stamp of now.
    #[inline]
    fn stamp_of(&self, state: u64) -> u64 {
        let stamp = stamp_bits(state);
        if stamp != 0 {
            return stamp;
        }
        self.stamp_now()
    }

    /// The stamp of the clock's reading now, published as the newest insert's (out of line:
    /// only an insert reads the clock).
    #[cold]
    #[inline(never)]
    fn stamp_now(&self) -> u64 {
        let now = self.clock.now();
        // Relaxed: a hint, ordered with nothing (a late one only keeps keys longer).
        self.recent.fetch_max(now, Ordering::Relaxed);
        stamp_at(now) << HELD_BITS
    }
}

impl Algorithm for Recent<'_> {
    const NAME: &'static str = PermitCount::NAME;
    const FRESH: u64 = PermitCount::FRESH;

    /// A `Recent` wraps a [`PermitCount`] already built.
    fn new(limit: Limit) -> Result<Self, LimitError> {
        Err(LimitError::Unsupported {
            algorithm: Self::NAME,
            reason: format!("{limit}: the keyed limiter's grace wraps a PermitCount already built"),
        })
    }

    fn limit(&self) -> &Limit {
        self.permits.limit()
    }

    /// As [`PermitCount`] decides, the state written keeping its stamp (or stamped now).
    #[inline]
    fn decide(&self, state: u64, units: u64, now: u64) -> Result<Step, DecisionError> {
        let step = self.permits.decide(state, units, now)?;
        Ok(Step {
            next: step.next.map(|held| held | self.stamp_of(state)),
            ..step
        })
    }

    fn record(&self, state: u64, units: u64, now: u64) -> Result<Step, DecisionError> {
        let step = self.permits.record(state, units, now)?;
        Ok(Step {
            next: step.next.map(|held| held | self.stamp_of(state)),
            ..step
        })
    }

    /// Holding none and stamped at least a grace before the newest insert (`now` unread: the
    /// limiter reads no clock on a key it already holds).
    fn is_full(&self, state: u64, _now: u64) -> bool {
        if held(state) != 0 {
            return false;
        }
        let stamp = stamp_bits(state) >> HELD_BITS;
        // Relaxed: see `stamp_of`.
        let newest = stamp_at(self.recent.load(Ordering::Relaxed));
        stamp == 0 || newest.wrapping_sub(stamp) & STAMP_MASK >= GRACE_STAMPS
    }

    fn usage(&self, state: u64, now: u64) -> Usage {
        self.permits.usage(state, now)
    }

    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError> {
        self.permits.with_usage(usage, now)
    }

    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64> {
        self.permits.refund(state, units, granted_at, now)
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
        let stamped = 5 << HELD_BITS;
        assert_eq!(
            release.decide(stamped | 2, 1, 0).unwrap().next,
            Some(stamped | 1)
        );
        assert_eq!(
            release.decide(stamped | 1, 1, 0).unwrap().next,
            Some(stamped)
        );
        assert_eq!(release.decide(stamped, 1, 0).unwrap().next, None);
    }

    #[test]
    fn a_stamp_plays_no_part_in_a_decision() {
        let permits = three();
        let stamped = STAMP_MASK << HELD_BITS;
        for held in 0..=3 {
            for units in 0..=4 {
                let (with, without) = (
                    permits.decide(stamped | held, units, 0),
                    permits.decide(held, units, 0),
                );
                assert_eq!(with, without, "{held} held, {units} asked");
            }
            assert_eq!(permits.usage(stamped | held, 0), permits.usage(held, 0));
            assert_eq!(permits.is_full(stamped | held, 0), held == 0);
        }
        assert_ne!(
            stamped | (2 * MAX_PERMITS),
            limiter_core::StateCell::RETIRED
        );
    }

    #[test]
    fn a_key_released_to_none_is_full_once_its_stamp_is_a_grace_old() {
        let permits = three();
        let clock = limiter_core::ManualClock::starting_at(10 << STAMP_SHIFT);
        let recent = AtomicU64::new(0);
        let grace = Recent {
            permits: &permits,
            clock: &clock,
            recent: &recent,
        };
        // An insert reads the clock, stamps the key and publishes the reading.
        let inserted = grace.decide(0, 2, 0).unwrap().next.unwrap();
        assert_eq!((held(inserted), inserted >> HELD_BITS), (2, 10));
        assert_eq!(recent.load(Ordering::Relaxed), 10 << STAMP_SHIFT);
        // A key it holds keeps its stamp, the clock unread.
        clock.advance_nanos(100 << STAMP_SHIFT);
        let taken = grace.decide(inserted, 1, 0).unwrap().next.unwrap();
        assert_eq!(taken, inserted + 1);
        assert_eq!(recent.load(Ordering::Relaxed), 10 << STAMP_SHIFT);
        let released = 10 << HELD_BITS;
        assert!(!grace.is_full(released | 1, 0), "holds one");
        assert!(!grace.is_full(released, 0), "released within the grace");
        recent.store((10 + GRACE_STAMPS) << STAMP_SHIFT, Ordering::Relaxed);
        assert!(grace.is_full(released, 0), "a grace after its stamp");
        assert!(grace.is_full(0, 0), "never stamped");
        assert!(
            permits.is_full(released, 0),
            "an explicit reclaim forgets it at once"
        );
    }

    #[test]
    fn counts_out_of_range_are_refused_naming_the_range() {
        for count in [0, MAX_PERMITS + 1] {
            let err = PermitCount::new(Limit::new(count, Duration::from_secs(1))).unwrap_err();
            assert!(err.to_string().contains("1 to 4294967295"), "{err}");
        }
    }
}
