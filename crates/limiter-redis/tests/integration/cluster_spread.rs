//! A policy spread over a three-master Redis Cluster started by the test: per-identifier keys
//! land on every master (no master above 40% of 10,000 identifiers' keys) and decisions on
//! one master share script calls (coalesced per master, across its slots), a stack whose
//! layers land in different slots is all or nothing (a denial by a later slot gives back what
//! earlier slots took, and so does a later slot whose state Redis cannot read), racing calls
//! across slots leave exactly what they admitted, and a leased stack across slots is refused
//! when built.
//!
//! Time is injected and frozen, so nothing refills and every count is exact.

use limiter_testkit::redis_server as common;

use std::time::Duration;

use futures_util::future::join_all;
use limiter_core::{Limit, ManualClock};
use limiter_redis::{
    BackendError, BuildError, Kind, Lease, OnFailure, Origin, RedisBackend, RedisLayer, RedisStack,
    Slack,
};

const START: u64 = 1_795_000_000_000_000_000;

async fn backend(cluster: &common::RedisCluster) -> RedisBackend {
    RedisBackend::cluster_builder(cluster.urls())
        .time_from(ManualClock::starting_at(START))
        .timeout(Duration::from_secs(2))
        .deny_cache(0)
        .connect()
        .await
        .unwrap()
}

struct Req {
    user: String,
}

fn req(user: impl Into<String>) -> Req {
    Req { user: user.into() }
}

