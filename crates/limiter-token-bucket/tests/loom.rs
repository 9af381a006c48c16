//! Loom models of the compare-and-swap protocol in `StateCell::apply`, on the token bucket.
//! Run with `cargo xtask loom` (`RUSTFLAGS="--cfg limiter_loom"`, release, 2 preemptions).
#![cfg(limiter_loom)]

use limiter_core::Limit;
use limiter_token_bucket::{ManualClock, TokenBucket};
use loom::sync::Arc;
use loom::thread;

fn bucket(burst: u64, clock: &ManualClock) -> Arc<TokenBucket<ManualClock>> {
    let limit = Limit::per_second(10).with_burst(burst);
    Arc::new(TokenBucket::with_clock(limit, clock.clone()).unwrap())
}

/// Runs `threads` callers of `cost` each; returns how many were admitted and the final peek.
fn race(bucket: &Arc<TokenBucket<ManualClock>>, threads: usize, cost: u64) -> (u64, u64) {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let bucket = Arc::clone(bucket);
            thread::spawn(move || u64::from(bucket.check_n(cost).unwrap().is_allowed()))
        })
        .collect();
    let admitted = handles.into_iter().map(|h| h.join().unwrap()).sum();
    (admitted, bucket.peek().unwrap().remaining())
}

#[test]
fn two_threads_one_unit_left_exactly_one_admitted() {
    loom::model(|| {
        let clock = ManualClock::new();
        let bucket = bucket(1, &clock);
        assert_eq!(race(&bucket, 2, 1), (1, 0));
    });
}

#[test]
fn three_threads_two_units_left_exactly_two_admitted() {
    loom::model(|| {
        let clock = ManualClock::new();
        let bucket = bucket(2, &clock);
        assert_eq!(race(&bucket, 3, 1), (2, 0));
    });
}

#[test]
fn weighted_costs_never_oversubscribe() {
    loom::model(|| {
        let clock = ManualClock::new();
        let bucket = bucket(3, &clock);
        // Two calls of 2 on 3 units: exactly one fits, and one unit is left.
        assert_eq!(race(&bucket, 2, 2), (1, 1));
    });
}

#[test]
fn denials_and_peeks_on_a_drained_bucket_write_nothing() {
    loom::model(|| {
        let clock = ManualClock::new();
        let bucket = bucket(2, &clock);
        assert!(bucket.check_n(2).unwrap().is_allowed());
        let before = bucket.peek().unwrap();
        let denier = {
            let bucket = Arc::clone(&bucket);
            thread::spawn(move || bucket.check().unwrap().is_denied())
        };
        let peeker = {
            let bucket = Arc::clone(&bucket);
            thread::spawn(move || bucket.peek().unwrap())
        };
        assert!(denier.join().unwrap());
        assert_eq!(peeker.join().unwrap(), before);
        assert_eq!(bucket.peek().unwrap(), before);
    });
}

#[test]
fn a_refill_racing_with_callers_is_counted_once() {
    loom::model(|| {
        let clock = ManualClock::new();
        let bucket = bucket(1, &clock);
        assert!(bucket.check().unwrap().is_allowed());
        // One thread moves time by one interval while two callers race: at most one of them can
        // get the refilled unit, and whichever did not must leave it for the final check.
        let mover = {
            let clock = clock.clone();
            thread::spawn(move || clock.advance(std::time::Duration::from_millis(100)))
        };
        let (admitted, _) = race(&bucket, 2, 1);
        mover.join().unwrap();
        let last = u64::from(bucket.check().unwrap().is_allowed());
        assert_eq!(admitted + last, 1);
    });
}

#[test]
fn a_record_racing_a_check_always_lands_and_the_check_sees_it_or_not() {
    loom::model(|| {
        let clock = ManualClock::new();
        // One unit left: the record takes it (and owes one more) or the check does first.
        let bucket = bucket(2, &clock);
        assert!(bucket.check().unwrap().is_allowed());
        let recorder = {
            let bucket = Arc::clone(&bucket);
            thread::spawn(move || bucket.record(2).unwrap().is_denied())
        };
        let checker = {
            let bucket = Arc::clone(&bucket);
            thread::spawn(move || bucket.check().unwrap().is_allowed())
        };
        let over = recorder.join().unwrap();
        let admitted = checker.join().unwrap();
        // Either order leaves the bucket owing: 1 + 2 (+1 if the check came first) of 2.
        assert!(over, "a record past the limit says so");
        let after = bucket.peek().unwrap();
        assert!(after.is_denied(), "the record was lost: {after:?}");
        // The debt the bucket carries: when the next unit fits (a unit is 100 ms).
        let owed = if admitted { 3 } else { 2 };
        clock.advance(std::time::Duration::from_millis(100 * owed - 1));
        assert!(bucket.check().unwrap().is_denied());
        clock.advance(std::time::Duration::from_millis(1));
        assert!(bucket.check().unwrap().is_allowed());
    });
}
