//! Faults on a three-master Redis Cluster started by the test: a slot moving under a key
//! (`ASK` while it migrates, `MOVED` once it has) is followed and the key's count goes on
//! exactly; a master that dies hands its keys' calls to the failure policy, admitting nothing
//! it should not; a function library flushed from every master is loaded again.
//!
//! Time is injected and frozen, so nothing refills and every count is exact.

use limiter_testkit::redis_server as common;

use std::time::{Duration, Instant};

use limiter_core::{Limit, ManualClock};
use limiter_redis::{Kind, OnFailure, Origin, RedisBackend, RedisLimiter};

const START: u64 = 1_795_000_000_000_000_000;

async fn backend(cluster: &common::RedisCluster, timeout: Duration) -> RedisBackend {
    RedisBackend::cluster_builder(cluster.urls())
        .time_from(ManualClock::starting_at(START))
        .timeout(timeout)
        .deny_cache(0)
        .connect()
        .await
        .unwrap()
}

fn ten_an_hour(backend: &RedisBackend, name: &str) -> RedisLimiter {
    RedisLimiter::builder(backend, name)
        .limit(Kind::FixedWindow, Limit::per_hour(10))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
}

fn cluster_cmd(node: &common::RedisServer, args: &[&str]) -> redis::Value {
    let mut cmd = redis::cmd("CLUSTER");
    for arg in args {
        cmd.arg(*arg);
    }
    cmd.query(&mut node.client()).unwrap()
}

fn node_id(node: &common::RedisServer) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut node.client())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_moving_under_a_key_is_followed_and_the_count_goes_on() {
    let cluster = common::RedisCluster::start();
    let backend = backend(&cluster, Duration::from_secs(2)).await;
    let limiter = ten_an_hour(&backend, "moving");
    let key = limiter.redis_keys("k").remove(0);
    let from = cluster.master_of(&key);
    let to = (from + 1) % 3;
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(&key)
        .query(&mut cluster.nodes[0].client())
        .unwrap();
    let slot = slot.to_string();
    let remaining = |d: &limiter_redis::RedisDecision| {
        assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
        d.decision().unwrap().remaining()
    };
    for left in [9, 8, 7] {
        assert_eq!(remaining(&limiter.check("k").await.unwrap()), left);
    }
    // Migrating: the key still on its old master answers there.
    let (from_id, to_id) = (node_id(&cluster.nodes[from]), node_id(&cluster.nodes[to]));
    cluster_cmd(
        &cluster.nodes[to],
        &["SETSLOT", &slot, "IMPORTING", &from_id],
    );
    cluster_cmd(
        &cluster.nodes[from],
        &["SETSLOT", &slot, "MIGRATING", &to_id],
    );
    assert_eq!(remaining(&limiter.check("k").await.unwrap()), 6);
    // Moved to the new master mid-migration: the old one answers ASK, the call follows.
    let port = cluster.nodes[to].port.to_string();
    let _: redis::Value = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(&port)
        .arg("")
        .arg(0)
        .arg(5_000)
        .arg("KEYS")
        .arg(&key)
        .query(&mut cluster.nodes[from].client())
        .unwrap();
    assert_eq!(remaining(&limiter.check("k").await.unwrap()), 5);
    // The slot is the new master's: the old one answers MOVED, the client learns the map.
    for node in &cluster.nodes {
        cluster_cmd(node, &["SETSLOT", &slot, "NODE", &to_id]);
    }
    for left in [4, 3, 2, 1, 0] {
        assert_eq!(remaining(&limiter.check("k").await.unwrap()), left);
    }
    let over = limiter.check("k").await.unwrap();
    assert!(
        over.is_denied() && over.origin() == Some(Origin::Remote),
        "{over:?}"
    );
    let on_new: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query(&mut cluster.nodes[to].client())
        .unwrap();
    assert!(on_new, "the state lives on its new master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_hands_its_keys_to_the_failure_policy() {
    let mut cluster = common::RedisCluster::start();
    let timeout = Duration::from_millis(300);
    let backend = backend(&cluster, timeout).await;
    let limiter = ten_an_hour(&backend, "dead");
    // A key on the last master, decided once while it is up.
    let name = (0..)
        .map(|i| format!("k{i}"))
        .find(|k| cluster.master_of(&limiter.redis_keys(k).remove(0)) == 2)
        .unwrap();
    assert_eq!(
        limiter.check(&name).await.unwrap().origin(),
        Some(Origin::Remote)
    );
    cluster.nodes[2].kill();
    for _ in 0..3 {
        let started = Instant::now();
        let d = limiter.check(&name).await.unwrap();
        assert!(d.is_denied(), "failing closed admits nothing: {d:?}");
        assert!(d.failed_closed(), "the failure policy answered: {d:?}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "answered within a bounded wait ({:?})",
            started.elapsed()
        );
    }
    assert!(backend.stats().outages >= 1, "{:?}", backend.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_function_library_flushed_from_every_master_is_loaded_again() {
    let cluster = common::RedisCluster::start();
    let backend = backend(&cluster, Duration::from_secs(2)).await;
    let limiter = ten_an_hour(&backend, "flushed");
    // One key per master.
    let keys: Vec<String> = (0..3)
        .map(|master| {
            (0..)
                .map(|i| format!("k{i}"))
                .find(|k| cluster.master_of(&limiter.redis_keys(k).remove(0)) == master)
                .unwrap()
        })
        .collect();
    for key in &keys {
        let d = limiter.check(key).await.unwrap();
        assert_eq!(
            (d.origin(), d.decision().unwrap().remaining()),
            (Some(Origin::Remote), 9)
        );
    }
    let loads = backend.stats().script_loads;
    for node in &cluster.nodes {
        for flush in ["FUNCTION", "SCRIPT"] {
            let _: () = redis::cmd(flush)
                .arg("FLUSH")
                .query(&mut node.client())
                .unwrap();
        }
    }
    for key in &keys {
        let d = limiter.check(key).await.unwrap();
        assert_eq!(
            (d.origin(), d.decision().unwrap().remaining()),
            (Some(Origin::Remote), 8),
            "state kept, one more taken"
        );
    }
    // Loaded on every master at once: by the first call that found it missing.
    assert_eq!(
        backend.stats().script_loads,
        loads + 1,
        "{:?}",
        backend.stats()
    );
}
