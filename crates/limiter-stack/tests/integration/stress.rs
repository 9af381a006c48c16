//! Real threads on one stack with the clock stopped, so every count is exact: concurrent
//! stacked calls admit exactly what the binding layers allow (no over-admission, and no
//! admission lost to a false denial), denials change nothing, refunds are never lost, and
//! every answer, however its call raced, is consistent in itself. Both commit protocols run:
//! the stack with a global layer commits under that layer's lock alone, the stack of keyed
//! layers locks each entry; and a layer whose plan function chooses among plans of two limits.
//! First calls racing on new keys (every keyed layer on one key, beside a global layer) admit
//! exactly what binds and insert only the keys they wrote.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use limiter_core::{Limit, ManualClock};
use limiter_stack::Kind;
use limiter_stack::{
    Grant, Layer, LayerAnswers, LayerDecision, Plan, Stack, StackBuilder, StackDecision,
};

const USERS: u64 = 16;
const THREADS: usize = 8;
const PER_USER: u64 = 5_000;
const PER_PAIR: u64 = 12_000;
const GLOBAL: u64 = 50_000;

type Users = Stack<u64, u64, ManualClock>;

/// Per user 5,000, per group of four users 12,000, global 50,000, all per hour: with the clock
/// stopped, the groups bind, so exactly 4 x 12,000 = 48,000 calls can be admitted.
fn stack(clock: &ManualClock) -> Users {
    keyed(clock)
        .layer(Layer::global("global").limit(Kind::TokenBucket, Limit::per_hour(GLOBAL)))
        .build()
        .unwrap()
}

/// The user and group layers of [`stack`] alone: no global layer, so no commit lock.
fn keyed(clock: &ManualClock) -> StackBuilder<u64, u64, ManualClock> {
    let user = Layer::keyed("user", |u: &u64| Some(*u))
        .limit(Kind::TokenBucket, Limit::per_hour(PER_USER));
    keyed_with(user, clock)
}

/// `user`, then the group layer of [`stack`]; no global layer.
fn keyed_with(user: Layer<u64, u64>, clock: &ManualClock) -> StackBuilder<u64, u64, ManualClock> {
    let per_hour = |n| Limit::per_hour(n);
    Stack::builder()
        .layer(user)
        .layer(
            Layer::keyed("group", |u: &u64| Some(u % 4))
                .limit(Kind::TokenBucket, per_hour(PER_PAIR)),
        )
        .clock(clock.clone())
        .shards(4)
}

fn remaining(stack: &Users, user: u64) -> Vec<u64> {
    let mut each = LayerAnswers::new();
    stack.check_each(&user, 0, &mut each).unwrap();
    each.iter().map(|l| l.decision.remaining()).collect()
}

/// A call of one unit for `user`: every other one asks for each layer's answer and checks it
/// against the compact one ([`assert_consistent`]); the rest take a grant.
fn call(stack: &Users, user: u64, detailed: bool) -> (StackDecision, Option<Grant>) {
    if !detailed {
        return stack.acquire(&user, 1).unwrap();
    }
    let mut each = LayerAnswers::new();
    let decision = stack.check_each(&user, 1, &mut each).unwrap();
    assert_consistent(&decision, &each, stack.layers().len());
    (decision, None)
}

