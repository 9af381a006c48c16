//! Millions of rotating keys (an attacker cycling through IPv6 addresses, say) keep every store
//! within its bound: the live entries of a `ShardedStore` stay within a small multiple of the
//! keys that are not full, and a `BoundedStore` never holds more than `max_keys`.

use limiter_core::{Limit, ManualClock};
use limiter_store::{BoundedStore, KeyedLimiter, Store};
use limiter_token_bucket::Gcra;

/// Twenty times the most keys ever not full at once ([`LIVE`]).
const KEYS: u64 = 2_000_000;
const CHECK_EVERY: u64 = 500_000;

/// 10/s with a burst of 10: one unit taken is back 100 ms later. With a new key every µs, at
/// most 100,000 keys are ever not full at once.
fn ten_per_second() -> Limit {
    Limit::per_second(10)
}
const LIVE: u64 = 100_000;

/// Touches `keys` keys once each, a µs apart, calling `check` every `CHECK_EVERY` keys.
fn rotate<St: Store<u64>>(
    limiter: &KeyedLimiter<Gcra, u64, ManualClock, St>,
    keys: u64,
    mut check: impl FnMut(u64),
) {
    for key in 0..keys {
        let decision = limiter.check_key(&key).expect("valid");
        assert!(decision.is_allowed(), "key {key}: {decision:?}");
        limiter.clock().advance_nanos(1_000);
        if key % CHECK_EVERY == CHECK_EVERY - 1 {
            check(key);
        }
    }
}

#[test]
fn sharded_store_stays_within_a_small_multiple_of_the_live_keys() {
    let limiter = KeyedLimiter::<Gcra, u64, _>::with_clock(ten_per_second(), ManualClock::new())
        .expect("valid");
    let mut most = 0;
    rotate(&limiter, KEYS, |key| {
        let stats = limiter.stats();
        let capacity = limiter.store().capacity() as u64;
        most = most.max(capacity);
        // Each shard grows only when a sweep leaves it three quarters full of keys that are
        // not full, so its room stays under 8/3 of its live keys (plus one table step).
        assert!(
            stats.keys <= capacity && capacity <= LIVE * 3,
            "after key {key}: {stats:?}, capacity {capacity}"
        );
    });
    let stats = limiter.stats();
    assert!(stats.reclaimed >= KEYS - LIVE * 3, "{stats:?}");
    eprintln!("sharded: most room {most} slots for at most {LIVE} live keys; {stats:?}");
}

#[test]
fn bounded_store_holds_at_most_max_keys_and_counts_every_eviction() {
    // An hour-long limit: no key is ever full again, so only evictions make room.
    let max_keys = 100_000;
    let limiter = KeyedLimiter::<Gcra, u64, _, _>::with_store(
        Limit::per_hour(10),
        ManualClock::new(),
        BoundedStore::new(max_keys).expect("valid"),
    )
    .expect("valid");
    // Twenty times the bound (moka inserts cost microseconds): 1.9 million evictions.
    let keys = max_keys * 20;
    rotate(&limiter, keys, |key| {
        let stats = limiter.stats();
        assert!(stats.keys <= max_keys, "after key {key}: {stats:?}");
        assert_eq!(
            stats.keys + stats.evicted,
            key + 1,
            "after key {key}: {stats:?}"
        );
    });
    let stats = limiter.stats();
    assert_eq!(stats.reclaimed, 0, "{stats:?}");
    assert_eq!(stats.evicted, keys - stats.keys, "{stats:?}");
}

#[test]
fn bounded_store_drops_idle_keys_before_it_has_to_evict() {
    // Room for half as many again as are ever live: idle keys go losslessly, none is evicted.
    let max_keys = LIVE * 3 / 2;
    let limiter = KeyedLimiter::<Gcra, u64, _, _>::with_store(
        ten_per_second(),
        ManualClock::new(),
        BoundedStore::new(max_keys).expect("valid"),
    )
    .expect("valid");
    // Twenty times the live keys (moka inserts cost microseconds; the bound is shown above).
    let keys = LIVE * 20;
    rotate(&limiter, keys, |key| {
        let stats = limiter.stats();
        assert!(stats.keys <= max_keys, "after key {key}: {stats:?}");
        assert_eq!(stats.evicted, 0, "after key {key}: {stats:?}");
    });
    let stats = limiter.stats();
    assert!(stats.reclaimed >= keys - max_keys, "{stats:?}");
}
