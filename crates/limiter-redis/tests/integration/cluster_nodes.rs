//! A cluster's health per master, on clusters started by the test: a dead master costs only
//! its own slots (calls on the other masters' keys stay on Redis, with no failure-policy
//! answer, and a key spent on a healthy master stays spent; calls on its keys fail at once, its
//! port refusing connections); the health probe says how many masters answer and which slots
//! fail, and that the store is down when the cluster refuses every command
//! (`cluster-require-full-coverage yes`); a promoted replica takes its master's slots back,
//! with what the master took.

use limiter_testkit::redis_server::{ClusterOptions, RedisCluster, raw_command, wait_until};

use std::time::{Duration, Instant};

use limiter_core::Limit;
use limiter_redis::{Kind, OnFailure, Origin, RedisBackend, RedisLimiter};

async fn backend(cluster: &RedisCluster, timeout: Duration) -> RedisBackend {
    RedisBackend::cluster_builder(cluster.urls())
        .timeout(timeout)
        .connect()
        .await
        .unwrap()
}

// A bucket of a day, not a window of an hour: on Redis's own clock, a test run across a
// window's boundary would get the count again; no unit comes back within a test's minutes.
fn limiter(backend: &RedisBackend, name: &str, count: u64, on_failure: OnFailure) -> RedisLimiter {
    RedisLimiter::builder(backend, name)
        .limit(Kind::TokenBucket, Limit::per_day(count))
        .on_failure(on_failure)
        .build()
        .unwrap()
}

/// `n` identifiers whose keys the master `master` started with.
fn on_master(
    cluster: &RedisCluster,
    limiter: &RedisLimiter,
    master: usize,
    n: usize,
) -> Vec<String> {
    (0..)
        .map(|i| format!("id-{i}"))
        .filter(|id| cluster.master_of(&limiter.redis_keys(id)[0]) == master)
        .take(n)
        .collect()
}

/// Waits until a node other than `dead` flags the node on `port` as failed.
fn wait_until_failed(cluster: &RedisCluster, dead: usize) {
    let port = cluster.nodes[dead].port;
    let alive = cluster.nodes[(dead + 1) % 3].port;
    wait_until("the cluster to flag the dead master", || {
        raw_command(alive, "CLUSTER NODES").is_some_and(|nodes| {
            nodes
                .lines()
                .any(|l| l.contains(&format!(":{port}@")) && l.contains(" master,fail"))
        })
    });
}

