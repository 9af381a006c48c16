//! A stack of rate limits and a concurrency limit against a reference model, all or nothing: a
//! call refused for want of a permit takes no rate units, a call a rate layer denies takes no
//! permit, and an admitted one takes both. Time stands still (a manual clock), so the rate
//! layer is a plain count per user.

use std::collections::HashMap;

use limiter_concurrency::{Admission, PermitStack, Refused};
use limiter_core::{Limit, ManualClock};
use limiter_stack::{Kind, Layer, Stack};
use proptest::prelude::*;

const RATE: u64 = 6;

#[derive(Clone, Debug)]
enum Op {
    Check { user: u8, cost: u64 },
    Release { which: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3, 1u64..4).prop_map(|(user, cost)| Op::Check { user, cost }),
        2 => any::<usize>().prop_map(|which| Op::Release { which }),
    ]
}

fn stack() -> Stack<u8, u8, ManualClock> {
    Stack::builder()
        .layer(
            Layer::keyed("user", |u: &u8| Some(*u))
                .limit(Kind::TokenBucket, Limit::per_minute(RATE)),
        )
        .clock(ManualClock::new())
        .build()
        .expect("valid")
}

proptest! {
    #[test]
    fn rates_and_permits_are_all_or_nothing(count in 1u64..4, ops in prop::collection::vec(op(), 1..60)) {
        let limiter = PermitStack::new(stack(), count, |u: &u8| Some(*u)).unwrap();
        let mut left: HashMap<u8, u64> = HashMap::new();
        let mut held: HashMap<u8, u64> = HashMap::new();
        let mut permits = Vec::new();
        for op in ops {
            match op {
                Op::Check { user, cost } => {
                    let rate_left = *left.entry(user).or_insert(RATE);
                    let in_flight = *held.entry(user).or_default();
                    match limiter.check_n(&user, cost).unwrap() {
                        Admission::Busy(refused) => {
                            prop_assert_eq!(in_flight, count);
                            prop_assert_eq!(refused, Refused::Busy { held: count, count });
                        }
                        Admission::Denied(decision) => {
                            prop_assert!(in_flight < count && cost > rate_left);
                            prop_assert_eq!(decision.decision().remaining(), rate_left);
                        }
                        Admission::Admitted { decision, permit } => {
                            prop_assert!(in_flight < count && cost <= rate_left);
                            left.insert(user, rate_left - cost);
                            held.insert(user, in_flight + 1);
                            prop_assert_eq!(decision.decision().remaining(), rate_left - cost);
                            permits.push(permit.expect("a keyed request holds a permit"));
                        }
                    }
                }
                Op::Release { which } => {
                    if !permits.is_empty() {
                        let permit = permits.swap_remove(which % permits.len());
                        *held.get_mut(permit.key()).expect("held") -= 1;
                    }
                }
            }
            for user in 0..3u8 {
                prop_assert_eq!(limiter.permits().held(&user), held.get(&user).copied().unwrap_or(0));
            }
        }
    }
}

#[test]
fn permits_in_a_store_of_another_hasher_decide_alike() {
    let store = limiter_store::ShardedStore::with_hasher(std::hash::RandomState::new());
    let permits = limiter_concurrency::KeyedConcurrency::with_store(1, store).expect("valid");
    let limiter = PermitStack::with_permits(stack(), permits, |u: &u8| Some(*u));
    let Admission::Admitted { permit, decision } = limiter.check(&1).expect("valid") else {
        panic!("a free permit and a full bucket admit")
    };
    assert_eq!(decision.decision().remaining(), RATE - 1);
    // The one permit is held: refused, and no rate unit is taken.
    assert!(matches!(
        limiter.check(&1).expect("valid"),
        Admission::Busy(Refused::Busy { held: 1, count: 1 })
    ));
    drop(permit);
    let Admission::Admitted { decision, .. } = limiter.check(&1).expect("valid") else {
        panic!("the permit was released")
    };
    assert_eq!(decision.decision().remaining(), RATE - 2);
}
