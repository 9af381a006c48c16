//! Loom models of the stack's protocol: stacked calls sharing a layer never over-admit and a
//! denial changes no layer (on the fixed-plan path on several keys, each key's lead locked, and
//! on the lean path, which takes stacks deeper than four layers), racing calls both land in full, racing first inserts admit once (on
//! the one-key path too, and new keys racing for a global or shared unit leave only the
//! winner's), a call
//! decided again after a race answers from its last reading alone, and a reader never mixes one
//! plan's words with another's limits; and, in a stack with a global layer (whose entry lock is
//! the commit lock every writing call takes instead of one lock per entry), racing calls and
//! refunds lose no update on the keyed entries the commit lock alone guards, a denial still
//! changes nothing, and a plan change written under it never shows a reader mixed words; and
//! for layers on one key (one entry, written under its lead's lock alone), racing calls lose no
//! update, the last unit of either layer goes once, and a plan change of a layer held through
//! its lead never shows a reader mixed words. Run with `cargo xtask loom`.
#![cfg(limiter_loom)]

use limiter_core::{Limit, ManualClock};
use limiter_stack::Kind;
use limiter_stack::{Layer, LayerAnswers, Plan, Stack};
use loom::sync::Arc;
use loom::thread;

#[derive(Clone, Copy, Debug)]
struct Request {
    user: Option<u64>,
    shared: bool,
    pro: bool,
}

type Users = Stack<Request, u64, ManualClock>;

fn per_hour(n: u64) -> Limit {
    Limit::per_hour(n)
}

/// Per user `user` per hour, and a layer shared by every request that sets `shared` (one key),
/// `shared` per hour; on one shard: the fixed-plan path on several keys, each key's lead locked.
/// Setup calls touch only the layers they need, so no atomic sees more stores than loom tracks
/// (seven; past that loom trips on its own bookkeeping, tokio-rs/loom#252).
fn stack(user: u64, shared: u64) -> Arc<Users> {
    let user = Layer::keyed("user", |r: &Request| r.user).limit(Kind::TokenBucket, per_hour(user));
    user_and_shared(user, shared, 0)
}

/// [`stack`] with the user layer's one plan chosen by a plan function, and three layers no
/// request applies to (five layers, deeper than the fixed-plan path takes): the lean path.
fn stack_lean(user: u64, shared: u64) -> Arc<Users> {
    let plan = Plan::new("only").limit(Kind::TokenBucket, per_hour(user));
    let user = Layer::keyed("user", |r: &Request| r.user).plans([plan], |_: &Request| 0);
    user_and_shared(user, shared, 3)
}

/// `user`, then a layer shared by every request that sets `shared`, `shared` per hour, then
/// `unused` layers no request applies to (they touch no atomic).
fn user_and_shared(user: Layer<Request, u64>, shared: u64, unused: usize) -> Arc<Users> {
    let unused = (0..unused).map(|i| {
        Layer::keyed(format!("unused-{i}"), |_: &Request| None::<u64>)
            .limit(Kind::TokenBucket, per_hour(1))
    });
    Arc::new(
        Stack::builder()
            .layer(user)
            .layer(
                Layer::keyed("shared", |r: &Request| r.shared.then_some(0))
                    .limit(Kind::TokenBucket, per_hour(shared)),
            )
            .layers(unused)
            .clock(ManualClock::new())
            .shards(1)
            .build()
            .unwrap(),
    )
}

/// One global layer, `n` per hour.
fn global(n: u64) -> Arc<Users> {
    Arc::new(
        Stack::builder()
            .layer(Layer::global("global").limit(Kind::TokenBucket, per_hour(n)))
            .clock(ManualClock::new())
            .build()
            .unwrap(),
    )
}

/// A global layer of `global` per hour listed first (so its entry, the commit lock, is in the
/// first slot: released last all the same), then per user `user` per hour; on one shard.
fn global_then_user(global: u64, user: u64) -> Arc<Users> {
    Arc::new(
        Stack::builder()
            .layer(Layer::global("global").limit(Kind::TokenBucket, per_hour(global)))
            .layer(
                Layer::keyed("user", |r: &Request| r.user).limit(Kind::TokenBucket, per_hour(user)),
            )
            .clock(ManualClock::new())
            .shards(1)
            .build()
            .unwrap(),
    )
}

