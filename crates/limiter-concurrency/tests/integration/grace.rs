//! The grace a key released to none gets, on a `ManualClock` and one shard (so every insert
//! past the table's room sweeps it): a key whose permits come and go stays in the table through
//! the sweeps instead of being forgotten and inserted again, and keys released a grace ago are
//! forgotten as new keys arrive, so memory stays bounded.

use std::time::Duration;

use limiter_concurrency::KeyedConcurrency;
use limiter_core::ManualClock;
use limiter_store::{DefaultHasher, ShardedStore};

fn one_shard(clock: &ManualClock) -> KeyedConcurrency<u64> {
    let store = ShardedStore::with_shards_and_hasher(1, DefaultHasher::default());
    KeyedConcurrency::with_store_and_clock(4, store, clock.clone()).expect("valid")
}

#[test]
fn keys_whose_permits_come_and_go_stay_through_the_sweeps() {
    let clock = ManualClock::new();
    let limiter = one_shard(&clock);
    // 64 keys in turn, each taken and released at once, for a thousand rounds within the grace:
    // the table grows to hold them and no key is ever forgotten (without the grace, each sweep
    // forgot every key and most acquires inserted again).
    for _ in 0..1_000 {
        for key in 0..64 {
            drop(limiter.try_acquire(&key).expect("a free permit"));
        }
        clock.advance(Duration::from_micros(100));
    }
    let stats = limiter.stats();
    assert_eq!((stats.keys, stats.reclaimed), (64, 0), "{stats:?}");
    // A round a second apart still finds every key: none was inserted, so none swept.
    clock.advance(Duration::from_secs(5));
    for key in 0..64 {
        drop(limiter.try_acquire(&key).expect("a free permit"));
    }
    assert_eq!(limiter.stats().reclaimed, 0);
    // An explicit reclaim forgets every key holding none, grace or not.
    let held = limiter.try_acquire(&3).expect("a free permit");
    assert_eq!(limiter.reclaim(), 63);
    assert_eq!(limiter.len(), 1);
    drop(held);
}

#[test]
fn keys_released_a_grace_ago_are_forgotten_as_new_keys_arrive() {
    let clock = ManualClock::new();
    let limiter = one_shard(&clock);
    for key in 0..10_000 {
        drop(limiter.try_acquire(&key).expect("a free permit"));
    }
    let held: Vec<_> = (0..10)
        .map(|key| limiter.try_acquire(&key).expect("a free permit"))
        .collect();
    assert_eq!(limiter.stats().reclaimed, 0, "within the grace");
    clock.advance(Duration::from_secs(2));
    // Ten thousand new keys overflow the table's room, so a sweep runs: it forgets every old key
    // holding none (released two seconds ago), keeps the ten held and every new one.
    for key in 10_000..20_000 {
        drop(limiter.try_acquire(&key).expect("a free permit"));
    }
    let stats = limiter.stats();
    assert_eq!((stats.keys, stats.reclaimed), (10_010, 9_990), "{stats:?}");
    for key in 0..10 {
        assert_eq!(limiter.held(&key), 1, "a held key is never forgotten");
    }
    drop(held);
}