/// A user layer (3 an hour each) and a global one (`global` an hour), tagged by each layer's
/// key: the cluster default.
fn users_and_all(backend: &RedisBackend, name: &str, global: u64) -> RedisStack<Req> {
    RedisStack::builder(backend, name)
        .layer(
            RedisLayer::keyed("user", |r: &Req| Some(r.user.clone()))
                .limit(Kind::TokenBucket, Limit::per_hour(3)),
        )
        .layer(RedisLayer::global("all").limit(Kind::FixedWindow, Limit::per_hour(global)))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_of_10_000_identifiers_spreads_over_every_master() {
    let cluster = common::RedisCluster::start();
    let backend = backend(&cluster).await;
    // The default placement on a cluster: each identifier's keys in its own slot. Limits whose
    // keys outlive the test (a key expires when its limit is full again: a per-second
    // bucket's after 100 ms, sooner than a slow machine makes 10,000 decisions).
    let policy = RedisStack::builder(&backend, "api")
        .layer(
            RedisLayer::keyed("identifier", |r: &Req| Some(r.user.clone()))
                .limit(Kind::TokenBucket, Limit::per_hour(10))
                .limit(Kind::SlidingWindow, Limit::per_minute(100)),
        )
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let keys = policy.redis_keys(&req("ada"));
    assert_eq!(
        keys,
        [
            "limiter:api:{ada}:identifier:0",
            "limiter:api:{ada}:identifier:1"
        ]
    );
    // Warm: the function library loaded on every master.
    assert!(policy.check(&req("warm")).await.unwrap().is_allowed());
    for node in &cluster.nodes {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut node.client())
            .unwrap();
    }
    for chunk in (0..10_000).collect::<Vec<u32>>().chunks(500) {
        let requests: Vec<Req> = chunk.iter().map(|i| req(format!("id-{i}"))).collect();
        let decisions = join_all(requests.iter().map(|r| policy.check(r))).await;
        for d in decisions {
            let d = d.unwrap();
            assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
            assert!(d.is_allowed());
        }
    }
    // Every identifier's two keys, on the master serving its slot.
    let keys: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|node| redis::cmd("DBSIZE").query(&mut node.client()).unwrap())
        .collect();
    let total: u64 = keys.iter().sum();
    assert_eq!(
        total,
        2 * 10_001,
        "every identifier's keys, and warm's: {keys:?}"
    );
    for (master, &n) in keys.iter().enumerate() {
        assert!(
            n * 100 <= total * 40,
            "master {master} holds {n} of {total} keys: {keys:?}"
        );
        assert!(n > 0, "{keys:?}");
    }
    // 500 decisions at a time share calls on each master, across its slots.
    let calls = cluster.script_calls();
    assert!(
        calls.iter().all(|&n| n > 0) && calls.iter().sum::<u64>() <= 10_000 / 4,
        "decisions on one master share script calls: {calls:?} for 10,000"
    );
    assert!(backend.stats().coalesced >= 7_500, "{:?}", backend.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stack_across_slots_is_all_or_nothing() {
    let cluster = common::RedisCluster::start();
    let backend = backend(&cluster).await;
    let stack = users_and_all(&backend, "shop", 5);
    let keys = stack.redis_keys(&req("u0"));
    assert_eq!(keys, ["limiter:shop:{u0}:user:0", "limiter:{shop}:all:0"]);
    let slot = |key: &str| -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut cluster.nodes[0].client())
            .unwrap()
    };
    assert_ne!(
        slot(&keys[0]),
        slot(&keys[1]),
        "the layers' keys span slots"
    );

    let remaining = |d: &limiter_redis::RedisDecision, layer: usize| {
        d.layers()
            .iter()
            .find(|l| l.layer == layer)
            .map(|l| l.decision.remaining())
    };
    // u0 takes its 3, u1 takes 2: the global 5 is spent.
    for (user, n) in [("u0", 3), ("u1", 2)] {
        for _ in 0..n {
            let d = stack.check(&req(user)).await.unwrap();
            assert!(d.is_allowed(), "{d:?}");
            assert_eq!(d.origin(), Some(Origin::Remote));
        }
    }
    // u1's third: its own layer admits, the global denies; what u1's slot took comes back.
    let denied = stack.check(&req("u1")).await.unwrap();
    assert!(denied.is_denied(), "{denied:?}");
    assert_eq!(denied.origin(), Some(Origin::Remote));
    assert_eq!(denied.stack().binding().unwrap().layer, 1, "{denied:?}");
    assert_eq!(
        remaining(&denied, 0),
        Some(1),
        "reported after the give back"
    );
    let peek = stack.check_n(&req("u1"), 0).await.unwrap();
    assert_eq!(
        (remaining(&peek, 0), remaining(&peek, 1)),
        (Some(1), Some(0))
    );
    // A record is written on every slot whatever it finds; a grant across slots refunds both.
    let recorded = stack.record(&req("u2"), 1).await.unwrap();
    assert!(
        recorded.is_denied(),
        "the global layer is over: {recorded:?}"
    );
    let peek = stack.check_n(&req("u2"), 0).await.unwrap();
    assert_eq!(remaining(&peek, 0), Some(2), "u2's record was kept");
    let fresh = users_and_all(&backend, "shop-2", 10);
    let (taken, grant) = fresh.acquire(&req("u0"), 2).await.unwrap();
    assert!(taken.is_allowed());
    let mut grant = grant.expect("a grant across slots");
    let back = fresh.refund(&req("u0"), &mut grant, 2).await.unwrap();
    assert_eq!(
        (remaining(&back, 0), remaining(&back, 1)),
        (Some(3), Some(10))
    );
    // Leases take from every limit in one script: across slots they are refused.
    let error = users_and_all(&backend, "leased", 10)
        .leased(Lease::new(Slack::units(1)))
        .unwrap_err();
    assert!(
        matches!(error, BuildError::CrossSlot { layers: 2, .. }),
        "{error}"
    );
    assert!(error.to_string().contains("hash_tag_from"), "{error}");
}

/// Runs `command` on whichever master serves its key's slot (the others answer `MOVED`).
fn on_its_master(cluster: &common::RedisCluster, command: &redis::Cmd) {
    let done = cluster
        .nodes
        .iter()
        .any(|node| command.query::<()>(&mut node.client()).is_ok());
    assert!(done, "no master took {command:?}");
}