/// Per user `user` per hour and, on the same key (one entry: `Layer::same_key`), per user
/// `minute` per hour, that second layer with a free plan (a fixed window of `minute`) and a pro
/// plan (a token bucket of twice `minute`); no global layer, so the lead's lock guards the
/// entry. On one shard.
fn one_key(user: u64, minute: u64) -> Arc<Users> {
    let lead = Layer::keyed("user", |r: &Request| r.user).limit(Kind::TokenBucket, per_hour(user));
    let second = lead.same_key("user-minute").plans(
        [
            Plan::new("free").limit(Kind::FixedWindow, per_hour(minute)),
            Plan::new("pro").limit(Kind::TokenBucket, per_hour(2 * minute)),
        ],
        |r: &Request| usize::from(r.pro),
    );
    lead_and_second(lead, second)
}

/// Per user `user` per hour and, on the same key, `minute` per hour, each layer one limit and
/// no global layer: the one-key path, committing under the entry's lead alone. On one shard.
fn one_key_lean(user: u64, minute: u64) -> Arc<Users> {
    let lead = Layer::keyed("user", |r: &Request| r.user).limit(Kind::TokenBucket, per_hour(user));
    let second = lead
        .same_key("user-minute")
        .limit(Kind::TokenBucket, per_hour(minute));
    lead_and_second(lead, second)
}

/// Per user a layer of two limits (`user` per hour in a token bucket, `window` per hour in a
/// fixed window) and, on the same key, `minute` per hour: the one-key path with several words a
/// layer, committing under the entry's lead. On one shard.
fn one_key_two_limits(user: u64, window: u64, minute: u64) -> Arc<Users> {
    let lead = Layer::keyed("user", |r: &Request| r.user)
        .limit(Kind::TokenBucket, per_hour(user))
        .limit(Kind::FixedWindow, per_hour(window));
    let second = lead
        .same_key("user-minute")
        .limit(Kind::TokenBucket, per_hour(minute));
    lead_and_second(lead, second)
}

/// A stack of `lead` and `second` (a layer on the lead's key) on a manual clock, on one shard.
fn lead_and_second(lead: Layer<Request, u64>, second: Layer<Request, u64>) -> Arc<Users> {
    Arc::new(
        Stack::builder()
            .layer(lead)
            .layer(second)
            .clock(ManualClock::new())
            .shards(1)
            .build()
            .unwrap(),
    )
}

fn call(stack: &Users, user: Option<u64>, shared: bool) -> bool {
    let request = Request {
        user,
        shared,
        pro: false,
    };
    stack.check(&request).unwrap().is_allowed()
}

/// A call for user `there` on another thread racing one for user `here` on this one (neither
/// on the shared layer): whether each was admitted, `(here, there)`.
fn race(stack: &Arc<Users>, here: Option<u64>, there: Option<u64>) -> (bool, bool) {
    let other = Arc::clone(stack);
    let racer = thread::spawn(move || call(&other, there, false));
    let mine = call(stack, here, false);
    (mine, racer.join().unwrap())
}

fn left(stack: &Users, user: u64) -> Vec<u64> {
    let request = Request {
        user: Some(user),
        shared: true,
        pro: false,
    };
    let mut each = LayerAnswers::new();
    stack.check_each(&request, 0, &mut each).unwrap();
    each.iter().map(|l| l.decision.remaining()).collect()
}

#[test]
fn calls_sharing_a_layer_admit_once() {
    loom::model(|| calls_sharing_a_layer(stack));
}

#[test]
fn calls_sharing_a_layer_admit_once_on_the_lean_path() {
    loom::model(|| calls_sharing_a_layer(stack_lean));
}

fn calls_sharing_a_layer(build: fn(u64, u64) -> Arc<Users>) {
    // Every key exists already, so the racers take only read locks and meet at the
    // shared entry's lock, which has one unit left.
    let stack = build(5, 2);
    assert!(call(&stack, None, true));
    assert!(call(&stack, Some(1), false) && call(&stack, Some(2), false));
    let other = Arc::clone(&stack);
    let racer = thread::spawn(move || call(&other, Some(2), true));
    let here = call(&stack, Some(1), true);
    let there = racer.join().unwrap();
    assert!(here ^ there, "admitted {here} and {there}");
    // The loser's own layer is untouched.
    let loser = if here { 2 } else { 1 };
    assert_eq!(left(&stack, loser), [4, 0]);
}

