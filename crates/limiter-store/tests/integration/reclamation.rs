//! Reclamation never changes a decision: every store, sweeping and reclaiming full keys as it
//! goes, decides every call of a random sequence exactly as a store that never forgets does.
//! (The clock only moves forward here: a full key may be told apart from an absent one only at
//! a reading earlier than the one that dropped it.)

use limiter_core::{Algorithm, Limit, ManualClock};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_store::{BoundedStore, DefaultHasher, KeyedLimiter, ShardedStore, Store};
use limiter_testkit::harness::proptest_config;
use limiter_testkit::store::NeverForget;
use limiter_token_bucket::Gcra;
use proptest::prelude::*;

#[derive(Clone, Copy, Debug)]
enum Op {
    Advance(u64),
    Check { key: u64, cost: u64 },
    Reclaim,
}

/// Twelve keys (enough to make a one-shard table sweep as it fills), time in steps around the
/// 10 ns refill interval of `limit()`, costs around its burst of 3.
fn ops() -> impl Strategy<Value = Vec<Op>> {
    let op = prop_oneof![
        6 => (0..12u64, prop_oneof![4 => Just(1u64), 2 => 0..=4u64])
            .prop_map(|(key, cost)| Op::Check { key, cost }),
        3 => prop_oneof![0..=25u64, Just(0), Just(1_000)].prop_map(Op::Advance),
        1 => Just(Op::Reclaim),
    ];
    proptest::collection::vec(op, 0..300)
}

fn limit() -> Limit {
    Limit::from_nanos(3, 30)
}

fn same_decisions<A: Algorithm, St: Store<u64>>(store: St, ops: &[Op]) -> Result<(), String> {
    let start = 1 << 20;
    let limiter =
        KeyedLimiter::<A, u64, _, St>::with_store(limit(), ManualClock::starting_at(start), store)
            .map_err(|e| e.to_string())?;
    let reference = KeyedLimiter::<A, u64, _, _>::with_store(
        limit(),
        ManualClock::starting_at(start),
        NeverForget::new(),
    )
    .map_err(|e| e.to_string())?;
    let mut reclaimed = 0;
    for (i, op) in ops.iter().enumerate() {
        match *op {
            Op::Advance(ns) => {
                limiter.clock().advance_nanos(ns);
                reference.clock().advance_nanos(ns);
            }
            Op::Check { key, cost } => {
                let got = limiter.check_key_n(&key, cost);
                let want = reference.check_key_n(&key, cost);
                if got != want {
                    return Err(format!("op {i} {op:?}: store {got:?}, reference {want:?}"));
                }
            }
            Op::Reclaim => reclaimed += limiter.reclaim_full(),
        }
    }
    let stats = limiter.stats();
    if stats.reclaimed < reclaimed || stats.keys > reference.stats().keys || stats.evicted != 0 {
        return Err(format!(
            "inconsistent stats {stats:?} after reclaiming {reclaimed}"
        ));
    }
    Ok(())
}

fn every_store<A: Algorithm>(ops: &[Op]) -> Result<(), String> {
    same_decisions::<A, _>(
        ShardedStore::with_shards_and_hasher(1, DefaultHasher::default()),
        ops,
    )
    .map_err(|e| format!("one-shard ShardedStore: {e}"))?;
    same_decisions::<A, _>(ShardedStore::new(), ops).map_err(|e| format!("ShardedStore: {e}"))?;
    let bounded = BoundedStore::new(64).map_err(|e| e.to_string())?;
    same_decisions::<A, _>(bounded, ops).map_err(|e| format!("BoundedStore: {e}"))
}

proptest! {
    #![proptest_config(proptest_config(256))]

    #[test]
    fn token_bucket_reclamation_changes_no_decision(ops in ops()) {
        every_store::<Gcra>(&ops).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn sliding_window_reclamation_changes_no_decision(ops in ops()) {
        every_store::<SlidingCounter>(&ops).map_err(TestCaseError::fail)?;
    }

    #[test]
    fn fixed_window_reclamation_changes_no_decision(ops in ops()) {
        every_store::<FixedCounter>(&ops).map_err(TestCaseError::fail)?;
    }
}

/// The sweeps do run in these sequences: a one-shard store that fills with keys that are all
/// full again drops them as it grows, instead of growing.
#[test]
fn a_filling_shard_drops_full_keys_instead_of_growing() {
    let clock = ManualClock::starting_at(1 << 20);
    let store = ShardedStore::with_shards_and_hasher(1, DefaultHasher::default());
    let limiter =
        KeyedLimiter::<Gcra, u64, _, _>::with_store(limit(), clock.clone(), store).expect("valid");
    for key in 0..10_000 {
        assert!(limiter.check_key(&key).expect("valid").is_allowed());
        clock.advance_nanos(10); // each key is full again 10 ns after its one unit
    }
    let stats = limiter.stats();
    assert!(stats.keys <= 4, "{stats:?}");
    assert!(stats.reclaimed >= 9_996, "{stats:?}");
    assert!(
        limiter.store().capacity() <= 7,
        "{}",
        limiter.store().capacity()
    );
}
