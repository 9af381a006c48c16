//! Leased limits on a real `redis-server`: a node decides locally against units it leased,
//! the fleet stays within the limit plus the slack over every span (proptest over random
//! nodes, costs, time steps, idle sweeps, shutdowns and deaths), a dead node loses only its
//! lease, a node spends what it holds while Redis is down, and a slack of 0 is the per-call
//! path.
//!
//! Time is injected: each node's local clock and Redis's time are one `ManualClock`.

use limiter_testkit::redis_server as common;

use std::time::Duration;

use limiter_core::{Clock, Limit, ManualClock};
use limiter_redis::{
    BackendError, BuildError, Kind, Lease, LeasedLimiter, LeasedStack, OnFailure, Origin,
    RedisBackend, RedisLayer, RedisLimiter, RedisStack, Slack,
};
use proptest::prelude::*;

const SECOND: u64 = 1_000_000_000;
/// Nov 2026 in ns since the Unix epoch: the injected clocks start here.
const START: u64 = 1_795_000_000 * SECOND;

async fn backend(url: &str, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(url)
        .time_from(clock.clone())
        .clock(clock.clone())
        .timeout(Duration::from_secs(5))
        .deny_cache(0)
        .connect()
        .await
        .unwrap()
}

/// One node: its own connection, its own leases.
async fn node(
    url: &str,
    clock: &ManualClock,
    name: &str,
    kind: Kind,
    limit: Limit,
    lease: Lease,
) -> LeasedLimiter {
    RedisLimiter::builder(&backend(url, clock).await, name)
        .limit(kind, limit)
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
        .leased(lease)
        .unwrap()
}

/// 100 an hour per user and 150 for all, leased with a slack of 10 units.
fn user_and_all(backend: &RedisBackend, name: &str) -> LeasedStack<String> {
    RedisStack::builder(backend, name)
        .layer(
            RedisLayer::keyed("user", |u: &String| Some(u.clone()))
                .limit(Kind::TokenBucket, Limit::per_hour(100)),
        )
        .layer(RedisLayer::global("all").limit(Kind::FixedWindow, Limit::per_hour(150)))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
        .leased(Lease::new(Slack::units(10)).ttl(Duration::from_secs(60)))
        .unwrap()
}

/// Remaining units of `key` as Redis holds them (a peek on the per-call path).
async fn redis_remaining(node: &LeasedLimiter, key: &str) -> u64 {
    let peek = node.stack().stack().check_n(&key.to_owned(), 0).await;
    peek.unwrap().decision().unwrap().remaining()
}

#[tokio::test]
async fn a_hot_key_is_decided_locally_and_renews_once_per_lease() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let node = node(
        &server.url(),
        &clock,
        "hot",
        Kind::TokenBucket,
        Limit::per_minute(1_000),
        Lease::new(Slack::units(100)),
    )
    .await;
    let mut admitted = 0;
    let mut local = 0;
    for _ in 0..1_200 {
        let d = node.check("k").await.unwrap();
        admitted += u64::from(d.is_allowed());
        local += u64::from(d.origin() == Some(Origin::Lease));
    }
    assert_eq!(admitted, 1_000, "exactly the burst at one instant");
    let round_trips = node.stack().stack().backend().stats().round_trips;
    // The first lease is one unit, the next ones the whole slack (100): about 11 calls for
    // 1,000 admissions; denials are answered locally until the denial's wait passes.
    assert!(round_trips <= 15, "{round_trips} script calls");
    assert!(local >= 1_180, "{local} decisions made locally");
    let stats = node.stats();
    assert_eq!(stats.renewals, round_trips);
    assert!(stats.leased <= 1_000);
}

