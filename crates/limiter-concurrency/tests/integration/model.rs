//! The keyed concurrency limiter against a reference model: a map of the permits each key
//! holds, where an acquire is admitted iff it fits under the count and a release gives back
//! exactly what its permit took, once. Random acquires, releases (explicit or by drop),
//! reclamations and the clock's steps on a few dozen keys in one shard (so inserts sweep it and
//! released keys outlive their grace or not), checked after every step.

use std::collections::HashMap;

use std::time::Duration;

use limiter_concurrency::{KeyedConcurrency, Permit, Refused};
use limiter_core::ManualClock;
use limiter_store::{DefaultHasher, ShardedStore};
use proptest::prelude::*;

const KEYS: u8 = 24;

#[derive(Clone, Debug)]
enum Op {
    Acquire { key: u8, units: u64 },
    Release { which: usize, explicitly: bool },
    Reclaim,
    Advance { millis: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..KEYS, 0u64..5).prop_map(|(key, units)| Op::Acquire { key, units }),
        3 => (any::<usize>(), any::<bool>())
            .prop_map(|(which, explicitly)| Op::Release { which, explicitly }),
        1 => Just(Op::Reclaim),
        1 => (0u64..3_000).prop_map(|millis| Op::Advance { millis }),
    ]
}

proptest! {
    #[test]
    fn permits_match_the_reference_model(count in 1u64..5, ops in prop::collection::vec(op(), 1..160)) {
        let clock = ManualClock::new();
        let store = ShardedStore::with_shards_and_hasher(1, DefaultHasher::default());
        let limiter =
            KeyedConcurrency::<u8>::with_store_and_clock(count, store, clock.clone()).unwrap();
        let mut model: HashMap<u8, u64> = HashMap::new();
        let mut permits: Vec<Permit<'_, u8>> = Vec::new();
        for op in ops {
            match op {
                Op::Acquire { key, units } => {
                    let held = model.get(&key).copied().unwrap_or(0);
                    let answer = limiter.try_acquire_n(&key, units);
                    let expected = if units == 0 {
                        Err(Refused::Zero)
                    } else if units > count {
                        Err(Refused::TooMany { units, count })
                    } else if held + units > count {
                        Err(Refused::Busy { held, count })
                    } else {
                        Ok(units)
                    };
                    prop_assert_eq!(answer.as_ref().map(|p| p.units()).map_err(|e| *e), expected);
                    if let Ok(permit) = answer {
                        *model.entry(key).or_default() += units;
                        permits.push(permit);
                    }
                }
                Op::Release { which, explicitly } => {
                    if permits.is_empty() {
                        continue;
                    }
                    let permit = permits.swap_remove(which % permits.len());
                    let (key, units) = (*permit.key(), permit.units());
                    let left = model.get_mut(&key).expect("a held key");
                    *left -= units;
                    if explicitly {
                        prop_assert_eq!(permit.release(), *left);
                    } else {
                        drop(permit);
                    }
                }
                Op::Reclaim => {
                    limiter.reclaim();
                    let held_keys = model.values().filter(|&&held| held > 0).count();
                    prop_assert_eq!(limiter.len(), held_keys as u64);
                }
                Op::Advance { millis } => clock.advance(Duration::from_millis(millis)),
            }
            for key in 0..KEYS {
                let held = model.get(&key).copied().unwrap_or(0);
                prop_assert!(held <= count);
                prop_assert_eq!(limiter.held(&key), held);
            }
        }
        drop(permits);
        limiter.reclaim();
        prop_assert!(limiter.is_empty(), "every permit released, every key forgotten");
    }
}
