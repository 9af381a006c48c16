//! The stack's semantics, one at a time, on a `ManualClock`: all or nothing, several limits per
//! key, plans that carry consumption over, the stacked decision, peeks, refunds and bad input.

use std::time::Duration;

use limiter_core::{DecisionError, Limit, ManualClock};
use limiter_stack::Kind;
use limiter_stack::{BuildError, CallError, Layer, LayerAnswers, Plan, RefundError, Stack};

#[derive(Clone, Copy, Debug)]
struct Request {
    user: u64,
    ip: u64,
    pro: bool,
    write: bool,
}

fn req(user: u64) -> Request {
    Request {
        user,
        ip: 100 + user,
        pro: false,
        write: false,
    }
}

fn per_second(n: u64) -> Limit {
    Limit::per_second(n)
}

/// per-user 3/s, per-ip 5/s, global 4/s.
fn three_layers(clock: &ManualClock) -> Stack<Request, u64, ManualClock> {
    Stack::builder()
        .layer(
            Layer::keyed("per-user", |r: &Request| Some(r.user))
                .limit(Kind::TokenBucket, per_second(3)),
        )
        .layer(
            Layer::keyed("per-ip", |r: &Request| Some(r.ip))
                .limit(Kind::TokenBucket, per_second(5)),
        )
        .layer(Layer::global("global").limit(Kind::TokenBucket, per_second(4)))
        .clock(clock.clone())
        .build()
        .unwrap()
}

fn remaining(stack: &Stack<Request, u64, ManualClock>, r: &Request) -> Vec<u64> {
    each_layer(stack, r, 0)
        .iter()
        .map(|l| l.decision.remaining())
        .collect()
}

/// Every layer's answer to `cost` units of `r`, checked against the compact answer.
fn each_layer(stack: &Stack<Request, u64, ManualClock>, r: &Request, cost: u64) -> LayerAnswers {
    let mut each = LayerAnswers::new();
    let decision = stack.check_each(r, cost, &mut each).unwrap();
    assert_eq!(each.summary(), decision);
    each
}

#[test]
fn a_call_is_admitted_only_if_every_layer_admits_and_a_denial_changes_nothing() {
    let clock = ManualClock::new();
    let stack = three_layers(&clock);
    for _ in 0..3 {
        assert!(stack.check(&req(1)).unwrap().is_allowed());
    }
    assert_eq!(remaining(&stack, &req(1)), [0, 2, 1]);
    // User 1 is out: denied by its own layer, and neither per-ip nor global is touched.
    let denied = stack.check(&req(1)).unwrap();
    assert!(denied.is_denied());
    assert_eq!(
        stack.layer_name(denied.binding().unwrap().layer),
        Some("per-user")
    );
    assert_eq!(remaining(&stack, &req(1)), [0, 2, 1]);
    // User 2 takes the last global unit; user 3 is then denied by the global layer, and its
    // own layers stay full (its keys are not even inserted).
    assert!(stack.check(&req(2)).unwrap().is_allowed());
    let entries = stack.len();
    let denied = stack.check(&req(3)).unwrap();
    assert_eq!(
        stack.layer_name(denied.binding().unwrap().layer),
        Some("global")
    );
    assert_eq!(remaining(&stack, &req(3)), [3, 5, 0]);
    assert_eq!(stack.len(), entries, "a denied call inserted a key");
}

#[test]
fn the_stacked_decision_takes_the_least_remaining_and_the_longest_wait() {
    let clock = ManualClock::new();
    let stack = three_layers(&clock);
    let d = stack.check(&req(1)).unwrap();
    // per-user 2 of 3, per-ip 4 of 5, global 3 of 4: the user's layer binds.
    assert_eq!(d.decision().remaining(), 2);
    assert_eq!(d.decision().limit(), 3);
    assert_eq!(
        stack.layer_name(d.binding().unwrap().layer),
        Some("per-user")
    );
    for user in 2..5 {
        stack.check(&req(user)).unwrap();
    }
    // Global empty since 4 calls at t=0: one unit back after 250 ms. User 1's own layer has 2.
    let denied = stack.check(&req(1)).unwrap();
    assert!(denied.is_denied());
    assert_eq!(denied.decision().retry_after(), Duration::from_millis(250));
    assert_eq!(denied.decision().remaining(), 0);
    // The retry time is exact: admitted then, not a nanosecond before.
    clock.advance(Duration::from_millis(250) - Duration::from_nanos(1));
    assert!(stack.check(&req(1)).unwrap().is_denied());
    clock.advance_nanos(1);
    assert!(stack.check(&req(1)).unwrap().is_allowed());
}