#[tokio::test]
async fn a_slack_of_zero_is_the_per_call_path() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let node = node(
        &server.url(),
        &clock,
        "exact",
        Kind::TokenBucket,
        Limit::per_minute(10),
        Lease::new(Slack::units(0)),
    )
    .await;
    for i in 0..12 {
        let d = node.check("k").await.unwrap();
        assert_eq!(d.is_allowed(), i < 10);
        assert_eq!(d.origin(), Some(Origin::Remote));
    }
    assert_eq!(node.stack().stack().backend().stats().round_trips, 12);
    assert_eq!(node.stats().renewals, 0);
    // A share that rounds to no unit is refused, naming the least share that leases a unit,
    // and so is a slack above the burst: neither silently turns into the per-call path.
    let backend = backend(&server.url(), &clock).await;
    let stack = |name: &str| {
        RedisLimiter::builder(&backend, name)
            .limit(Kind::TokenBucket, Limit::per_minute(10))
            .build()
            .unwrap()
    };
    let err = stack("tiny")
        .leased(Lease::new(Slack::percent(5)))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("a slack of 5% is no whole unit of a burst of 10"),
        "{err}"
    );
    assert!(err.contains("use at least 10%"), "{err}");
    let err = stack("huge")
        .leased(Lease::new(Slack::units(11)))
        .unwrap_err()
        .to_string();
    assert!(err.contains("more than the burst of 10"), "{err}");
    assert!(
        stack("whole")
            .leased(Lease::new(Slack::percent(10)))
            .is_ok()
    );
}

#[tokio::test]
async fn idle_leases_are_handed_back_and_count_again() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let url = server.url();
    let limit = Limit::per_hour(100);
    let lease = Lease::new(Slack::units(40)).ttl(Duration::from_secs(60));
    let node = node(&url, &clock, "idle", Kind::TokenBucket, limit, lease).await;
    // Three calls: the first leases 1 unit, the second spends it, the third leases up to 40.
    for _ in 0..3 {
        node.check("k").await.unwrap();
    }
    let held = 100 - 3 - redis_remaining(&node, "k").await;
    assert!(held > 1, "the second renewal leased more: {held}");
    // The first sweep sees the lease; the second finds nobody spent from it and hands it back.
    assert_eq!(node.refund_idle_leases().await, 0);
    assert_eq!(node.refund_idle_leases().await, held);
    assert_eq!(redis_remaining(&node, "k").await, 97);
    assert_eq!(node.stats().refunded, held);
    // A second hand-back of the same units does nothing: the ledger no longer holds them.
    assert_eq!(node.refund_leases().await, 0);
    assert_eq!(redis_remaining(&node, "k").await, 97);
}

#[tokio::test]
async fn shutdown_hands_back_every_lease() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let url = server.url();
    let lease = Lease::new(Slack::units(30));
    let node = node(
        &url,
        &clock,
        "down",
        Kind::SlidingWindow,
        Limit::per_minute(100),
        lease,
    )
    .await;
    for key in ["a", "b", "c"] {
        for _ in 0..3 {
            assert!(node.check(key).await.unwrap().is_allowed());
        }
    }
    let returned = node.refund_leases().await;
    assert!(returned > 0);
    for key in ["a", "b", "c"] {
        assert_eq!(redis_remaining(&node, key).await, 97, "key {key}");
    }
}

#[tokio::test]
async fn a_dead_node_loses_only_its_lease_and_its_slack_comes_back_when_it_expires() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let url = server.url();
    let limit = Limit::per_hour(1_000);
    let lease = Lease::new(Slack::units(50)).ttl(Duration::from_secs(10));
    let dying = node(&url, &clock, "dead", Kind::TokenBucket, limit, lease).await;
    for _ in 0..3 {
        dying.check("k").await.unwrap();
    }
    let ledger = format!(
        "{}:lease",
        dying.stack().stack().redis_keys(&"k".to_owned())[0]
    );
    let lost = 1_000 - 3 - redis_remaining(&dying, "k").await;
    assert_eq!(lost, 50, "the whole slack, to the one node asking");
    drop(dying); // killed: nothing refunded

    let survivor = node(&url, &clock, "dead", Kind::TokenBucket, limit, lease).await;
    let mut admitted = 0;
    for _ in 0..1_100 {
        admitted += u64::from(survivor.check("k").await.unwrap().is_allowed());
    }
    assert_eq!(
        admitted,
        1_000 - 3 - lost,
        "the dead node's lease is lost, nothing more"
    );
    let mut conn = server.client();
    let holders: u64 = redis::cmd("HLEN").arg(&ledger).query(&mut conn).unwrap();
    assert!(holders >= 1, "the dead lease is still recorded");
    // Once its lease expires the dead node holds no slack: only the survivor is recorded.
    clock.advance(Duration::from_secs(11));
    survivor.check("k").await.unwrap();
    let fields: Vec<String> = redis::cmd("HKEYS").arg(&ledger).query(&mut conn).unwrap();
    assert!(
        fields
            .iter()
            .all(|f| f.starts_with(survivor.stack().holder())),
        "{fields:?}"
    );
}