/// Every call on `ids` is decided on Redis (a denial may come from the deny cache).
async fn all_on_redis(limiter: &RedisLimiter, ids: &[String]) {
    for id in ids {
        let d = limiter.check(id).await.unwrap();
        assert!(
            matches!(d.origin(), Some(Origin::Remote | Origin::DenyCache)),
            "a healthy master's key went to the failure policy: {d:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_costs_only_its_own_slots() {
    let mut cluster = RedisCluster::start_with(&ClusterOptions {
        full_coverage: false,
        ..ClusterOptions::default()
    });
    // A long timeout: a call that waited for it would show.
    let backend = backend(&cluster, Duration::from_secs(20)).await;
    let open = limiter(&backend, "open", 1_000, OnFailure::Fallback);
    let closed = limiter(&backend, "closed", 1_000, OnFailure::Closed);
    let global = limiter(&backend, "global", 20, OnFailure::Fallback);
    let healthy: Vec<String> = [0, 1]
        .iter()
        .flat_map(|&m| on_master(&cluster, &open, m, 30))
        .collect();
    let doomed = on_master(&cluster, &open, 2, 5);
    let spent = on_master(&cluster, &global, 0, 1).remove(0);
    for _ in 0..20 {
        assert!(global.check(&spent).await.unwrap().is_allowed());
    }
    all_on_redis(&open, &doomed).await;

    cluster.nodes[2].kill();
    for round in 0..2 {
        all_on_redis(&open, &healthy).await;
        all_on_redis(&closed, &healthy[..20]).await;
        // A key spent on a healthy master stays spent: never admitted by the fallback.
        for _ in 0..32 {
            let d = global.check(&spent).await.unwrap();
            assert!(d.is_denied(), "{d:?}");
        }
        // The dead master's keys go to the failure policy at once: its port refuses.
        for id in &doomed {
            let started = Instant::now();
            let d = closed.check(id).await.unwrap();
            assert!(d.failed_closed(), "{d:?}");
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "{:?}",
                started.elapsed()
            );
        }
        let health = backend.health().await;
        assert!(health.is_ready(), "{health:?}");
        assert_eq!(health.masters_answering(), 2, "{health:?}");
        assert_eq!(health.slots_failing, [10923..=16383], "{health:?}");
        let problem = health.problem().unwrap();
        assert!(
            problem.contains("slots 10923-16383 follow the failure policy"),
            "{problem}"
        );
        if round == 0 {
            // Again once the cluster has flagged the master as failed.
            wait_until_failed(&cluster, 2);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_refusing_every_command_is_down() {
    let mut cluster = RedisCluster::start_with(&ClusterOptions {
        full_coverage: true,
        node_timeout_ms: 1_000,
        ..ClusterOptions::default()
    });
    let backend = backend(&cluster, Duration::from_secs(2)).await;
    assert!(backend.health().await.is_ready());
    cluster.nodes[2].kill();
    cluster.wait_for_state(2, "fail");
    let health = backend.health().await;
    assert!(!health.is_ready(), "{health:?}");
    assert_eq!(health.masters_answering(), 2, "{health:?}");
    assert_eq!(health.slots_failing, [0..=16383], "{health:?}");
    let down = health.down.unwrap().to_string();
    assert!(down.contains("cluster_state:fail"), "{down}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_takes_its_slots_back_with_what_its_master_took() {
    let mut cluster = RedisCluster::start_with(&ClusterOptions {
        replicas: 1,
        node_timeout_ms: 1_000,
        ..ClusterOptions::default()
    });
    let backend = backend(&cluster, Duration::from_millis(500)).await;
    let limiter = limiter(&backend, "failover", 10, OnFailure::Fallback);
    let healthy: Vec<String> = [1, 2]
        .iter()
        .flat_map(|&m| on_master(&cluster, &limiter, m, 10))
        .collect();
    let spent = on_master(&cluster, &limiter, 0, 1).remove(0);
    for _ in 0..10 {
        let d = limiter.check(&spent).await.unwrap();
        assert!(
            d.is_allowed() && d.origin() == Some(Origin::Remote),
            "{d:?}"
        );
    }
    // What the master took is on its replica (asynchronous replication can lose the last
    // writes at a failover: `tests/integration/sentinel.rs` and limiterd's measure that).
    cluster.wait_for_replication(0);
    let killed = Instant::now();
    cluster.nodes[0].kill();
    let replica = cluster.replicas[0][0].port;
    let mut promoted = None;
    loop {
        all_on_redis(&limiter, &healthy[..4]).await;
        if promoted.is_none()
            && raw_command(replica, "ROLE").is_some_and(|role| role.contains("master"))
        {
            promoted = Some(Instant::now());
        }
        let d = limiter.check(&spent).await.unwrap();
        if d.origin() == Some(Origin::Remote) {
            // Back on Redis, on the promoted replica: still spent.
            assert!(d.is_denied(), "{d:?}");
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "never back: {d:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let back = killed.elapsed();
    eprintln!(
        "replica promoted {:?} after the kill; its slots back on Redis {back:?} after it",
        promoted.map(|p| p - killed)
    );
    let health = backend.health().await;
    assert!(
        health.is_ready() && health.slots_failing.is_empty(),
        "{health:?}"
    );
    assert!(
        health
            .masters
            .iter()
            .any(|m| m.addr == format!("127.0.0.1:{replica}"))
    );
}
