//! Open layers: plans added while the stack serves (`Layer::open_plans`, `Stack::add_plan`).
//! A plan added later behaves exactly as the same plan built in; a key keeps its consumption
//! when its plan changes; every way to add a plan wrongly is refused with the fix; and plans
//! added while other threads decide never disturb them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use limiter_core::{Limit, ManualClock};
use limiter_stack::{AsyncLimiter, BuildError, CallError, Kind, Layer, Plan, Stack};

/// A request: the key, and the plan its caller named.
type Request = (u32, usize);

fn plan(kind: Kind, count: u64, secs: u64) -> Plan {
    Plan::new(format!("{kind} {count}/{secs}s"))
        .limit(kind, Limit::new(count, Duration::from_secs(secs)))
}

fn specs() -> Vec<(Kind, u64, u64)> {
    vec![
        (Kind::FixedWindow, 10, 60),
        (Kind::TokenBucket, 4, 1),
        (Kind::SlidingWindow, 25, 10),
        (Kind::TokenBucket, 100, 60),
    ]
}

fn open_stack(clock: &ManualClock, capacity: usize) -> Stack<Request, u32, ManualClock> {
    Stack::builder()
        .clock(clock.clone())
        .layer(Layer::keyed("user", |r: &Request| Some(r.0)).open_plans(
            capacity,
            1,
            |r: &Request| r.1,
        ))
        .build()
        .unwrap()
}

#[test]
fn plans_added_while_serving_decide_exactly_as_plans_built_in() {
    let (open_clock, built_clock) = (ManualClock::new(), ManualClock::new());
    let open = open_stack(&open_clock, 8);
    for (i, &(kind, count, secs)) in specs().iter().enumerate() {
        assert_eq!(open.add_plan(0, plan(kind, count, secs)).unwrap(), i);
    }
    let built: Stack<Request, u32, ManualClock> = Stack::builder()
        .clock(built_clock.clone())
        .layer(Layer::keyed("user", |r: &Request| Some(r.0)).plans(
            specs().into_iter().map(|(k, c, s)| plan(k, c, s)),
            |r: &Request| r.1,
        ))
        .build()
        .unwrap();
    // A fixed pseudo-random walk over keys, plans, costs and time.
    let mut seed = 0x9e37_79b9_u64;
    for _ in 0..4_000 {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let request = (((seed >> 40) % 3) as u32, ((seed >> 20) % 4) as usize);
        let cost = (seed >> 50) % 4;
        let step = (seed >> 8) % 300_000_000;
        open_clock.advance(Duration::from_nanos(step));
        built_clock.advance(Duration::from_nanos(step));
        let (a, b) = (open.check_n(&request, cost), built.check_n(&request, cost));
        assert_eq!(a, b, "{request:?} cost {cost}");
    }
}

#[test]
fn naming_another_limit_keeps_the_consumption() {
    let clock = ManualClock::new();
    let stack = open_stack(&clock, 4);
    let ten = stack.add_plan(0, plan(Kind::FixedWindow, 10, 60)).unwrap();
    let twenty = stack.add_plan(0, plan(Kind::FixedWindow, 20, 60)).unwrap();
    for _ in 0..5 {
        assert!(stack.check(&(1, ten)).unwrap().is_allowed());
    }
    // 5 of 10 is 10 of 20: naming a larger limit does not reset the budget.
    let raised = stack.check_n(&(1, twenty), 0).unwrap();
    assert_eq!(
        (raised.decision().limit(), raised.decision().remaining()),
        (20, 10)
    );
    for _ in 0..10 {
        assert!(stack.check(&(1, twenty)).unwrap().is_allowed());
    }
    assert!(stack.check(&(1, twenty)).unwrap().is_denied());
    assert!(
        stack.check(&(1, ten)).unwrap().is_denied(),
        "20 of 20 is 10 of 10"
    );
    // Another key is untouched.
    assert_eq!(
        stack.check_n(&(2, ten), 0).unwrap().decision().remaining(),
        10
    );
}

