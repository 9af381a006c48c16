//! The keys a stack holds: a new key's entry only once a call wrote it (a denial, a peek or an
//! error leaves none); and `max_keys` exact, whatever the shards: a stack admits new keys until
//! it holds exactly `max_keys` entries that are not full, then refuses new ones; full entries in
//! any shard make room; and threads racing to insert never push it past the bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use limiter_core::{Limit, ManualClock};
use limiter_stack::{BuildError, CallError, Kind, Layer, LayerAnswers, Stack};

fn bounded(max_keys: usize, clock: &ManualClock) -> Stack<u64, u64, ManualClock> {
    Stack::builder()
        .layer(
            Layer::keyed("id", |r: &u64| Some(*r)).limit(Kind::FixedWindow, Limit::per_minute(1)),
        )
        .max_keys(max_keys)
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn new_keys_are_admitted_until_exactly_max_keys_then_refused() {
    for max in [1, 10, 100, 1_000] {
        let clock = ManualClock::new();
        let stack = bounded(max, &clock);
        for id in 0..max as u64 {
            let d = stack
                .check(&id)
                .unwrap_or_else(|e| panic!("max {max}: key {id}: {e}"));
            assert!(d.is_allowed());
        }
        assert_eq!(stack.len(), max as u64);
        let err = stack.check(&(max as u64)).unwrap_err();
        assert!(
            matches!(err, CallError::Full { max_keys, .. } if max_keys == max),
            "{err}"
        );
        assert_eq!(stack.len(), max as u64, "a refused key leaves nothing");
        // Held keys go on (denied: their minute is used).
        assert!(stack.check(&0).unwrap().is_denied());
        // A minute on, every entry is full again, wherever its shard: new keys fill the
        // bound again, exactly.
        clock.advance(Duration::from_secs(60));
        for id in 10_000..10_000 + max as u64 {
            assert!(
                stack.check(&id).unwrap().is_allowed(),
                "max {max}: key {id}"
            );
        }
        assert!(matches!(stack.check(&1), Err(CallError::Full { .. })));
    }
}

#[test]
fn a_denied_call_on_a_new_key_gives_its_place_back() {
    let clock = ManualClock::new();
    let stack: Stack<(u64, u64), u64, ManualClock> = Stack::builder()
        .layer(
            Layer::keyed("id", |r: &(u64, u64)| Some(r.0))
                .limit(Kind::FixedWindow, Limit::per_minute(5)),
        )
        .layer(Layer::global("all").limit(Kind::FixedWindow, Limit::per_minute(3)))
        .max_keys(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(stack.check(&(1, 0)).unwrap().is_allowed());
    // Cost 3 fits the new key's 5 but not the 2 the global has left: denied, the new key
    // taken out again.
    assert!(stack.check_n(&(2, 0), 3).unwrap().is_denied());
    assert_eq!(stack.len(), 1);
    assert!(
        stack.check(&(3, 0)).unwrap().is_allowed(),
        "the place came back"
    );
    assert!(matches!(stack.check(&(4, 0)), Err(CallError::Full { .. })));
}

#[test]
fn threads_racing_for_places_never_pass_the_bound() {
    for max in [7, 64] {
        let clock = ManualClock::new();
        let stack = Arc::new(bounded(max, &clock));
        let admitted = Arc::new(AtomicU64::new(0));
        std::thread::scope(|scope| {
            for t in 0..4_u64 {
                let (stack, admitted) = (Arc::clone(&stack), Arc::clone(&admitted));
                scope.spawn(move || {
                    for n in 0..500_u64 {
                        match stack.check(&(t * 1_000_000 + n)) {
                            Ok(d) if d.is_allowed() => {
                                admitted.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(d) => panic!("a new key of 1/min is denied: {d:?}"),
                            Err(CallError::Full { .. }) => {}
                            Err(e) => panic!("{e}"),
                        }
                        assert!(stack.len() <= max as u64);
                    }
                });
            }
        });
        assert_eq!(admitted.load(Ordering::Relaxed), max as u64);
        assert_eq!(stack.len(), max as u64);
    }
}

#[test]
fn layers_on_one_key_hold_one_entry_against_the_bound_and_a_denial_leaves_none() {
    let clock = ManualClock::new();
    let per_second =
        Layer::keyed("second", |r: &u64| Some(*r)).limit(Kind::TokenBucket, Limit::per_second(5));
    // The second layer, on the same key, holds its state in the first one's entry.
    let per_minute = per_second
        .same_key("minute")
        .limit(Kind::FixedWindow, Limit::per_minute(2));
    let stack = Stack::builder()
        .layer(per_second)
        .layer(per_minute)
        .max_keys(2)
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(stack.check(&1).unwrap().is_allowed());
    assert!(stack.check(&2).unwrap().is_allowed());
    assert_eq!(stack.len(), 2, "one entry per key for both layers");
    assert!(matches!(
        stack.check(&3),
        Err(CallError::Full { max_keys: 2, .. })
    ));
    // Key 1's minute runs out on the second layer: denied, and its first layer untouched.
    assert!(stack.check(&1).unwrap().is_allowed());
    let denied = stack.check(&1).unwrap();
    assert!(denied.is_denied());
    assert_eq!(denied.binding().map(|l| l.layer), Some(1));
    let mut each = LayerAnswers::new();
    stack.check_each(&1, 0, &mut each).unwrap();
    let left: Vec<u64> = each.iter().map(|l| l.decision.remaining()).collect();
    assert_eq!(left, [3, 0]);
    // A minute on, both held keys are full again: a new key takes a place, and a peek of an
    // unseen key inserts nothing.
    clock.advance(Duration::from_secs(60));
    assert!(stack.peek(&9).unwrap().is_allowed());
    assert!(stack.check(&3).unwrap().is_allowed());
    assert!(stack.len() <= 2);
}

#[test]
fn a_bounded_stack_refuses_new_keys_rather_than_forget_held_ones() {
    let clock = ManualClock::new();
    let bounded = |max_keys| {
        Stack::builder()
            .layer(
                Layer::keyed("user", |r: &u64| Some(*r))
                    .limit(Kind::TokenBucket, Limit::per_second(2)),
            )
            .shards(1)
            .max_keys(max_keys)
            .clock(clock.clone())
            .build()
    };
    assert_eq!(bounded(0).unwrap_err(), BuildError::ZeroMaxKeys);
    let stack = bounded(2).unwrap();
    assert!(stack.check_n(&1, 2).unwrap().is_allowed());
    assert!(stack.check(&2).unwrap().is_allowed());
    let err = stack.check(&3).unwrap_err();
    assert_eq!(
        err,
        CallError::Full {
            layer: "user".into(),
            max_keys: 2
        }
    );
    assert!(err.to_string().contains("raise `max_keys`"), "{err}");
    assert_eq!(stack.len(), 2, "the refused key left nothing behind");
    // Held keys go on with their consumption; a new key can still be peeked.
    assert!(stack.check(&1).unwrap().is_denied());
    assert_eq!(stack.peek(&3).unwrap().decision().remaining(), 2);
    // Half a second on, key 2 is full again (1 of 2 used) and makes room; key 1 is not.
    clock.advance(Duration::from_millis(500));
    assert!(stack.check(&3).unwrap().is_allowed());
    assert_eq!(stack.len(), 2);
    let one = stack.check(&1).unwrap();
    assert!(one.is_allowed());
    assert_eq!(one.decision().remaining(), 0, "key 1 kept its consumption");
    assert!(matches!(
        stack.check(&4).unwrap_err(),
        CallError::Full { .. }
    ));
    // With the default shards too, the bound is exact: the first 5 keys, then none.
    let many = Stack::builder()
        .layer(
            Layer::keyed("user", |r: &u64| Some(*r)).limit(Kind::TokenBucket, Limit::per_second(2)),
        )
        .max_keys(5)
        .clock(clock.clone())
        .build()
        .unwrap();
    let admitted = (0..100)
        .filter(|&user| many.check(&user).is_ok_and(|d| d.is_allowed()))
        .count();
    assert_eq!(admitted, 5);
    assert_eq!(many.len(), 5);
}

/// What each layer has left for `r` (a peek, every layer's answer).
fn remaining(stack: &Stack<u64, u64, ManualClock>, r: &u64) -> Vec<u64> {
    let mut each = LayerAnswers::new();
    stack.check_each(r, 0, &mut each).unwrap();
    each.iter().map(|l| l.decision.remaining()).collect()
}

/// Per user 3 a second (and, on the user's key, 2 a second) beside a global layer of 4: every
/// keyed layer on one key, so a new key's first call is decided on an entry built apart.
fn one_key_and_global(clock: &ManualClock) -> Stack<u64, u64, ManualClock> {
    let user =
        Layer::keyed("per-user", |r: &u64| Some(*r)).limit(Kind::TokenBucket, Limit::per_second(3));
    let second = user
        .same_key("per-user-2")
        .limit(Kind::TokenBucket, Limit::per_second(2));
    Stack::builder()
        .layer(user)
        .layer(second)
        .layer(Layer::global("global").limit(Kind::TokenBucket, Limit::per_second(4)))
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn a_new_key_s_first_call_inserts_it_only_when_it_writes() {
    let clock = ManualClock::new();
    let stack = one_key_and_global(&clock);
    // Over a layer's burst: an error, and the key is not inserted.
    let err = stack.check_n(&1, 3).unwrap_err();
    assert!(
        matches!(err, CallError::Decision { ref layer, .. } if layer == "per-user-2"),
        "{err}"
    );
    assert_eq!(stack.len(), 0);
    // A call of no cost (a peek) decides as the key's first call would, and inserts nothing.
    assert!(stack.check_n(&1, 0).unwrap().is_allowed());
    assert_eq!((stack.len(), remaining(&stack, &1)), (0, vec![3, 2, 4]));
    // Admitted: inserted once, holding exactly what the call took.
    assert!(stack.check_n(&1, 2).unwrap().is_allowed());
    assert_eq!((stack.len(), remaining(&stack, &1)), (1, vec![1, 0, 2]));
    // The global layer's last two units go to a new key; the next new key is denied by it and
    // left out.
    assert!(stack.check_n(&3, 2).unwrap().is_allowed());
    assert_eq!(stack.len(), 2);
    assert!(stack.check(&4).unwrap().is_denied());
    assert_eq!(stack.len(), 2, "a denied first call left its key behind");
    assert_eq!(remaining(&stack, &4), vec![3, 2, 0]);
}
