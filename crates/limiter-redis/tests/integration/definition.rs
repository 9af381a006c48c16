//! One stack definition (the same `limiter_stack::Layer`s, plans included) built in process,
//! on Redis and leased: the three decide the same calls alike, through the one seam
//! (`AsyncLimiter`); a plan change keeps a key's consumption on Redis as in process; and what
//! only runs in process (an algorithm named by type, plans added while serving) is refused on
//! Redis with the fix.
//!
//! Every backend also does the seam's wider calls alike (held takes and refunds, records,
//! unit refunds, all-or-nothing batches, Redis's in one script call or item by item).
//!
//! Time is injected and frozen, so nothing refills and every count is exact.

use limiter_testkit::redis_server as common;

use std::time::Duration;

use limiter_core::{Limit, ManualClock};
use limiter_redis::{BuildError, CallError, Lease, RedisBackend, RedisStack, Slack};
use limiter_stack::{
    Ask, AsyncLimiter, BatchItem, Charge, Charges, Kind, Layer, Outcome, Plan, Stack, decide_all,
};
use limiter_token_bucket::Gcra;

const START: u64 = 1_795_000_000_000_000_000;

#[derive(Clone)]
struct Request {
    user: String,
    pro: bool,
}

fn req(user: &str, pro: bool) -> Request {
    Request {
        user: user.to_owned(),
        pro,
    }
}

/// The definition: per user, a free or a pro plan; a global cap.
fn checkout() -> Vec<Layer<Request, String>> {
    vec![
        Layer::keyed("user", |r: &Request| Some(r.user.clone())).plans(
            [
                Plan::new("free").limit(Kind::FixedWindow, Limit::per_hour(4)),
                Plan::new("pro").limit(Kind::FixedWindow, Limit::per_hour(8)),
            ],
            |r: &Request| usize::from(r.pro),
        ),
        Layer::global("all").limit(Kind::TokenBucket, Limit::per_hour(20)),
    ]
}

/// What a call's answer says, whoever decided it.
fn answer(outcome: Result<Outcome, limiter_stack::CallError>) -> (bool, u64, Option<usize>) {
    let outcome = outcome.expect("decidable");
    let Outcome::Decided { decision, .. } = outcome else {
        panic!("a failure: {outcome:?}");
    };
    (
        decision.is_allowed(),
        decision.decision().remaining(),
        decision.binding().map(|b| b.layer),
    )
}

/// A backend deciding at `clock`'s time (frozen unless advanced), without a deny cache.
async fn frozen_backend(server: &common::RedisServer, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(server.url())
        .time_from(clock.clone())
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .deny_cache(0)
        .connect()
        .await
        .unwrap()
}

#[tokio::test]
async fn one_definition_decides_alike_in_process_on_redis_and_leased() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = frozen_backend(&server, &clock).await;
    let in_process = Stack::builder()
        .layers(checkout())
        .clock(clock.clone())
        .build()
        .unwrap();
    let on_redis = RedisStack::builder(&backend, "checkout")
        .layers(checkout())
        .build()
        .unwrap();
    // Leased with no slack: every call goes to Redis, and it answers as the per-call path.
    let leased = RedisStack::builder(&backend, "checkout-leased")
        .layers(checkout())
        .build()
        .unwrap();
    let leased = leased.leased(Lease::new(Slack::units(0)));
    let error = leased.unwrap_err();
    assert!(error.to_string().contains("plans"), "{error}");
    let one_plan = || {
        vec![
            Layer::keyed("user", |r: &Request| Some(r.user.clone()))
                .limit(Kind::FixedWindow, Limit::per_hour(4)),
            Layer::global("all").limit(Kind::TokenBucket, Limit::per_hour(20)),
        ]
    };
    let leased = RedisStack::builder(&backend, "checkout-leased")
        .layers(one_plan())
        .build()
        .unwrap()
        .leased(Lease::new(Slack::units(0)))
        .unwrap();
    let plain = Stack::builder()
        .layers(one_plan())
        .clock(clock.clone())
        .build()
        .unwrap();

    // ada free, then pro (half of free's 4 used is half of pro's 8), bob pro; past the caps.
    let calls = [
        ("ada", false),
        ("ada", false),
        ("bob", true),
        ("ada", true),
        ("ada", true),
        ("ada", false),
        ("ada", false),
        ("ada", false),
        ("bob", true),
    ];
    for (i, &(user, pro)) in calls.iter().enumerate() {
        let request = req(user, pro);
        let here = answer(in_process.decide_request(&request, 1).await);
        let there = answer(on_redis.decide_request(&request, 1).await);
        assert_eq!(here, there, "call {i}: {user} (pro: {pro})");
        let plain_answer = answer(plain.decide_request(&request, 1).await);
        let leased_answer = answer(leased.decide_request(&request, 1).await);
        assert_eq!(plain_answer, leased_answer, "call {i} with one plan");
    }
    // The plan change kept ada's consumption: after 2 of 4 (free), 4 of 8 (pro) were in use.
    let peek = in_process.check_n(&req("ada", true), 0).unwrap();
    let on_redis_peek = on_redis.check_n(&req("ada", true), 0).await.unwrap();
    assert_eq!(
        peek.decision().remaining(),
        on_redis_peek.decision().unwrap().remaining()
    );
}