#[test]
fn a_call_denied_by_one_layer_changes_no_other() {
    loom::model(|| denied_call_changes_no_other(stack));
}

#[test]
fn a_call_denied_by_one_layer_changes_no_other_on_the_lean_path() {
    loom::model(|| denied_call_changes_no_other(stack_lean));
}

fn denied_call_changes_no_other(build: fn(u64, u64) -> Arc<Users>) {
    let stack = build(2, 2);
    // User 1 spent; user 2 has 1 left; the shared layer has 1 left.
    assert!(call(&stack, Some(1), false) && call(&stack, Some(1), false));
    assert!(call(&stack, Some(2), false) && call(&stack, None, true));
    let other = Arc::clone(&stack);
    let admitted = thread::spawn(move || call(&other, Some(2), true));
    let denied = call(&stack, Some(1), true);
    assert!(!denied);
    assert!(
        admitted.join().unwrap(),
        "a denied call took the shared unit"
    );
    assert_eq!(left(&stack, 2), [0, 0]);
    assert_eq!(left(&stack, 1), [0, 0]);
}

#[test]
fn calls_racing_on_a_global_layer_admit_once() {
    loom::model(|| {
        let stack = global(1);
        let other = Arc::clone(&stack);
        let racer = thread::spawn(move || call(&other, None, false));
        let here = call(&stack, None, false);
        assert!(here ^ racer.join().unwrap());
    });
}

#[test]
fn racing_calls_of_different_costs_both_land_in_full() {
    loom::model(|| {
        // 3 units: one call takes 1, the other 2. Both fit, and whichever commits second
        // finds the entry changed and decides again on what the first left: deciding again on
        // its own first read would lose the first call's units (or deny the second).
        let stack = global(3);
        let request = Request {
            user: None,
            shared: false,
            pro: false,
        };
        let other = Arc::clone(&stack);
        let racer = thread::spawn(move || other.check_n(&request, 2).unwrap().is_allowed());
        assert!(stack.check_n(&request, 1).unwrap().is_allowed());
        assert!(racer.join().unwrap());
        let left = stack.peek(&request).unwrap().decision().remaining();
        assert_eq!(left, 0, "a racing call's units were lost");
    });
}

#[test]
fn racing_first_calls_on_a_new_key_admit_once() {
    loom::model(|| {
        let stack = stack(1, 5);
        let (here, there) = race(&stack, Some(7), Some(7));
        assert!(here ^ there, "admitted {here} and {there}");
        assert_eq!(stack.len(), 1);
        assert_eq!(left(&stack, 7)[0], 0);
    });
}

#[test]
fn racing_first_calls_on_a_new_key_admit_once_on_the_one_key_path() {
    // The key's entry is built apart and inserted under its shard's write lock by the call
    // that wrote it: without the look for a racer's insert under that lock, both would insert.
    loom::model(|| {
        let stack = one_key_lean(1, 5);
        let (here, there) = race(&stack, Some(7), Some(7));
        assert!(here ^ there, "admitted {here} and {there}");
        assert_eq!(stack.len(), 1);
        assert_eq!(left(&stack, 7), [0, 4]);
    });
}

#[test]
fn first_calls_on_new_keys_racing_for_a_global_unit_admit_once_and_leave_one_key() {
    // Two new keys, one unit left in the global layer: the loser's commit fails or its
    // decision denies, and its entry, built apart, is never inserted.
    loom::model(|| {
        let stack = global_then_user(1, 5);
        let (here, there) = race(&stack, Some(1), Some(2));
        assert!(here ^ there, "admitted {here} and {there}");
        assert_eq!(stack.len(), 1, "a denied first call left its key behind");
    });
}