#[tokio::test]
async fn while_redis_is_down_a_node_spends_its_lease_then_follows_its_policy() {
    let mut server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let url = server.url();
    let lease = Lease::new(Slack::units(20)).ttl(Duration::from_secs(60));
    let node = node(
        &url,
        &clock,
        "outage",
        Kind::TokenBucket,
        Limit::per_hour(1_000),
        lease,
    )
    .await;
    node.check("k").await.unwrap();
    node.check("k").await.unwrap();
    let d = node.check("k").await.unwrap();
    assert_eq!(
        d.origin(),
        Some(Origin::Remote),
        "the renewal that took the big lease"
    );
    server.kill();
    let mut local = 0;
    loop {
        let d = node.check("k").await.unwrap();
        match d.origin() {
            Some(Origin::Lease) => {
                assert!(d.is_allowed());
                local += 1;
            }
            None if d.failed_closed() => break,
            _ => panic!("unexpected answer {d:?}"),
        }
    }
    assert_eq!(
        local, 20,
        "every unit leased before the outage, then the policy"
    );
    assert!(node.check("k").await.unwrap().is_denied());
    server.restart();
    clock.advance(Duration::from_secs(30)); // past the breaker's open time
    let mut answered = false;
    for _ in 0..50 {
        let d = node.check("k").await.unwrap();
        if d.origin() == Some(Origin::Remote) || d.origin() == Some(Origin::Lease) {
            assert!(d.is_allowed());
            answered = true;
            break;
        }
    }
    assert!(answered, "renewals resume once Redis is back");
}

#[tokio::test]
async fn a_lease_is_never_spent_once_redis_may_have_given_its_slack_away() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let url = server.url();
    let lease = Lease::new(Slack::units(10)).ttl(Duration::from_secs(10));
    // Per day, so nothing refills to speak of while the clock moves.
    let node = node(
        &url,
        &clock,
        "expiry",
        Kind::TokenBucket,
        Limit::per_day(1_000),
        lease,
    )
    .await;
    for _ in 0..3 {
        node.check("k").await.unwrap();
    }
    // The node stops a tenth of the time to live (and at most a tick) before Redis forgets
    // the lease: still local at 8.9 s, never at 9 s or later.
    clock.advance(Duration::from_millis(8_900));
    assert_eq!(node.check("k").await.unwrap().origin(), Some(Origin::Lease));
    clock.advance(Duration::from_millis(100));
    let d = node.check("k").await.unwrap();
    assert_eq!(
        d.origin(),
        Some(Origin::Remote),
        "an expired lease renews: {d:?}"
    );
    // The renewal refunded what was left while Redis still recorded the lease: nothing
    // was lost and nothing counted twice.
    let held = 1_000 - redis_remaining(&node, "k").await;
    let spent = 5; // three, one at 8.9 s, one at 9 s
    assert!(held >= spent && held <= spent + 10, "{held}");
}

#[tokio::test]
async fn a_lease_outside_its_range_is_refused_with_the_fix() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let limiter = RedisLimiter::builder(&backend(&server.url(), &clock).await, "bad")
        .limit(Kind::TokenBucket, Limit::per_second(10))
        .build()
        .unwrap();
    let error = limiter
        .leased(Lease::new(Slack::units(5)).ttl(Duration::from_millis(1)))
        .unwrap_err();
    assert!(matches!(error, BuildError::Lease { .. }));
    let text = error.to_string();
    assert!(
        text.contains("1ms") && text.contains("choose one"),
        "{text}"
    );
}

