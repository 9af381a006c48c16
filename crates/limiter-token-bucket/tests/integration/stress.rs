//! Real threads hammering one bucket while the clock moves: the total admitted is exactly the
//! burst plus every unit the elapsed time refilled, no more and no fewer.

use std::sync::atomic::{AtomicU64, Ordering};

use limiter_core::Clock;
use limiter_token_bucket::{KeyedTokenBucket, Limit, ManualClock, TokenBucket};

const THREADS: usize = 4;
/// 1 unit per µs: `end` below refills two million units.
const PERIOD_NS: u64 = 1_000_000_000;
const COUNT: u64 = 1_000_000;
const BURST: u64 = 1_000;
/// Each denial moves the clock by 10 units' worth, so at most THREADS * 10 + 1 units are ever
/// stored at once: the bucket never fills, and no refill is lost to the cap.
const STEP_NS: u64 = 10_000;

/// Runs `check` from THREADS threads. A thread that is denied moves the clock one step, until
/// the clock reaches `end`; then each thread stops at its first denial, which leaves the bucket
/// drained at the final reading. Returns (admitted, final reading, calls).
fn hammer(clock: &ManualClock, end: u64, check: impl Fn() -> bool + Sync) -> (u64, u64, u64) {
    let admitted = AtomicU64::new(0);
    let calls = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..THREADS {
            scope.spawn(|| {
                let (mut mine, mut made) = (0, 0);
                loop {
                    made += 1;
                    if check() {
                        mine += 1;
                    } else if clock.now() < end {
                        clock.advance_nanos(STEP_NS);
                    } else {
                        break;
                    }
                }
                // Relaxed: the scope's join orders these with the reads below.
                admitted.fetch_add(mine, Ordering::Relaxed);
                calls.fetch_add(made, Ordering::Relaxed);
            });
        }
    });
    (admitted.into_inner(), clock.now(), calls.into_inner())
}

fn exact_total(elapsed_ns: u64) -> u64 {
    BURST + elapsed_ns * COUNT / PERIOD_NS
}

#[test]
fn threads_on_one_bucket_admit_exactly_what_time_refilled() {
    let limit = Limit::from_nanos(COUNT, PERIOD_NS).with_burst(BURST);
    let clock = ManualClock::new();
    let bucket = TokenBucket::with_clock(limit, clock.clone()).unwrap();
    let end = 2_000_000 * 1_000; // two million units of refill
    let (admitted, final_ns, calls) = hammer(&clock, end, || bucket.check().unwrap().is_allowed());
    assert!(calls >= 2_000_000, "only {calls} calls");
    assert!(final_ns >= end);
    assert_eq!(
        admitted,
        exact_total(final_ns),
        "{calls} calls over {final_ns} ns"
    );
}

#[test]
fn threads_on_one_key_admit_exactly_what_time_refilled() {
    let limit = Limit::from_nanos(COUNT, PERIOD_NS).with_burst(BURST);
    let clock = ManualClock::new();
    let keyed = KeyedTokenBucket::<u32, _>::with_clock(limit, clock.clone()).unwrap();
    let end = 500_000 * 1_000;
    let (admitted, final_ns, _) = hammer(&clock, end, || keyed.check_key(&7).unwrap().is_allowed());
    assert_eq!(admitted, exact_total(final_ns));
    assert!(
        keyed.check_key(&8).unwrap().is_allowed(),
        "another key was touched"
    );
}