#[test]
fn first_calls_on_several_new_keys_racing_for_a_shared_unit_admit_once_and_leave_one_user() {
    // Each call has two keys with no entry (its user's and the shared layer's): the loser's
    // decision denies or its commit fails, and neither of its entries, built apart, is
    // inserted; the winner's two are.
    loom::model(|| {
        let stack = stack(5, 1);
        let other = Arc::clone(&stack);
        let racer = thread::spawn(move || call(&other, Some(2), true));
        let here = call(&stack, Some(1), true);
        let there = racer.join().unwrap();
        assert!(here ^ there, "admitted {here} and {there}");
        assert_eq!(stack.len(), 2, "a denied first call left a key behind");
    });
}

#[test]
fn a_call_decided_again_after_a_race_binds_by_its_last_reading() {
    loom::model(|| {
        // User 1 has 3 of 4 left, the shared layer 2 of 3. Alone, the call leaves 2 and 1: the
        // shared layer binds. If the racer takes one of user 1's units between the call's first
        // reading and its commit, the call is decided again and leaves 1 and 1: a tie, which
        // the first layer binds. An answer still holding the first reading's layers would keep
        // the shared layer binding.
        let stack = stack(4, 3);
        assert!(call(&stack, Some(1), false) && call(&stack, None, true));
        let other = Arc::clone(&stack);
        let racer = thread::spawn(move || call(&other, Some(1), false));
        let request = Request {
            user: Some(1),
            shared: true,
            pro: false,
        };
        let mut each = LayerAnswers::new();
        let answer = stack.check_each(&request, 1, &mut each).unwrap();
        assert!(racer.join().unwrap() && answer.is_allowed());
        assert_eq!(each.summary(), answer);
        let left: Vec<u64> = each.iter().map(|l| l.decision.remaining()).collect();
        let fewest_first = if left[0] <= left[1] { 0 } else { 1 };
        assert_eq!(
            answer.binding().map(|b| b.layer),
            Some(fewest_first),
            "{answer:?}"
        );
    });
}

#[test]
fn a_reader_never_mixes_two_plans() {
    loom::model(|| reader_of_a_plan_change(false, 0));
}

#[test]
fn a_reader_never_mixes_two_plans_changed_under_the_commit_lock() {
    // With a global layer, the plan change is written under the commit lock, with the user's
    // entry never locked on its own.
    loom::model(|| reader_of_a_plan_change(true, 0));
}

#[test]
fn on_the_lean_path_a_reader_never_mixes_two_plans() {
    // Four layers no request applies to make the stack deeper than the fixed-plan path takes.
    loom::model(|| reader_of_a_plan_change(false, 4));
}

/// A reader racing a call that switches user 1 from one plan to another, in a stack of that
/// user layer alone or (`global`) with a global layer of 10 below it, and `unused` layers no
/// request applies to.
fn reader_of_a_plan_change(global: bool, unused: usize) {
    // Free: a fixed window of 2; pro: a token bucket of 4. The words mean different things:
    // read as a window, pro's word (a tat of 2,700 s) is a far-future window with nothing
    // counted, so a reader pairing it with free's limit would see 2 left.
    let builder = Stack::builder().layer(Layer::keyed("user", |r: &Request| r.user).plans(
        [
            Plan::new("free").limit(Kind::FixedWindow, per_hour(2)),
            Plan::new("pro").limit(Kind::TokenBucket, per_hour(4)),
        ],
        |r: &Request| usize::from(r.pro),
    ));
    let builder = if global {
        builder.layer(Layer::global("global").limit(Kind::TokenBucket, per_hour(10)))
    } else {
        builder
    };
    let builder = builder.layers((0..unused).map(|i| {
        Layer::keyed(format!("unused-{i}"), |_: &Request| None::<u64>)
            .limit(Kind::TokenBucket, per_hour(1))
    }));
    let stack: Arc<Users> = Arc::new(builder.clock(ManualClock::new()).shards(1).build().unwrap());
    // Before the switch: 1 of 2 left. After: 3 of 4 used, rescaled back to 2 of 2 used. (The
    // global layer, with 8 or 9 of 10 left, never binds.)
    reader_racing_a_switch_to_pro(&stack);
}