#[tokio::test]
async fn what_runs_only_in_process_is_refused_on_redis_with_the_fix() {
    let server = common::RedisServer::start();
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let by_type = RedisStack::<Request>::builder(&backend, "typed")
        .layer(Layer::global("all").limit_with::<Gcra>(Limit::per_second(5)))
        .build()
        .unwrap_err();
    assert!(
        matches!(&by_type, BuildError::Limit { owner, .. } if owner == "layer `all`")
            && by_type.to_string().contains("limit(Kind::"),
        "{by_type}"
    );
    let open = RedisStack::builder(&backend, "open")
        .layer(
            Layer::keyed("user", |r: &Request| Some(r.user.clone())).open_plans(
                4,
                1,
                |_: &Request| 0,
            ),
        )
        .build()
        .unwrap_err();
    assert!(matches!(open, BuildError::OpenPlans { .. }), "{open}");
    let uneven = RedisStack::builder(&backend, "uneven")
        .layer(
            Layer::keyed("user", |r: &Request| Some(r.user.clone())).plans(
                [
                    Plan::new("one").limit(Kind::FixedWindow, Limit::per_hour(1)),
                    Plan::new("two")
                        .limit(Kind::FixedWindow, Limit::per_hour(1))
                        .limit(Kind::TokenBucket, Limit::per_second(1)),
                ],
                |_: &Request| 0,
            ),
        )
        .build()
        .unwrap_err();
    assert!(
        matches!(&uneven, BuildError::PlanShape { plan, limits: 2, expected: 1, .. } if plan == "two"),
        "{uneven}"
    );
    // A plan function past the plans: the call is refused, naming the layer.
    let stack = RedisStack::builder(&backend, "chooser")
        .layer(
            Layer::keyed("user", |r: &Request| Some(r.user.clone())).plans(
                [Plan::new("only").limit(Kind::FixedWindow, Limit::per_hour(1))],
                |_: &Request| 3,
            ),
        )
        .build()
        .unwrap();
    let error = stack.check(&req("ada", false)).await.unwrap_err();
    assert_eq!(
        error,
        CallError::NoSuchPlan {
            layer: "user".to_owned(),
            chosen: 3,
            plans: 1
        }
    );
    assert!(error.to_string().contains("0 to 0"), "{error}");
}