/// A later slot whose state Redis cannot read (a key an operator overwrote) fails that part:
/// what the earlier slot took goes back before the failure policy answers the whole call, and
/// a failing first slot leaves the later one unasked. Either way no unit stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_redis_cannot_decide_leaves_the_other_slots_as_they_were() {
    let cluster = common::RedisCluster::start();
    let backend = backend(&cluster).await;
    let left = |d: &limiter_redis::RedisDecision| -> Vec<u64> {
        d.layers().iter().map(|l| l.decision.remaining()).collect()
    };
    let stack = users_and_all(&backend, "spoilt", 10);
    assert!(stack.check(&req("ann")).await.unwrap().is_allowed());
    // The global layer's key (the call's second part, after Ann's) overwritten.
    let global_key = stack.redis_keys(&req("ann")).remove(1);
    on_its_master(
        &cluster,
        redis::cmd("SET").arg(&global_key).arg("not a state"),
    );
    for _ in 0..2 {
        let failed = stack.check(&req("ann")).await.unwrap();
        let (true, Some(BackendError::Script(message))) =
            (failed.failed_closed(), failed.backend_error())
        else {
            panic!("expected the global slot's script error, got {failed:?}");
        };
        assert!(message.contains(&global_key), "{message}");
    }
    // Ann's slot took a unit for each failed call and gave it back: 2 of her 3 left, as after
    // her one admitted call.
    on_its_master(&cluster, redis::cmd("DEL").arg(&global_key));
    let peek = stack.check_n(&req("ann"), 0).await.unwrap();
    assert_eq!(left(&peek), [2, 10], "{peek:?}");

    // The first part failing: the later one is never asked, so the global count is untouched.
    let other = users_and_all(&backend, "spoilt-first", 10);
    let bob_key = other.redis_keys(&req("bob")).remove(0);
    on_its_master(&cluster, redis::cmd("SET").arg(&bob_key).arg("not a state"));
    let failed = other.check(&req("bob")).await.unwrap();
    assert!(failed.failed_closed(), "{failed:?}");
    let carol = other.check_n(&req("carol"), 0).await.unwrap();
    assert_eq!(left(&carol), [3, 10], "{carol:?}");
}

/// Calls racing from many tasks on two threads, each across two slots: no limit admits past
/// itself, and once they are done every state holds exactly what the admitted calls took (a
/// denied call's give back leaves nothing behind).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_calls_across_slots_leave_exactly_what_they_admitted() {
    let cluster = common::RedisCluster::start();
    let backend = backend(&cluster).await;
    let global = 20;
    let stack = std::sync::Arc::new(users_and_all(&backend, "race", global));
    let users = 12;
    // 12 users, 4 calls each, all at once: 48 asked of a global 20.
    let calls: Vec<_> = (0..users)
        .flat_map(|u| (0..4).map(move |_| u))
        .map(|u| {
            let stack = std::sync::Arc::clone(&stack);
            tokio::spawn(async move {
                let d = stack.check(&req(format!("r{u}"))).await.unwrap();
                assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
                (u, d.is_allowed())
            })
        })
        .collect();
    let mut admitted = vec![0u64; users];
    for call in calls {
        let (u, allowed) = call.await.unwrap();
        admitted[u] += u64::from(allowed);
    }
    let total: u64 = admitted.iter().sum();
    assert!(total <= global, "{admitted:?}");
    for (u, &n) in admitted.iter().enumerate() {
        assert!(n <= 3, "user {u} admitted {n}");
        let peek = stack.check_n(&req(format!("r{u}")), 0).await.unwrap();
        let left: Vec<u64> = peek
            .layers()
            .iter()
            .map(|l| l.decision.remaining())
            .collect();
        assert_eq!(left, [3 - n, global - total], "user {u}: {admitted:?}");
    }
}