/// User 1 takes one unit of its free plan (a limit of 2 that binds), then a reader of the
/// free plan races a call that switches user 1 to pro and takes a unit there: the reader sees
/// 1 left (before the switch) or 0 (after it, rescaled back), never what pro's words read with
/// free's limits would show.
fn reader_racing_a_switch_to_pro(stack: &Arc<Users>) {
    let free = Request {
        user: Some(1),
        shared: false,
        pro: false,
    };
    assert!(stack.check(&free).unwrap().is_allowed());
    let other = Arc::clone(stack);
    let writer = thread::spawn(move || {
        let pro = Request { pro: true, ..free };
        other.check(&pro).unwrap().is_allowed()
    });
    let seen = stack.peek(&free).unwrap().decision().remaining();
    assert!(writer.join().unwrap());
    assert!(seen == 1 || seen == 0, "a reader saw {seen} left");
}

#[test]
fn racing_calls_under_the_commit_lock_lose_no_keyed_update() {
    loom::model(|| {
        // Both calls fit everywhere. Neither locks the user's entry: the global entry's lock
        // guards it. Released before the user's word is written, or not taken, the second
        // commit would decide on the first one's reading and write over its unit.
        let stack = global_then_user(4, 3);
        assert!(call(&stack, Some(1), false));
        assert_eq!(race(&stack, Some(1), Some(1)), (true, true));
        assert_eq!(left(&stack, 1), [1, 0], "a unit was lost");
    });
}

#[test]
fn under_the_commit_lock_a_denial_changes_nothing_and_the_last_unit_goes_once() {
    loom::model(|| {
        // User 1 is spent; the global layer has one unit left. User 1's call is denied and
        // must not take it; user 2's racing call then must get it.
        let stack = global_then_user(3, 1);
        assert!(call(&stack, Some(1), false) && call(&stack, Some(3), false));
        let other = Arc::clone(&stack);
        let admitted = thread::spawn(move || call(&other, Some(2), false));
        assert!(!call(&stack, Some(1), false));
        assert!(admitted.join().unwrap(), "a denied call took the last unit");
        assert_eq!(left(&stack, 2), [0, 0]);
    });
}

#[test]
fn a_refund_racing_a_call_under_the_commit_lock_is_never_lost() {
    loom::model(|| {
        // User 1 took one of 2 units and gives it back while another call for user 1 takes
        // one: afterwards exactly one unit is taken, whatever the order.
        let stack = global_then_user(4, 2);
        let request = Request {
            user: Some(1),
            shared: false,
            pro: false,
        };
        let (decision, grant) = stack.acquire(&request, 1).unwrap();
        assert!(decision.is_allowed());
        let mut grant = grant.unwrap();
        let other = Arc::clone(&stack);
        let racer = thread::spawn(move || call(&other, Some(1), false));
        stack.refund(&request, &mut grant, 1).unwrap();
        assert!(racer.join().unwrap());
        assert_eq!(left(&stack, 1), [3, 1], "a refund or a call was lost");
    });
}

#[test]
fn racing_calls_on_layers_of_one_key_lose_no_update() {
    loom::model(|| racing_calls_on_one_key(one_key(4, 4)));
}

#[test]
fn racing_calls_on_the_one_key_path_lose_no_update() {
    loom::model(|| racing_calls_on_one_key(one_key_lean(4, 4)));
}

#[test]
fn the_last_unit_on_the_one_key_path_goes_once() {
    loom::model(|| last_unit_of_the_second_layer_goes_once(one_key_lean(5, 2)));
}

/// Two calls racing on user 1 of `stack` (two layers on one key, 4 per hour each); both fit.
/// Only the lead's cells are locked; the second layer's are written under that lock. Written
/// without it, or after its release, one call would decide on a stale word and write over the
/// other's unit.
fn racing_calls_on_one_key(stack: Arc<Users>) {
    {
        assert!(call(&stack, Some(1), false));
        assert_eq!(stack.len(), 1, "both layers share one entry");
        assert_eq!(race(&stack, Some(1), Some(1)), (true, true));
        assert_eq!(left(&stack, 1), [1, 1], "a unit was lost");
    }
}

#[test]
fn the_last_unit_of_a_layer_held_through_its_lead_goes_once() {
    loom::model(|| last_unit_of_the_second_layer_goes_once(one_key(5, 2)));
}