/// A lease ledger holding what no lease wrote (another type at its key, or an entry of
/// another shape) fails the call with the key named, takes nothing and is left as found: an
/// entry dropped as if expired would let the leases outstanding pass the slack unseen.
#[tokio::test]
async fn a_ledger_no_lease_wrote_is_refused_and_left_alone() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let lease = Lease::new(Slack::units(20)).ttl(Duration::from_secs(60));
    let limit = Limit::per_hour(1_000);
    let node = node(
        &server.url(),
        &clock,
        "foreign",
        Kind::TokenBucket,
        limit,
        lease,
    )
    .await;
    let mut conn = server.client();
    let ledger_of = |key: &str| {
        format!(
            "{}:lease",
            node.stack().stack().redis_keys(&key.to_owned())[0]
        )
    };
    let _: () = redis::cmd("SET")
        .arg(ledger_of("string"))
        .arg("not a ledger")
        .query(&mut conn)
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(ledger_of("entry"))
        .arg("someone")
        .arg("50 units until noon")
        .query(&mut conn)
        .unwrap();
    for (key, named) in [
        ("string", "is not a lease ledger"),
        ("entry", "\"someone\""),
    ] {
        let d = node.check(key).await.unwrap();
        let (true, Some(BackendError::Script(message))) = (d.failed_closed(), d.backend_error())
        else {
            panic!("expected a script error on {key}, got {d:?}");
        };
        assert!(
            message.contains(&ledger_of(key)) && message.contains(named),
            "{message}"
        );
        assert!(
            message.contains("delete it or change the prefix"),
            "{message}"
        );
        assert_eq!(
            redis_remaining(&node, key).await,
            1_000,
            "nothing taken on {key}"
        );
    }
    let string: String = redis::cmd("GET")
        .arg(ledger_of("string"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(string, "not a ledger");
    let entry: String = redis::cmd("HGET")
        .arg(ledger_of("entry"))
        .arg("someone")
        .query(&mut conn)
        .unwrap();
    assert_eq!(entry, "50 units until noon", "the entry is left as found");
}

#[tokio::test]
async fn a_stack_leases_every_layer_and_a_global_layer_bounds_the_whole_fleet() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let url = server.url();
    let build = |backend: RedisBackend| user_and_all(&backend, "layers");
    let a = build(backend(&url, &clock).await);
    let b = build(backend(&url, &clock).await);
    let mut per_user = std::collections::HashMap::new();
    for round in 0..400 {
        let node = if round % 3 == 0 { &a } else { &b };
        let user = ["ada", "bob", "cy"][round % 3].to_owned();
        let d = node.check(&user).await.unwrap();
        *per_user.entry(user).or_insert(0u64) += u64::from(d.is_allowed());
    }
    let total: u64 = per_user.values().sum();
    // Every unit came from Redis: the global layer's 150, no more, and each user's 100.
    assert!(total <= 150, "{per_user:?}");
    assert!(per_user.values().all(|&n| n <= 100), "{per_user:?}");
    // Units left in leases are at most the slack of the global layer's ledger.
    assert!(total >= 150 - 10, "{per_user:?}");
}

/// One step of the fleet model: which node does what.
#[derive(Clone, Debug)]
enum Step {
    /// Node `node` asks for `cost` units.
    Check { node: usize, cost: u64 },
    /// Time moves on by this many milliseconds.
    Wait(u64),
    /// A node's idle sweep.
    Sweep(usize),
    /// A node refunds everything.
    Shutdown(usize),
    /// A node dies holding its leases; a new one takes its place.
    Die(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => (0..3usize, 1..4u64).prop_map(|(node, cost)| Step::Check { node, cost }),
        3 => (1..3_000u64).prop_map(Step::Wait),
        1 => (0..3usize).prop_map(Step::Sweep),
        1 => (0..3usize).prop_map(Step::Shutdown),
        1 => (0..3usize).prop_map(Step::Die),
    ]
}

