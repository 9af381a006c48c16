//! Real threads on one window counter (direct and one key) while the clock crosses windows: in
//! every window exactly `count` units are admitted, because the threads keep asking until denied
//! before the clock moves on.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};

use limiter_sliding_window::{FixedWindow, KeyedSlidingWindow, Limit, ManualClock, SlidingWindow};

const THREADS: usize = 4;
const COUNT: u64 = 5_000;
const WINDOWS: u64 = 100;
const PERIOD_NS: u64 = 1_000_000;

/// Per window: every thread calls until denied, then all meet; one moves the clock a whole
/// window ahead. Returns the units admitted in each window.
fn per_window(clock: &ManualClock, check: impl Fn() -> bool + Sync) -> Vec<u64> {
    let meet = Barrier::new(THREADS);
    let admitted: Vec<AtomicU64> = (0..WINDOWS).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            let (meet, admitted, check) = (&meet, &admitted, &check);
            scope.spawn(move || {
                for window in admitted {
                    let mut mine = 0;
                    while check() {
                        mine += 1;
                    }
                    // Relaxed: the barrier below orders it with the reads after the scope.
                    window.fetch_add(mine, Ordering::Relaxed);
                    if meet.wait().is_leader() {
                        clock.advance_nanos(PERIOD_NS);
                    }
                    meet.wait();
                }
            });
        }
    });
    admitted.into_iter().map(AtomicU64::into_inner).collect()
}

fn limit() -> Limit {
    Limit::from_nanos(COUNT, PERIOD_NS)
}

#[test]
fn fixed_window_admits_exactly_count_per_window_under_contention() {
    let clock = ManualClock::new();
    let window = FixedWindow::with_clock(limit(), clock.clone()).unwrap();
    let counts = per_window(&clock, || window.check().unwrap().is_allowed());
    assert!(counts.iter().all(|&c| c == COUNT), "{counts:?}");
}

/// Each window starts with the previous one overlapping fully (the clock jumps a whole window
/// at a time), so a full window leaves the next one nothing and an empty one leaves the next
/// the whole count: exactly COUNT, 0, COUNT, 0, ...
fn alternating(counts: &[u64]) -> bool {
    counts
        .iter()
        .enumerate()
        .all(|(i, &c)| c == if i % 2 == 0 { COUNT } else { 0 })
}

#[test]
fn sliding_window_admits_exactly_what_the_weighted_count_allows_under_contention() {
    let clock = ManualClock::new();
    let direct = SlidingWindow::with_clock(limit(), clock.clone()).unwrap();
    let counts = per_window(&clock, || direct.check().unwrap().is_allowed());
    assert!(alternating(&counts), "{counts:?}");

    let clock = ManualClock::new();
    let keyed = KeyedSlidingWindow::<u8, _>::with_clock(limit(), clock.clone()).unwrap();
    let counts = per_window(&clock, || keyed.check_key(&1).unwrap().is_allowed());
    assert!(alternating(&counts), "{counts:?}");
}
