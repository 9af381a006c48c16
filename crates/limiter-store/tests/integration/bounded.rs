//! `BoundedStore`: idle keys go without loss, capacity evictions are counted (and reset the key,
//! the one lossy case), bad capacity is an error, and concurrent callers on a store under
//! eviction pressure never admit more than a key's burst while it stays in the store.

use std::sync::Barrier;
use std::time::Duration;

use limiter_core::{Limit, ManualClock};
use limiter_store::{BoundedStore, KeyedLimiter, StoreError};
use limiter_testkit::store::NeverForget;
use limiter_token_bucket::Gcra;

fn bounded(limit: Limit, max_keys: u64) -> KeyedLimiter<Gcra, u64, ManualClock, BoundedStore<u64>> {
    KeyedLimiter::with_store(
        limit,
        ManualClock::new(),
        BoundedStore::new(max_keys).expect("valid"),
    )
    .expect("valid")
}

#[test]
fn zero_capacity_is_an_error_that_says_what_to_set() {
    let err = BoundedStore::<u64>::new(0).unwrap_err();
    assert_eq!(err, StoreError::ZeroCapacity);
    assert!(
        err.to_string().contains("set max_keys to 1 or more"),
        "{err}"
    );
}

#[test]
fn idle_keys_are_dropped_without_loss_before_any_eviction() {
    let limit = Limit::per_second(4);
    let limiter = bounded(limit, 8);
    let reference =
        KeyedLimiter::<Gcra, u64, _, _>::with_store(limit, ManualClock::new(), NeverForget::new())
            .expect("valid");
    let both = |key: u64, cost: u64| {
        let got = limiter.check_key_n(&key, cost).expect("valid");
        assert_eq!(
            got,
            reference.check_key_n(&key, cost).expect("valid"),
            "key {key}"
        );
        got
    };
    for key in 0..8 {
        assert!(both(key, 3).is_allowed());
    }
    // Half a second: keys 0..8 have 2 of 4 units back, so none is full and none may go.
    limiter.clock().advance(Duration::from_millis(500));
    reference.clock().advance(Duration::from_millis(500));
    for key in 0..8 {
        assert!(both(key, 2).is_allowed());
    }
    // A second later all eight are full again; eight new keys take their places as they arrive.
    limiter.clock().advance(Duration::from_secs(1));
    reference.clock().advance(Duration::from_secs(1));
    for key in 8..16 {
        assert!(both(key, 1).is_allowed());
    }
    let stats = limiter.stats();
    assert_eq!(stats.evicted, 0, "{stats:?}");
    assert_eq!(stats.reclaimed, 8, "{stats:?}");
    assert_eq!(stats.keys, 8, "{stats:?}");
    // The old keys decide exactly as if they had been kept.
    for key in 0..8 {
        assert_eq!(both(key, 4).remaining(), 0);
    }
}

#[test]
fn capacity_eviction_is_counted_and_resets_the_evicted_key() {
    let limit = Limit::per_hour(2);
    let limiter = bounded(limit, 3);
    for key in 0..3 {
        assert!(limiter.check_key_n(&key, 2).expect("valid").is_allowed());
    }
    // Touch 1 and 2 so that 0 is the least recently used.
    for key in [1, 2] {
        assert!(limiter.check_key(&key).expect("valid").is_denied());
    }
    limiter.stats(); // let moka record the reads before the next insert
    assert!(limiter.check_key(&3).expect("valid").is_allowed());
    let stats = limiter.stats();
    assert_eq!(
        (stats.keys, stats.evicted, stats.reclaimed),
        (3, 1, 0),
        "{stats:?}"
    );
    // Key 0 was drained; evicted, it starts again from full: the documented lossy case.
    let reset = limiter.check_key_n(&0, 2).expect("valid");
    assert!(reset.is_allowed(), "{reset:?}");
    assert!(
        limiter.check_key(&1).expect("valid").is_denied(),
        "a kept key was reset"
    );
    assert_eq!(limiter.stats().evicted, 2);
}

#[test]
fn racing_threads_never_exceed_a_burst_on_keys_that_stay() {
    // 64 keys of 50 units, room for all of them: 4 threads race for every unit on every key
    // while a fifth reclaims (nothing is ever full: the clock stands still).
    let limit = Limit::per_hour(50);
    let limiter = bounded(limit, 64);
    let threads = 4;
    let start = Barrier::new(threads + 1);
    let admitted: u64 = std::thread::scope(|scope| {
        let racers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    let mut admitted = 0u64;
                    for round in 0..60 {
                        for key in 0..64u64 {
                            let key = (key + round) % 64;
                            admitted +=
                                u64::from(limiter.check_key(&key).expect("valid").is_allowed());
                        }
                    }
                    admitted
                })
            })
            .collect();
        scope.spawn(|| {
            start.wait();
            for _ in 0..200 {
                assert_eq!(limiter.reclaim_full(), 0);
            }
        });
        racers.into_iter().map(|h| h.join().expect("racer")).sum()
    });
    assert_eq!(admitted, 64 * 50);
    let stats = limiter.stats();
    assert_eq!((stats.keys, stats.evicted), (64, 0), "{stats:?}");
}

#[test]
fn racing_threads_over_capacity_stay_bounded_and_count_evictions() {
    let limit = Limit::per_hour(1_000);
    let limiter = bounded(limit, 1_000);
    std::thread::scope(|scope| {
        for thread in 0..4u64 {
            let limiter = &limiter;
            scope.spawn(move || {
                for key in 0..20_000u64 {
                    let decision = limiter
                        .check_key(&(thread * 1_000_000 + key))
                        .expect("valid");
                    assert!(decision.is_allowed());
                }
            });
        }
    });
    let stats = limiter.stats();
    assert!(stats.keys <= 1_000, "{stats:?}");
    assert_eq!(stats.keys + stats.evicted, 80_000, "{stats:?}");
}