#[test]
fn every_wrong_plan_is_refused_with_the_fix() {
    let clock = ManualClock::new();
    let stack = open_stack(&clock, 2);
    // No plan yet: a call naming one is refused, naming the layer.
    let err = stack.check(&(1, 0)).unwrap_err();
    assert!(
        matches!(
            err,
            CallError::NoSuchPlan {
                chosen: 0,
                plans: 0,
                ..
            }
        ),
        "{err}"
    );
    let two_limits = plan(Kind::TokenBucket, 1, 1).limit(Kind::TokenBucket, Limit::per_minute(5));
    let err = stack.add_plan(0, two_limits).unwrap_err();
    assert!(
        matches!(
            err,
            BuildError::PlanShape {
                limits: 2,
                expected: 1,
                ..
            }
        ),
        "{err}"
    );
    let refused = Plan::new("zero").limit(Kind::TokenBucket, Limit::per_second(0));
    let err = stack.add_plan(0, refused).unwrap_err();
    assert!(err.to_string().contains("layer `user`"), "{err}");
    let err = stack
        .add_plan(3, plan(Kind::TokenBucket, 1, 1))
        .unwrap_err();
    assert_eq!(
        err,
        BuildError::NoSuchLayer {
            layer: 3,
            layers: 1
        }
    );
    assert_eq!(stack.add_plan(0, plan(Kind::TokenBucket, 1, 1)), Ok(0));
    assert_eq!(stack.add_plan(0, plan(Kind::TokenBucket, 2, 1)), Ok(1));
    let err = stack
        .add_plan(0, plan(Kind::TokenBucket, 3, 1))
        .unwrap_err();
    assert!(
        matches!(err, BuildError::PlansFull { capacity: 2, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("more room"), "{err}");
    assert!(matches!(
        stack.check(&(1, 2)),
        Err(CallError::NoSuchPlan { plans: 2, .. })
    ));

    // A layer built closed takes no plans.
    let closed: Stack<Request, u32, ManualClock> = Stack::builder()
        .clock(clock.clone())
        .layer(
            Layer::keyed("closed", |r: &Request| Some(r.0))
                .limit(Kind::TokenBucket, Limit::per_second(1)),
        )
        .build()
        .unwrap();
    let err = closed
        .add_plan(0, plan(Kind::TokenBucket, 1, 1))
        .unwrap_err();
    assert!(err.to_string().contains("open_plans"), "{err}");

    // Built wrongly: a global layer with nothing to start from, no limits per plan, too many.
    let build = |layer: Layer<Request, u32>| {
        Stack::builder()
            .layer(layer)
            .build()
            .map(|_: Stack<Request, u32>| ())
    };
    assert!(matches!(
        build(Layer::global("g").open_plans(4, 1, |_| 0)),
        Err(BuildError::NoLimits { .. })
    ));
    assert!(matches!(
        build(Layer::keyed("k", |r: &Request| Some(r.0)).open_plans(4, 0, |_| 0)),
        Err(BuildError::NoLimits { .. })
    ));
    assert!(matches!(
        build(Layer::keyed("k", |r: &Request| Some(r.0)).open_plans(4, 5, |_| 0)),
        Err(BuildError::TooManyLimits { .. })
    ));
    assert!(matches!(
        build(Layer::keyed("k", |r: &Request| Some(r.0)).open_plans(1 << 20, 1, |_| 0)),
        Err(BuildError::TooManyPlans { .. })
    ));
    // A global layer that starts from a built plan, and grows.
    let global: Stack<Request, u32, ManualClock> = Stack::builder()
        .clock(clock.clone())
        .layer(
            Layer::global("g")
                .limit(Kind::FixedWindow, Limit::per_minute(4))
                .open_plans(2, 1, |r: &Request| r.1),
        )
        .build()
        .unwrap();
    assert_eq!(global.add_plan(0, plan(Kind::FixedWindow, 8, 60)), Ok(1));
    assert!(global.check_n(&(0, 0), 2).unwrap().is_allowed());
    assert_eq!(
        global.check_n(&(0, 1), 0).unwrap().decision().remaining(),
        4,
        "2 of 4 is 4 of 8"
    );
}

#[test]
fn the_layer_describes_every_plan_added() {
    let clock = ManualClock::new();
    let stack = open_stack(&clock, 4);
    stack.add_plan(0, plan(Kind::TokenBucket, 3, 1)).unwrap();
    stack.add_plan(0, plan(Kind::FixedWindow, 7, 60)).unwrap();
    let layers = AsyncLimiter::layers(&stack);
    assert_eq!(
        layers[0].plans,
        vec![vec![Limit::per_second(3)], vec![Limit::per_minute(7)]]
    );
    assert_eq!(stack.layers()[0].plan_count(), 2);
}

/// One thread adds plans while three decide on the plans added so far: every call is decided
/// (none sees a plan half added), indexes come out in order, and each plan, once the key was
/// moved to it, never lets the key past its own limit at one instant.
#[test]
fn plans_added_while_threads_decide_never_disturb_them() {
    let clock = ManualClock::new();
    let stack = Arc::new(open_stack(&clock, 64));
    let newest = Arc::new(AtomicUsize::new(0));
    stack
        .add_plan(0, plan(Kind::FixedWindow, 1_000, 60))
        .unwrap();
    std::thread::scope(|scope| {
        let adder = {
            let (stack, newest) = (Arc::clone(&stack), Arc::clone(&newest));
            scope.spawn(move || {
                for i in 1..64 {
                    let index = stack
                        .add_plan(0, plan(Kind::FixedWindow, 1_000 + i, 60))
                        .unwrap();
                    assert_eq!(index, i as usize);
                    newest.store(index, Ordering::Release);
                }
            })
        };
        let deciders: Vec<_> = (0..3)
            .map(|t| {
                let (stack, newest) = (Arc::clone(&stack), Arc::clone(&newest));
                scope.spawn(move || {
                    let mut admitted = 0_u64;
                    for n in 0..20_000_u32 {
                        let plan = newest.load(Ordering::Acquire);
                        let decision = stack
                            .check(&(n % 4 + t * 4, plan))
                            .expect("every added plan is decided");
                        assert_eq!(decision.decision().limit(), 1_000 + plan as u64);
                        admitted += u64::from(decision.is_allowed());
                    }
                    admitted
                })
            })
            .collect();
        adder.join().unwrap();
        // Each thread's four keys: at most 1,063 each, the largest limit, at this one instant.
        for decider in deciders {
            assert!(decider.join().unwrap() <= 4 * 1_063);
        }
    });
    assert_eq!(stack.layers()[0].plan_count(), 64);
}