/// The most a token bucket of `limit` admits in a span of `span` ns, plus the slack.
fn bound(limit: Limit, span: u64, slack: u64) -> u64 {
    let period = u128::from(limit.period_nanos());
    let refill = u128::from(span) * u128::from(limit.count()) / period;
    limit.burst() + u64::try_from(refill).unwrap() + slack
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Three nodes share one key; whatever they do, the units admitted in every span of time
    /// stay within the token bucket's bound plus the slack.
    #[test]
    fn the_fleet_stays_within_the_limit_plus_the_slack_over_every_span(
        steps in prop::collection::vec(step(), 1..120),
        slack in 0..12u64,
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let server = common::RedisServer::start();
        let limit = Limit::per_second(10).with_burst(20);
        let lease = Lease::new(Slack::units(slack)).ttl(Duration::from_secs(2));
        runtime.block_on(async {
            let clock = ManualClock::starting_at(START);
            let url = server.url();
            let mut nodes = Vec::new();
            for _ in 0..3 {
                nodes.push(node(&url, &clock, "model", Kind::TokenBucket, limit, lease).await);
            }
            let mut admitted: Vec<(u64, u64)> = Vec::new(); // (time, units)
            for step in &steps {
                match *step {
                    Step::Check { node, cost } => {
                        let d = nodes[node].check_n("k", cost).await.unwrap();
                        if d.is_allowed() {
                            admitted.push((clock.now(), cost));
                        }
                    }
                    Step::Wait(ms) => clock.advance(Duration::from_millis(ms)),
                    Step::Sweep(node) => {
                        nodes[node].refund_idle_leases().await;
                    }
                    Step::Shutdown(node) => {
                        nodes[node].refund_leases().await;
                    }
                    Step::Die(node) => {
                        nodes[node] = self::node(&url, &clock, "model", Kind::TokenBucket, limit, lease).await;
                    }
                }
            }
            for (i, &(from, _)) in admitted.iter().enumerate() {
                let mut units = 0;
                for &(at, cost) in &admitted[i..] {
                    units += cost;
                    let most = bound(limit, at - from, slack);
                    prop_assert!(
                        units <= most,
                        "{units} units admitted in {} ms, more than {most}",
                        (at - from) / 1_000_000
                    );
                }
            }
            Ok(())
        })?;
    }
}

/// A record spends this node's lease first (units Redis already took) and records the rest on
/// Redis: nothing is counted twice, nothing is lost, and a record the lease covers is answered
/// locally.
#[tokio::test]
async fn a_record_spends_the_lease_first_then_records_the_rest_on_redis() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let node = node(
        &server.url(),
        &clock,
        "record",
        Kind::TokenBucket,
        Limit::per_minute(1_000),
        Lease::new(Slack::units(100)),
    )
    .await;
    // Three checks: the first lease is one unit, the next is sized by its demand.
    for _ in 0..3 {
        assert!(node.check("k").await.unwrap().is_allowed());
    }
    let taken = 1_000 - redis_remaining(&node, "k").await;
    let held = taken - 3;
    assert!(held > 1, "a lease was taken: {taken} units left Redis");
    // Within the lease: local, and Redis sees nothing new.
    let local = node.record("k", 1).await.unwrap();
    assert_eq!(local.origin(), Some(Origin::Lease));
    assert_eq!(1_000 - redis_remaining(&node, "k").await, taken);
    // Past it: the lease's units go to the record, Redis records the rest.
    let big = node.record("k", 500).await.unwrap();
    assert_eq!(big.origin(), Some(Origin::Remote));
    let used = 1_000 - redis_remaining(&node, "k").await;
    assert_eq!(used, 3 + 1 + 500, "every unit checked or recorded, once");
    // A record past the limit leaves a debt the node's next check respects.
    let over = node.record("k", 600).await.unwrap();
    assert!(over.is_denied(), "{over:?}");
    assert!(node.check("k").await.unwrap().is_denied());
}

#[tokio::test]
async fn a_local_answer_is_compact_and_the_seam_gives_each_layers_answer_when_asked() {
    use limiter_stack::{AsyncLimiter, LayerAnswers, Origin, Outcome};
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let stack = user_and_all(&backend(&server.url(), &clock).await, "compact");
    let ada = "ada".to_owned();
    // The first call renews on Redis (each layer's answer kept); the next ones are local.
    let renewed = stack.check(&ada).await.unwrap();
    assert_eq!(renewed.layers().iter().count(), 2, "{renewed:?}");
    let local = stack.check(&ada).await.unwrap();
    assert_eq!(local.origin(), Some(Origin::Lease));
    assert!(
        local.layers().is_empty(),
        "a local answer keeps the compact form: {local:?}"
    );
    let binding = local.stack().binding().expect("a layer binds");
    assert_eq!(
        local.decision().unwrap().remaining(),
        binding.decision.remaining()
    );
    // Through the seam, asked for each layer: every answer, local or renewed, gives both
    // layers, combined as the answer says.
    let mut local_answers = 0;
    for _ in 0..10 {
        let mut each = LayerAnswers::new();
        let Ok(Outcome::Decided {
            decision, origin, ..
        }) = stack.decide_request_each(&ada, 1, &mut each).await
        else {
            panic!("decided");
        };
        local_answers += u32::from(origin == Origin::Lease);
        assert_eq!(each.iter().map(|l| l.layer).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(each.summary(), decision);
    }
    assert!(local_answers > 0);
}