/// Every thread calls for every user, rotating its starting user, until all calls it makes
/// for a whole round are denied; `refund_every` gives back one admitted call in that many.
fn hammer(stack: &Users, refund_every: u64) -> (Vec<u64>, u64) {
    let admitted: Vec<AtomicU64> = (0..USERS).map(|_| AtomicU64::new(0)).collect();
    let refunded = AtomicU64::new(0);
    thread::scope(|s| {
        for t in 0..THREADS {
            let (admitted, refunded) = (&admitted, &refunded);
            s.spawn(move || {
                let mut calls = 0u64;
                loop {
                    let mut any = false;
                    for i in 0..USERS {
                        let user = (i + t as u64 * 3) % USERS;
                        // Every other call asks for each layer, but never one whose grant
                        // is to be refunded if admitted.
                        let refunds = refund_every > 0 && (calls + 1).is_multiple_of(refund_every);
                        let detailed = !refunds && (i + calls).is_multiple_of(2);
                        let (decision, grant) = call(stack, user, detailed);
                        if decision.is_allowed() {
                            any = true;
                            admitted[user as usize].fetch_add(1, Ordering::Relaxed);
                            calls += 1;
                            if let (true, Some(mut grant)) = (
                                refund_every > 0 && calls.is_multiple_of(refund_every),
                                grant,
                            ) {
                                stack.refund(&user, &mut grant, 1).unwrap();
                                refunded.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    if !any {
                        break;
                    }
                }
            });
        }
    });
    let admitted = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    (admitted, refunded.load(Ordering::Relaxed))
}

/// An answer is one reading of every layer: allowed iff each layer allowed, and bound by the
/// layer the stack's rule names among its own layers (a denial's longest wait, else the
/// fewest left; the first on ties), never by a layer's answer from an earlier attempt.
fn assert_consistent(decision: &StackDecision, each: &LayerAnswers, depth: usize) {
    assert_eq!(each.summary(), *decision, "{each:?}");
    let layers: Vec<&LayerDecision> = each.iter().collect();
    assert_eq!(layers.len(), depth, "{decision:?}");
    assert_eq!(
        decision.is_allowed(),
        layers.iter().all(|l| l.decision.is_allowed()),
        "{decision:?}"
    );
    let rank = |l: &LayerDecision| {
        let d = &l.decision;
        // Denials first, by the longest wait; then admissions, by the fewest left.
        if d.is_denied() {
            (0, u64::MAX - d.retry_after_nanos())
        } else {
            (1, d.remaining())
        }
    };
    let binding = layers
        .iter()
        .copied()
        .reduce(|best, l| if rank(l) < rank(best) { l } else { best });
    assert_eq!(decision.binding(), binding, "{decision:?}");
}

#[test]
fn threads_admit_exactly_what_the_binding_layers_allow() {
    let clock = ManualClock::new();
    let stack = stack(&clock);
    let (admitted, _) = hammer(&stack, 0);
    for group in 0..4 {
        let in_group: u64 = (group..USERS)
            .step_by(4)
            .map(|u| admitted[u as usize])
            .sum();
        assert_eq!(in_group, PER_PAIR, "group {group}");
    }
    for user in 0..USERS {
        let left = remaining(&stack, user);
        assert!(admitted[user as usize] <= PER_USER);
        assert_eq!(left[0], PER_USER - admitted[user as usize], "user {user}");
        assert_eq!(left[1], 0);
        assert_eq!(
            left[2],
            GLOBAL - 4 * PER_PAIR,
            "the global layer lost or gained a unit"
        );
    }
}

#[test]
fn concurrent_refunds_are_never_lost() {
    let clock = ManualClock::new();
    let stack = stack(&clock);
    let (admitted, refunded) = hammer(&stack, 5);
    assert!(refunded > 0);
    // Each group's net consumption is exactly its limit; each user's and the global layer's
    // remaining is exactly what admissions minus refunds left.
    let total: u64 = admitted.iter().sum();
    assert_eq!(total - refunded, 4 * PER_PAIR);
    for user in 0..USERS {
        let left = remaining(&stack, user);
        assert_eq!(left[1], 0);
        assert_eq!(left[2], GLOBAL - 4 * PER_PAIR);
        assert!(left[0] <= PER_USER);
    }
}

#[test]
fn keyed_layers_alone_locking_each_entry_admit_exactly_what_binds_and_lose_no_refund() {
    let clock = ManualClock::new();
    let stack = keyed(&clock).build().unwrap();
    let (admitted, refunded) = hammer(&stack, 7);
    assert!(refunded > 0);
    let total: u64 = admitted.iter().sum();
    assert_eq!(total - refunded, 4 * PER_PAIR);
    for user in 0..USERS {
        let left = remaining(&stack, user);
        assert_eq!(left[1], 0, "user {user}'s group");
        assert!(left[0] <= PER_USER);
    }
}

#[test]
fn with_a_plan_function_threads_admit_exactly_what_binds_and_lose_no_unit() {
    // The user layer chooses its plan per call (by the user's parity), each plan of two
    // limits: the fixed-plan path reads its words under the sequence lock and commits under
    // the global layer's lock only if its words and plan are as read.
    let plan = |name: &str, window: u64| {
        Plan::new(name)
            .limit(Kind::TokenBucket, Limit::per_hour(PER_USER))
            .limit(Kind::SlidingWindow, Limit::per_hour(window))
    };
    let user = Layer::keyed("user", |u: &u64| Some(*u)).plans(
        [plan("even", PER_USER), plan("odd", 2 * PER_USER)],
        |u: &u64| usize::from(u % 2 == 1),
    );
    let clock = ManualClock::new();
    let stack = keyed_with(user, &clock)
        .layer(Layer::global("global").limit(Kind::TokenBucket, Limit::per_hour(GLOBAL)))
        .build()
        .unwrap();
    let (admitted, _) = hammer(&stack, 0);
    let total: u64 = admitted.iter().sum();
    assert_eq!(total, 4 * PER_PAIR);
    for user in 0..USERS {
        // Every admission is in the user's words (the bucket binds in either plan).
        let left = remaining(&stack, user);
        assert_eq!(left[0], PER_USER - admitted[user as usize], "user {user}");
        assert_eq!(left[1], 0, "user {user}'s group");
        assert_eq!(
            left[2],
            GLOBAL - 4 * PER_PAIR,
            "the global layer lost a unit"
        );
    }
}

#[test]
fn records_racing_checks_all_land_and_checks_respect_them() {
    let clock = ManualClock::new();
    let stack = stack(&clock);
    const RECORDS_PER_THREAD: u64 = 200;
    let admitted: Vec<AtomicU64> = (0..USERS).map(|_| AtomicU64::new(0)).collect();
    let recorded: Vec<AtomicU64> = (0..USERS).map(|_| AtomicU64::new(0)).collect();
    thread::scope(|s| {
        for t in 0..THREADS {
            let (admitted, recorded, stack) = (&admitted, &recorded, &stack);
            s.spawn(move || {
                let mut records = 0;
                loop {
                    let mut any = false;
                    for i in 0..USERS {
                        let user = (i + t as u64 * 5) % USERS;
                        if records < RECORDS_PER_THREAD && (i + t as u64).is_multiple_of(3) {
                            let d = stack.record(&user, 1).unwrap();
                            assert!(d.binding().is_some(), "{d:?}");
                            recorded[user as usize].fetch_add(1, Ordering::Relaxed);
                            records += 1;
                            any = true;
                            continue;
                        }
                        let (d, _) = call(stack, user, true);
                        if d.is_allowed() {
                            any = true;
                            admitted[user as usize].fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if !any {
                        break;
                    }
                }
            });
        }
    });
    let load = |v: &Vec<AtomicU64>, u: u64| v[u as usize].load(Ordering::Relaxed);
    let total_recorded: u64 = (0..USERS).map(|u| load(&recorded, u)).sum();
    assert_eq!(total_recorded, THREADS as u64 * RECORDS_PER_THREAD);
    // Each group ends holding exactly what was admitted and recorded in it: never admitted past
    // its limit, and no record lost. A unit of a group's limit comes back every 300 ms.
    for group in 0..4 {
        let used: u64 = (group..USERS)
            .step_by(4)
            .map(|u| load(&admitted, u) + load(&recorded, u))
            .sum();
        assert!(
            used >= PER_PAIR,
            "group {group}: checks stopped early at {used}"
        );
        let debt = used - PER_PAIR;
        let group_at = |nanos: u64| {
            stack.clock().set(nanos);
            let mut each = LayerAnswers::new();
            stack.check_each(&group, 0, &mut each).unwrap();
            each.get(1).unwrap().decision
        };
        if debt > 0 {
            let before = group_at(debt * 300_000_000 - 1);
            assert!(
                before.is_denied(),
                "group {group}: less than {used} recorded"
            );
        }
        let paid = group_at(debt * 300_000_000);
        assert!(
            paid.is_allowed() && paid.remaining() == 0,
            "group {group}: more than {used} in use: {paid:?}"
        );
        stack.clock().set(0);
    }
}

#[test]
fn first_calls_racing_on_new_keys_admit_exactly_what_binds_and_insert_only_admitted_keys() {
    // Every keyed layer on one key, beside a global layer: each key's first call is decided on
    // an entry built apart and inserted only by a call that wrote it. 20,000 new keys, 3 a
    // key, 40,000 in all: the global layer binds, so exactly 40,000 calls are admitted, no key
    // more than 3, and only keys with an admitted call are in the table.
    const KEYS: u64 = 20_000;
    const GLOBAL: u64 = 40_000;
    let stack: Users = Stack::builder()
        .layer(
            Layer::keyed("user", |u: &u64| Some(*u)).limit(Kind::TokenBucket, Limit::per_hour(3)),
        )
        .layer(Layer::global("global").limit(Kind::TokenBucket, Limit::per_hour(GLOBAL)))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let admitted: Vec<AtomicU64> = (0..KEYS).map(|_| AtomicU64::new(0)).collect();
    let start = Barrier::new(THREADS);
    thread::scope(|s| {
        for _ in 0..THREADS {
            let (stack, admitted, start) = (&stack, &admitted, &start);
            s.spawn(move || {
                start.wait();
                // Every thread in the same order, so first calls on a key race; four
                // rounds.
                for i in 0..4 * KEYS {
                    let key = i % KEYS;
                    if stack.check(&key).unwrap().is_allowed() {
                        admitted[key as usize].fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let counts: Vec<u64> = admitted.iter().map(|a| a.load(Ordering::Relaxed)).collect();
    assert_eq!(counts.iter().sum::<u64>(), GLOBAL);
    assert!(counts.iter().all(|&n| n <= 3), "a key admitted more than 3");
    let held = counts.iter().filter(|&&n| n > 0).count() as u64;
    assert_eq!(
        stack.len(),
        held,
        "a key without an admitted call was inserted"
    );
    for (key, &n) in counts.iter().enumerate() {
        // What each admitted call took, and nothing else: the user's layer, then the global.
        assert_eq!(remaining(&stack, key as u64), [3 - n, 0], "key {key}");
    }
}