/// What one backend answered to the seam's wider calls, step by step; batches through the
/// seam's takes and refunds, or (`in_one_script`: the Redis stack each item decides on) as one
/// script call.
async fn wider_calls(
    stack: &dyn Charges<Request>,
    in_one_script: Option<&RedisStack<Request>>,
) -> Vec<(bool, u64)> {
    let (ada, bob) = (req("ada", false), req("bob", false));
    let mut seen = Vec::new();
    let note = |seen: &mut Vec<(bool, u64)>, outcome: &Outcome| {
        let Outcome::Decided { decision, .. } = outcome else {
            panic!("a failure: {outcome:?}");
        };
        seen.push((decision.is_allowed(), decision.decision().remaining()));
    };
    // A take that can be undone: each backend's typed grant (`Refunds`), refunded inside the
    // undo.
    let taken = stack.take_undoable(&ada, 3, None).await.unwrap();
    note(&mut seen, &taken.outcome);
    let refunded = (taken.undo.expect("a grant to undo"))().await.unwrap();
    note(&mut seen, &refunded);
    for (request, cost, charge) in [
        (&bob, 3, Charge::Record),
        (&bob, 2, Charge::Take),
        (&bob, 1, Charge::Refund),
    ] {
        let asked = stack.ask(request, Ask::new(cost, charge)).await.unwrap();
        note(&mut seen, &asked);
    }
    let item = |request, cost, charge| BatchItem {
        limiter: stack,
        request,
        cost,
        charge,
        shadow: false,
    };
    for batch in [
        [item(&ada, 2, Charge::Take), item(&bob, 3, Charge::Take)],
        [item(&ada, 2, Charge::Take), item(&bob, 2, Charge::Take)],
        [item(&ada, 1, Charge::Record), item(&bob, 1, Charge::Refund)],
    ] {
        let answer = match in_one_script {
            None => decide_all(&batch, None).await.unwrap(),
            Some(stack) => limiter_redis::decide_batch(&batch, &[stack, stack], None)
                .await
                .unwrap(),
        };
        seen.push((answer.admitted, 0));
        for outcome in &answer.outcomes {
            note(&mut seen, outcome);
        }
    }
    for request in [&ada, &bob] {
        note(&mut seen, &stack.decide_request(request, 0).await.unwrap());
    }
    seen
}

#[tokio::test]
async fn every_backend_does_the_seams_wider_calls_alike() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let backend = frozen_backend(&server, &clock).await;
    let layers = || {
        vec![
            Layer::keyed("user", |r: &Request| Some(r.user.clone()))
                .limit(Kind::FixedWindow, Limit::per_hour(4)),
            Layer::global("all").limit(Kind::TokenBucket, Limit::per_hour(20)),
        ]
    };
    let in_process = Stack::builder()
        .layers(layers())
        .clock(clock.clone())
        .build()
        .unwrap();
    let on_redis = RedisStack::builder(&backend, "seam")
        .layers(layers())
        .build()
        .unwrap();
    let leased = RedisStack::builder(&backend, "seam-leased")
        .layers(layers())
        .build()
        .unwrap()
        .leased(Lease::new(Slack::units(0)))
        .unwrap();
    let expected = wider_calls(&in_process, None).await;
    // The refund gave ada's 3 back; bob's record, denial and unit refund; a refused batch took
    // nothing from ada; the last batch recorded ada's unit and gave bob's back.
    assert_eq!(
        expected,
        [
            (true, 1),
            (true, 4),
            (true, 1),
            (false, 1),
            (true, 2),
            (false, 0),
            (true, 4),
            (false, 2),
            (true, 0),
            (true, 2),
            (true, 0),
            (true, 0),
            (true, 1),
            (true, 1),
            (true, 1),
            (true, 1),
        ]
    );
    assert_eq!(wider_calls(&on_redis, None).await, expected, "on Redis");
    assert_eq!(wider_calls(&leased, None).await, expected, "leased");
    // The same batches in one script call each, given the stacks by type (a leased stack's
    // batches are decided on its per-call stack).
    let in_one_script = RedisStack::builder(&backend, "seam-script")
        .layers(layers())
        .build()
        .unwrap();
    let answers = wider_calls(&in_one_script, Some(&in_one_script)).await;
    assert_eq!(answers, expected, "one script per batch");
    let leased_script = RedisStack::builder(&backend, "seam-leased-script")
        .layers(layers())
        .build()
        .unwrap()
        .leased(Lease::new(Slack::units(0)))
        .unwrap();
    let answers = wider_calls(&leased_script, Some(leased_script.stack())).await;
    assert_eq!(answers, expected, "leased, one script per batch");
}
