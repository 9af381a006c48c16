//! Loom models of the compare-and-swap protocol on the window counters: concurrent callers
//! never push a window past its count, and denials and peeks write nothing.
//! Run with `cargo xtask loom`.
#![cfg(limiter_loom)]

use limiter_core::{Algorithm, DirectLimiter, Limit, ManualClock};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use loom::sync::Arc;
use loom::thread;

fn limiter<A: Algorithm>(count: u64, clock: &ManualClock) -> Arc<DirectLimiter<A, ManualClock>> {
    Arc::new(DirectLimiter::with_clock(Limit::per_second(count), clock.clone()).unwrap())
}

fn race<A: Algorithm + 'static>(
    limiter: &Arc<DirectLimiter<A, ManualClock>>,
    threads: usize,
    cost: u64,
) -> u64 {
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let limiter = Arc::clone(limiter);
            thread::spawn(move || u64::from(limiter.check_n(cost).unwrap().is_allowed()))
        })
        .collect();
    handles.into_iter().map(|h| h.join().unwrap()).sum()
}

fn exactly_count_admitted<A: Algorithm + 'static>() {
    loom::model(|| {
        let clock = ManualClock::new();
        let limiter = limiter::<A>(2, &clock);
        assert_eq!(race(&limiter, 3, 1), 2);
        assert_eq!(limiter.peek().unwrap().remaining(), 0);
    });
}

#[test]
fn sliding_three_threads_two_units_exactly_two_admitted() {
    exactly_count_admitted::<SlidingCounter>();
}

#[test]
fn fixed_three_threads_two_units_exactly_two_admitted() {
    exactly_count_admitted::<FixedCounter>();
}

#[test]
fn sliding_weighted_costs_never_oversubscribe() {
    loom::model(|| {
        let clock = ManualClock::new();
        let limiter = limiter::<SlidingCounter>(3, &clock);
        assert_eq!(race(&limiter, 2, 2), 1);
        assert_eq!(limiter.peek().unwrap().remaining(), 1);
    });
}

#[test]
fn sliding_callers_racing_a_window_change_see_one_consistent_window() {
    loom::model(|| {
        let clock = ManualClock::new();
        let limiter = limiter::<SlidingCounter>(2, &clock);
        assert!(limiter.check_n(2).unwrap().is_allowed());
        // Half a window later one unit has decayed; a mover makes that happen while two callers
        // race. At most one of them can take it, and one is left for the final call if not.
        let mover = {
            let clock = clock.clone();
            thread::spawn(move || clock.set(1_500_000_000))
        };
        let admitted = race(&limiter, 2, 1);
        mover.join().unwrap();
        let last = u64::from(limiter.check().unwrap().is_allowed());
        assert_eq!(admitted + last, 1);
    });
}

#[test]
fn denials_and_peeks_write_nothing() {
    loom::model(|| {
        let clock = ManualClock::new();
        let limiter = limiter::<SlidingCounter>(1, &clock);
        assert!(limiter.check().unwrap().is_allowed());
        let before = limiter.peek().unwrap();
        let denier = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.check().unwrap().is_denied())
        };
        let peeker = {
            let limiter = Arc::clone(&limiter);
            thread::spawn(move || limiter.peek().unwrap())
        };
        assert!(denier.join().unwrap());
        assert_eq!(peeker.join().unwrap(), before);
        assert_eq!(limiter.peek().unwrap(), before);
    });
}