#[test]
fn retry_after_waits_for_every_layer_not_just_the_first_to_deny() {
    let clock = ManualClock::new();
    // 1 per second per user, 2 per 10 s global: after two users, the global layer binds for
    // 5 s, and the user's own layer would have admitted after 1 s.
    let stack: Stack<Request, u64, ManualClock> = Stack::builder()
        .layer(
            Layer::keyed("user", |r: &Request| Some(r.user))
                .limit(Kind::TokenBucket, per_second(1)),
        )
        .layer(
            Layer::global("global")
                .limit(Kind::TokenBucket, Limit::new(2, Duration::from_secs(10))),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(stack.check(&req(1)).unwrap().is_allowed());
    assert!(stack.check(&req(2)).unwrap().is_allowed());
    let d = each_layer(&stack, &req(1), 1);
    assert_eq!(d.summary().decision().retry_after(), Duration::from_secs(5));
    let parts: Vec<_> = d.iter().map(|l| l.decision.retry_after()).collect();
    assert_eq!(parts, [Duration::from_secs(1), Duration::from_secs(5)]);
}

#[test]
fn several_limits_on_one_key_are_all_or_nothing() {
    let clock = ManualClock::new();
    // 2 per second and 3 per 10 seconds on the same key.
    let stack: Stack<Request, u64, ManualClock> = Stack::builder()
        .layer(
            Layer::keyed("user", |r: &Request| Some(r.user))
                .limit(Kind::TokenBucket, per_second(2))
                .limit(Kind::SlidingWindow, Limit::new(3, Duration::from_secs(10))),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let first = stack.check(&req(1)).unwrap();
    let layer = first.binding().unwrap();
    assert!(first.is_allowed());
    assert_eq!(layer.limit_index, 0, "the bucket has the fewest left");
    assert_eq!(
        layer.limit_reset_after_nanos, 500_000_000,
        "the bucket's own reset"
    );
    assert!(
        layer.decision.reset_after_nanos() > 500_000_000,
        "the layer's reset is its latest limit's, the window's"
    );
    assert!(stack.check(&req(1)).unwrap().is_allowed());
    let d = stack.check(&req(1)).unwrap();
    assert!(d.is_denied());
    assert_eq!(
        d.binding().unwrap().limit_index,
        0,
        "the per-second limit binds"
    );
    clock.advance(Duration::from_secs(1));
    assert!(stack.check(&req(1)).unwrap().is_allowed());
    // Per second has 1 again, but the 10-second window is spent: denied, and the per-second
    // limit keeps its unit.
    clock.advance(Duration::from_secs(1));
    let d = stack.check(&req(1)).unwrap();
    assert!(d.is_denied());
    assert_eq!(d.binding().unwrap().limit_index, 1);
    let peek = stack.peek(&req(1)).unwrap();
    assert_eq!(peek.decision().remaining(), 0);
    assert_eq!(peek.binding().unwrap().limit_index, 1);
    let layer = peek.binding().unwrap();
    assert!(layer.decision.is_allowed(), "a peek is admitted");
}

fn by_plan(clock: &ManualClock) -> Stack<Request, u64, ManualClock> {
    Stack::builder()
        .layer(
            Layer::keyed("writes", |r: &Request| r.write.then_some(r.user)).plans(
                [
                    Plan::new("free").limit(Kind::TokenBucket, per_second(10)),
                    Plan::new("pro").limit(Kind::TokenBucket, per_second(100)),
                    Plan::new("windowed").limit(Kind::FixedWindow, per_second(4)),
                ],
                |r: &Request| usize::from(r.pro),
            ),
        )
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn a_changed_plan_keeps_the_key_s_consumption_rescaled() {
    let clock = ManualClock::new();
    let stack = by_plan(&clock);
    let free = Request {
        write: true,
        ..req(1)
    };
    let pro = Request { pro: true, ..free };
    for _ in 0..5 {
        assert!(stack.check(&free).unwrap().is_allowed());
    }
    // Half of free's 10 used: half of pro's 100 used, neither reset nor stuck at 10.
    let d = stack.check(&pro).unwrap();
    assert!(d.is_allowed());
    assert_eq!(d.decision().remaining(), 49);
    assert_eq!(d.decision().limit(), 100);
    // Back to free: 51 of 100 used is 5.1 of 10, rounded up to 6; 4 left.
    assert_eq!(stack.peek(&free).unwrap().decision().remaining(), 4);
    // Reads skip the layer entirely.
    assert!(stack.peek(&req(1)).unwrap().binding().is_none());
}

#[test]
fn a_plan_function_out_of_range_is_an_error_naming_the_layer() {
    let clock = ManualClock::new();
    let stack: Stack<Request, u64, ManualClock> = Stack::builder()
        .layer(Layer::keyed("writes", |r: &Request| Some(r.user)).plans(
            [Plan::new("only").limit(Kind::TokenBucket, per_second(1))],
            |r: &Request| r.user as usize,
        ))
        .clock(clock)
        .build()
        .unwrap();
    let err = stack.check(&req(3)).unwrap_err();
    assert_eq!(
        err,
        CallError::NoSuchPlan {
            layer: "writes".into(),
            chosen: 3,
            plans: 1
        }
    );
    assert!(err.to_string().contains("Layer::plans"), "{err}");
}

#[test]
fn a_cost_above_one_layer_s_burst_is_an_error_and_changes_nothing() {
    let clock = ManualClock::new();
    let stack = three_layers(&clock);
    let err = stack.check_n(&req(1), 4).unwrap_err();
    assert_eq!(
        err,
        CallError::Decision {
            layer: "per-user".into(),
            limit_index: 0,
            source: DecisionError::CostExceedsBurst { cost: 4, burst: 3 }
        }
    );
    assert_eq!(remaining(&stack, &req(1)), [3, 5, 4]);
    assert!(stack.is_empty());
}

#[test]
fn peeks_and_denials_insert_nothing_and_full_keys_are_reclaimed() {
    let clock = ManualClock::new();
    let stack = three_layers(&clock);
    for user in 0..100 {
        stack.peek(&req(user)).unwrap();
    }
    assert!(stack.is_empty());
    for user in 0..4 {
        assert!(stack.check(&req(user)).unwrap().is_allowed());
    }
    assert_eq!(stack.len(), 8, "4 users, each in two keyed layers");
    for user in 4..100 {
        assert!(stack.check(&req(user)).unwrap().is_denied());
    }
    assert_eq!(stack.len(), 8, "denied new keys were inserted");
    clock.advance(Duration::from_secs(1));
    assert_eq!(stack.reclaim_full(), 8);
    assert!(stack.is_empty());
    assert_eq!(remaining(&stack, &req(0)), [3, 5, 4]);
}

#[test]
fn the_same_key_in_several_layers_and_any_order_of_layers() {
    let clock = ManualClock::new();
    let global = || Layer::global("global").limit(Kind::TokenBucket, per_second(3));
    let a =
        || Layer::keyed("a", |r: &Request| Some(r.user)).limit(Kind::TokenBucket, per_second(2));
    let b =
        || Layer::keyed("b", |r: &Request| Some(r.user)).limit(Kind::FixedWindow, per_second(5));
    let orders: [Stack<Request, u64, ManualClock>; 2] = [
        Stack::builder()
            .layer(a())
            .layer(b())
            .layer(global())
            .clock(clock.clone())
            .build()
            .unwrap(),
        Stack::builder()
            .layer(global())
            .layer(b())
            .layer(a())
            .clock(clock.clone())
            .build()
            .unwrap(),
    ];
    for stack in &orders {
        let admitted: Vec<bool> = (0..4)
            .map(|_| stack.check(&req(9)).unwrap().is_allowed())
            .collect();
        assert_eq!(admitted, [true, true, false, false]);
        assert!(stack.check(&req(8)).unwrap().is_allowed());
        assert!(stack.check(&req(7)).unwrap().is_denied(), "global holds 3");
    }
}

#[test]
fn a_refund_gives_back_at_most_what_was_taken_and_never_above_full() {
    let clock = ManualClock::new();
    let stack = three_layers(&clock);
    let (d, grant) = stack.acquire(&req(1), 3).unwrap();
    assert!(d.is_allowed());
    let mut grant = grant.unwrap();
    assert_eq!(remaining(&stack, &req(1)), [0, 2, 1]);
    stack.refund(&req(1), &mut grant, 2).unwrap();
    assert_eq!(remaining(&stack, &req(1)), [2, 4, 3]);
    assert_eq!(
        stack.refund(&req(1), &mut grant, 2),
        Err(RefundError::ExceedsGrant {
            units: 2,
            left: 1,
            taken: 3
        })
    );
    // The last unit has come back on its own after 1/3 s on per-user (and sooner elsewhere):
    // refunding it then must not lift any layer above full.
    clock.advance(Duration::from_secs(1));
    stack.refund(&req(1), &mut grant, 1).unwrap();
    assert_eq!(remaining(&stack, &req(1)), [3, 5, 4]);
    assert_eq!(grant.left(), 0);
    let other = three_layers(&clock);
    let (_, grant) = other.acquire(&req(1), 1).unwrap();
    assert_eq!(
        stack.refund(&req(1), &mut grant.unwrap(), 1),
        Err(RefundError::WrongStack)
    );
    assert!(
        stack.acquire(&req(1), 0).unwrap().1.is_none(),
        "a peek grants nothing"
    );
}

#[test]
fn a_record_debits_every_layer_and_a_unit_refund_returns_units_without_a_grant() {
    let clock = ManualClock::new();
    let stack = three_layers(&clock);
    let ada = req(1);
    // 3/s per user, 5/s per ip, 4/s global: a record of 6 takes every layer, past two of them.
    let recorded = stack.record(&ada, 6).expect("never refused");
    assert!(recorded.is_denied());
    let binding = recorded.binding().expect("a layer went over");
    assert_eq!(
        stack.layer_name(binding.layer),
        Some("per-user"),
        "{recorded:?}"
    );
    assert_eq!(remaining(&stack, &ada), vec![0, 0, 0]);
    // Another user is refused by the global layer's debt, and takes nothing.
    assert!(stack.check(&req(2)).unwrap().is_denied());
    // Given back without a grant: never above full.
    let after = stack.refund_units(&ada, 100).expect("given back");
    assert!(after.is_allowed(), "{after:?}");
    assert_eq!(remaining(&stack, &ada), vec![3, 5, 4]);
    // A key not held has nothing to give back, and the answer is a peek.
    let fresh = stack.refund_units(&req(9), 2).expect("given back");
    assert_eq!(fresh.decision().remaining(), 3);
    assert_eq!(remaining(&stack, &req(9)), vec![3, 5, 4]);
}

#[test]
fn a_window_refund_returns_units_only_to_the_window_that_counted_them() {
    let clock = ManualClock::new();
    let stack: Stack<Request, u64, ManualClock> = Stack::builder()
        .layer(
            Layer::keyed("user", |r: &Request| Some(r.user))
                .limit(Kind::FixedWindow, per_second(2)),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let (_, grant) = stack.acquire(&req(1), 2).unwrap();
    let mut grant = grant.unwrap();
    clock.advance(Duration::from_secs(1));
    // A new window: a unit taken in the next window must not be wiped by the old refund.
    assert!(stack.check(&req(1)).unwrap().is_allowed());
    stack.refund(&req(1), &mut grant, 2).unwrap();
    assert_eq!(stack.peek(&req(1)).unwrap().decision().remaining(), 1);
}

#[test]
fn bad_stacks_are_refused_with_errors_that_name_the_fix() {
    let none: Result<Stack<Request, u64>, _> = Stack::builder().build();
    assert_eq!(none.unwrap_err(), BuildError::NoLayers);
    let empty: Result<Stack<Request, u64>, _> = Stack::builder().layer(Layer::global("g")).build();
    assert!(
        empty
            .unwrap_err()
            .to_string()
            .contains("`g` has a plan with no limit")
    );
    let shapes: Result<Stack<Request, u64>, _> = Stack::builder()
        .layer(
            Layer::global("g").plans(
                [
                    Plan::new("a").limit(Kind::TokenBucket, per_second(1)),
                    Plan::new("b")
                        .limit(Kind::TokenBucket, per_second(1))
                        .limit(Kind::TokenBucket, per_second(2)),
                ],
                |_: &Request| 0,
            ),
        )
        .build();
    let msg = shapes.unwrap_err().to_string();
    assert!(
        msg.contains("plan `b` has 2 limits but the first plan has 1"),
        "{msg}"
    );
    // A limit its algorithm refuses is reported once, at build, naming its layer or plan,
    // even when a valid limit follows it or it is not the first layer.
    let window_burst: Result<Stack<Request, u64>, _> = Stack::builder()
        .layer(Layer::global("ok").limit(Kind::TokenBucket, per_second(5)))
        .layer(
            Layer::global("g")
                .limit(Kind::SlidingWindow, per_second(10).with_burst(2))
                .limit(Kind::TokenBucket, per_second(5)),
        )
        .build();
    let window_burst = window_burst.unwrap_err();
    assert!(
        window_burst.to_string().starts_with("layer `g`: "),
        "{window_burst}"
    );
    let in_plan: Result<Stack<Request, u64>, _> = Stack::builder()
        .layer(Layer::global("g").plans(
            [
                Plan::new("free").limit(Kind::SlidingWindow, per_second(10).with_burst(2)),
                Plan::new("pro").limit(Kind::SlidingWindow, per_second(20)),
            ],
            |_: &Request| 1,
        ))
        .build();
    let in_plan = in_plan.unwrap_err();
    assert!(
        in_plan.to_string().starts_with("plan `free`: "),
        "{in_plan}"
    );
    for (limit, field) in [
        (Limit::per_second(0), "`count`"),
        (Limit::per_second(3).with_burst(0), "`burst`"),
        (Limit::from_nanos(3, 0), "`period`"),
    ] {
        let zero: Result<Stack<Request, u64>, _> = Stack::builder()
            .layer(Layer::keyed("user", |r: &Request| Some(r.user)).limit(Kind::TokenBucket, limit))
            .build();
        let zero = zero.unwrap_err();
        assert!(
            matches!(&zero, BuildError::Limit { owner, .. } if owner == "layer `user`"),
            "{zero:?}"
        );
        assert!(
            zero.to_string().contains(field),
            "{zero} should name {field}"
        );
    }
    let mut many = Stack::builder();
    for i in 0..9 {
        many = many.layer(Layer::global(format!("g{i}")).limit(Kind::TokenBucket, per_second(1)));
    }
    let many: Result<Stack<Request, u64>, _> = many.build();
    assert_eq!(
        many.unwrap_err(),
        BuildError::TooManyLayers { layers: 9, max: 8 }
    );
}

/// Seven one-limit layers: five keyed on parts of the request (one of them skipped for reads),
/// a global one, and one keyed by plan; deeper than the lean path's sized arms, so it runs on
/// its widest one.
fn seven_layers(clock: &ManualClock) -> Stack<Request, u64, ManualClock> {
    let keyed = |name: &'static str, n: u64, key: fn(&Request) -> Option<u64>| {
        Layer::keyed(name, key).limit(Kind::TokenBucket, per_second(n))
    };
    Stack::builder()
        .layer(keyed("user", 6, |r| Some(r.user)))
        .layer(keyed("ip", 7, |r| Some(r.ip)))
        .layer(keyed("user-pair", 8, |r| Some(r.user / 2)))
        .layer(keyed("writes", 2, |r| r.write.then_some(r.user)))
        .layer(Layer::global("global").limit(Kind::TokenBucket, per_second(9)))
        .layer(keyed("ip-pair", 10, |r| Some(r.ip / 2)))
        .layer(Layer::keyed("tier", |r: &Request| Some(r.user)).plans(
            [
                Plan::new("free").limit(Kind::TokenBucket, per_second(5)),
                Plan::new("pro").limit(Kind::TokenBucket, per_second(11)),
            ],
            |r: &Request| usize::from(r.pro) + usize::from(r.user == 99) * 5,
        ))
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[test]
fn a_deep_stack_is_all_or_nothing_and_reports_every_layer_that_applies() {
    let clock = ManualClock::new();
    let stack = seven_layers(&clock);
    let read = req(4);
    let write = Request {
        write: true,
        ..req(4)
    };
    // A read skips the writes layer: six layers answer, each at its own position.
    let first = each_layer(&stack, &read, 1);
    assert!(first.summary().is_allowed());
    let positions: Vec<usize> = first.iter().map(|l| l.layer).collect();
    assert_eq!(positions, [0, 1, 2, 4, 5, 6]);
    assert_eq!(remaining(&stack, &read), [5, 6, 7, 8, 9, 4]);
    // Writes are bound by their 2/s: two pass, the third is denied and changes no layer.
    for _ in 0..2 {
        assert!(stack.check(&write).unwrap().is_allowed());
    }
    let before = remaining(&stack, &write);
    assert_eq!(before, [3, 4, 5, 0, 6, 7, 2]);
    let denied = stack.check(&write).unwrap();
    assert_eq!(
        stack.layer_name(denied.binding().unwrap().layer),
        Some("writes")
    );
    assert_eq!(remaining(&stack, &write), before);
    // The free tier (5/s) binds reads next: two more pass, then it denies.
    for _ in 0..2 {
        assert!(stack.check(&read).unwrap().is_allowed());
    }
    let denied = stack.check(&read).unwrap();
    assert_eq!(
        stack.layer_name(denied.binding().unwrap().layer),
        Some("tier")
    );
    // Moving to the pro plan keeps the tier's consumption, rescaled: 5 of 5 used is 11 of 11.
    let pro = Request { pro: true, ..read };
    assert!(stack.check(&pro).unwrap().is_denied());
    clock.advance(Duration::from_secs(1));
    assert!(stack.check(&pro).unwrap().is_allowed());
    // A plan out of range is an error naming the layer, on the widest arm too.
    let err = stack.check(&req(99)).unwrap_err();
    assert_eq!(
        err,
        CallError::NoSuchPlan {
            layer: "tier".into(),
            chosen: 5,
            plans: 2
        }
    );
}
