//! Two limiterd processes sharing one budget through a failover, counted: on Redis Sentinel
//! (`[store.sentinel]`, a master and two replicas) and on a Redis Cluster with a replica per
//! master. Each instance decides on one identifier in turn while its master is killed; the
//! units admitted in all pass the limit by at most what the failover lost (writes acknowledged
//! but not yet replicated: measured and reported, and never more than what was admitted before
//! the kill), and with `wait_replicas = 1` never pass it.

use limiter_testkit::redis_server::{ClusterOptions, MASTER_NAME, RedisCluster, SentinelSet};

use std::time::{Duration, Instant};

use crate::support::{Client, Daemon, temp_file};
use serde_json::json;

const LIMIT: u64 = 100;

/// `LIMIT` a day as a token bucket: no window boundary a run could cross (a fixed window of an
/// hour reset under a run that crossed the hour: 150 admitted of 100), and not one unit back
/// in the minute a run may take.
fn policy() -> String {
    format!(
        "[policies.api]\nlimits = [{{ algorithm = \"token_bucket\", count = {LIMIT}, period = \"1d\" }}]\n"
    )
}

/// Two daemons on `store` take turns on one identifier; `kill` runs once half the limit is
/// spent. The units admitted once both see a denial from Redis after the kill, and the first
/// daemon (still serving) with its client.
async fn two_instances_through(
    store: &str,
    name: &str,
    kill: impl FnOnce(),
) -> (u64, Daemon, Client) {
    let file = temp_file(
        name,
        &format!(
            "[store]\nkind = \"redis\"\non_failure = \"closed\"\n{store}{}",
            policy()
        ),
    );
    let path = file.to_str().unwrap();
    let daemons = [
        Daemon::start(&["--config", path]),
        Daemon::start(&["--config", path]),
    ];
    let mut clients = [
        Client::connect(daemons[0].addr).await,
        Client::connect(daemons[1].addr).await,
    ];
    let mut admitted = 0;
    let mut kill = Some(kill);
    let mut denied_after = [false, false];
    let started = Instant::now();
    for turn in 0.. {
        let i = turn % 2;
        // Failing closed, an outage is a 503 (nothing admitted).
        let (status, d) = clients[i]
            .post(
                "/v1/ratelimit",
                &json!({"policy": "api", "identifier": "shared"}),
            )
            .await;
        assert!(
            status == 200 || (status == 503 && kill.is_none()),
            "{status} {d}"
        );
        if d["success"] == true {
            admitted += 1;
        }
        if admitted == LIMIT / 2
            && let Some(kill) = kill.take()
        {
            kill();
        }
        if kill.is_none() && d["success"] == false && d["source"] == "redis" {
            denied_after[i] = true;
        }
        if denied_after == [true, true] {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(60), "{d}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let [first, _] = daemons;
    let [client, _] = clients;
    (admitted, first, client)
}

/// Waits for `client`'s `/metrics` to name the master at `port` as up, and no master at
/// `gone`: the store's gauges follow the failover.
async fn metrics_follow_the_new_master(client: &mut Client, port: u16, gone: u16) {
    let up = format!("limiterd_store_master_up{{master=\"127.0.0.1:{port}\",slots=\"\"}} 1");
    let old = format!("\"127.0.0.1:{gone}\"");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, metrics) = client.send("GET", "/metrics", "").await;
        if metrics.lines().any(|l| l == up) && !metrics.contains(&old) {
            assert!(
                metrics.lines().any(|l| l == "limiterd_store_masters 1"),
                "{metrics}"
            );
            assert!(
                metrics.lines().any(|l| l == "limiterd_ready 1"),
                "{metrics}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{up}, without {old}, in\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_sentinel_keep_the_limit_through_a_failover() {
    for wait in [false, true] {
        let mut set = SentinelSet::start(2, Vec::new());
        let sentinels: Vec<String> = set
            .sentinel_urls()
            .iter()
            .map(|u| format!("{u:?}"))
            .collect();
        let store = format!(
            "timeout_ms = 200\n{}[store.sentinel]\nmaster = \"{MASTER_NAME}\"\nsentinels = [{}]\n",
            if wait { "wait_replicas = 1\n" } else { "" },
            sentinels.join(", ")
        );
        let (admitted, _daemon, mut client) = two_instances_through(
            &store,
            &format!("sentinel-{wait}-{}.toml", set.master.port),
            || {
                set.fail_over();
            },
        )
        .await;
        let promoted = set.master_port().expect("the sentinels name a master");
        metrics_follow_the_new_master(&mut client, promoted, set.master.port).await;
        eprintln!("Sentinel, wait_replicas {wait}: {admitted} admitted of {LIMIT}");
        if wait {
            assert_eq!(admitted, LIMIT);
        } else {
            assert!(
                (LIMIT..=LIMIT + LIMIT / 2).contains(&admitted),
                "{admitted}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_a_cluster_with_replicas_keep_the_limit_through_a_failover() {
    let mut cluster = RedisCluster::start_with(&ClusterOptions {
        replicas: 1,
        node_timeout_ms: 1_000,
        ..ClusterOptions::default()
    });
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let store = format!("timeout_ms = 200\ncluster = [{}]\n", seeds.join(", "));
    let master = cluster.master_of("{shared}");
    let name = format!("cluster-failover-{}.toml", cluster.nodes[0].port);
    let (admitted, _, _) =
        two_instances_through(&store, &name, || cluster.nodes[master].kill()).await;
    eprintln!("cluster with replicas: {admitted} admitted of {LIMIT}");
    assert!(
        (LIMIT..=LIMIT + LIMIT / 2).contains(&admitted),
        "{admitted}"
    );
}