/// Two calls racing on user 1 of `stack` (two layers on one key, the lead 5 per hour, the
/// second 2), after one call: the second layer has one unit left, the lead plenty, so exactly
/// one racer gets it, and the loser's lead unit stays.
fn last_unit_of_the_second_layer_goes_once(stack: Arc<Users>) {
    assert!(call(&stack, Some(1), false));
    let (here, there) = race(&stack, Some(1), Some(1));
    assert!(here ^ there, "admitted {here} and {there}");
    assert_eq!(left(&stack, 1), [3, 0]);
}

#[test]
fn a_reader_never_mixes_two_plans_of_a_layer_held_through_its_lead() {
    loom::model(|| {
        // The second layer switches user 1 from free (a window of 2) to pro (a bucket of 4)
        // under the lead's lock, its own never taken. Before: 1 of 2 left; after: 3 of 4 used,
        // rescaled back to 2 of 2 (the lead, 10 per hour, never binds).
        let stack = one_key(10, 2);
        reader_racing_a_switch_to_pro(&stack);
    });
}

#[test]
fn on_the_one_key_path_racing_calls_lose_no_update_of_a_layers_second_limit() {
    loom::model(|| {
        // Both calls fit. Each commit writes both words of the user's layer; one deciding on
        // the other's stale second word would leave the window a unit short of its count.
        let stack = one_key_two_limits(4, 3, 4);
        assert!(call(&stack, Some(1), false));
        assert_eq!(race(&stack, Some(1), Some(1)), (true, true));
        // The user's layer: the window's 0 of 3 left binds (the bucket has 1 of 4); the
        // same-key layer has 1 of 4.
        assert_eq!(left(&stack, 1), [0, 1], "a unit was lost");
    });
}

#[test]
fn on_the_one_key_path_the_last_unit_of_a_layers_second_limit_goes_once() {
    loom::model(|| {
        // The window has one unit left, every other limit plenty: one racer gets it.
        let stack = one_key_two_limits(4, 2, 4);
        assert!(call(&stack, Some(1), false));
        let (mine, theirs) = race(&stack, Some(1), Some(1));
        assert!(mine ^ theirs, "admitted: {mine}, {theirs}");
        assert_eq!(left(&stack, 1), [0, 2]);
    });
}

/// Per user one layer whose plan function chooses between two plans of two limits each (free:
/// a fixed window of `free` and a token bucket of 100 per hour; pro: a token bucket of twice
/// `free` and a fixed window of 100): the fixed-plan path with a plan function, its words read
/// under the sequence lock. On one shard.
fn two_plans_of_two_limits(free: u64) -> Arc<Users> {
    let user = Layer::keyed("user", |r: &Request| r.user).plans(
        [
            Plan::new("free")
                .limit(Kind::FixedWindow, per_hour(free))
                .limit(Kind::TokenBucket, per_hour(100)),
            Plan::new("pro")
                .limit(Kind::TokenBucket, per_hour(2 * free))
                .limit(Kind::FixedWindow, per_hour(100)),
        ],
        |r: &Request| usize::from(r.pro),
    );
    Arc::new(
        Stack::builder()
            .layer(user)
            .clock(ManualClock::new())
            .shards(1)
            .build()
            .unwrap(),
    )
}

#[test]
fn on_the_fixed_plan_path_a_reader_never_mixes_two_plans() {
    loom::model(|| {
        // As `reader_of_a_plan_change`, with two limits a plan: before the switch free has 1
        // of 2 left; after it, 3 of 4 used in pro, rescaled back to 2 of 2 in free. Pro's first
        // word read as free's window (a far-future window with nothing counted) would show 2.
        let stack = two_plans_of_two_limits(2);
        reader_racing_a_switch_to_pro(&stack);
    });
}

#[test]
fn on_the_fixed_plan_path_racing_calls_of_a_chosen_plan_lose_no_update() {
    loom::model(|| {
        // Both calls fit in free's window of 4 (one used). Each reads the entry under the
        // sequence lock and commits under its lock only if the words and the plan are as read.
        let stack = two_plans_of_two_limits(4);
        assert!(call(&stack, Some(1), false));
        assert_eq!(race(&stack, Some(1), Some(1)), (true, true));
        assert_eq!(left(&stack, 1), [1], "a unit was lost");
    });
}
