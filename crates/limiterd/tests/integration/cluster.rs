//! limiterd on a three-master Redis Cluster started by the test (`[store] cluster = [...]`):
//! `check-config` and `/readyz` name the cluster, one policy's identifiers spread over every
//! master, and a policy with a global limit stays all or nothing across slots.

use limiter_testkit::redis_server::RedisCluster;

use crate::support::{Client, Daemon, temp_file};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_spreads_over_a_cluster_and_stays_all_or_nothing() {
    let cluster = RedisCluster::start();
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let config = temp_file(
        &format!("cluster-{}.toml", cluster.nodes[0].port),
        &format!(
            "[store]\nkind = \"redis\"\ncluster = [{}]\non_failure = \"closed\"\n\
             [policies.api]\nlimits = [{{ algorithm = \"token_bucket\", count = 1000, period = \"1h\" }}]\n\
             [policies.pair]\nlimits = [{{ algorithm = \"token_bucket\", count = 3, period = \"1h\" }}]\n\
             [policies.shared]\nlimits = [\n  {{ algorithm = \"token_bucket\", count = 3, period = \"1h\" }},\n  \
             {{ algorithm = \"token_bucket\", count = 5, period = \"1d\", key = \"global\" }},\n]\n",
            seeds.join(", ")
        ),
    );
    let path = config.to_str().expect("UTF-8 path");
    let checked = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .args(["check-config", path])
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "{stdout}");
    assert!(
        stdout.contains("store: redis (cluster via redis://127.0.0.1:"),
        "{stdout}"
    );

    let daemon = Daemon::start(&["--config", path]);
    let mut client = Client::connect(daemon.addr).await;
    let (status, ready) = client.send("GET", "/readyz", "").await;
    assert_eq!(status, 200, "{ready}");
    let (_, config) = client.send("GET", "/debug/config", "").await;
    assert!(config.contains("\"cluster\""), "{config}");

    // Warm (the function library on every master), then count each master's script calls.
    assert_eq!(
        client
            .decide(json!({"policy": "api", "identifier": "warm"}))
            .await["success"],
        true
    );
    for node in &cluster.nodes {
        let _: () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query(&mut node.client())
            .expect("CONFIG RESETSTAT");
    }
    for i in 0..10_000 {
        let d = client
            .decide(json!({"policy": "api", "identifier": format!("user-{i}")}))
            .await;
        assert_eq!(
            (d["success"].clone(), d["source"].clone()),
            (json!(true), json!("redis")),
            "{d}"
        );
    }
    let calls = cluster.script_calls();
    let total: u64 = calls.iter().sum();
    assert_eq!(total, 10_000, "{calls:?}");
    for (master, &n) in calls.iter().enumerate() {
        assert!(
            n * 100 <= total * 40,
            "master {master}: {n} of {total} ({calls:?})"
        );
    }

    // A batch across identifiers (so across slots): all or nothing, item by item.
    let pair = |a: u64, b: u64| {
        json!({"requests": [
            {"policy": "pair", "identifier": "x1", "cost": a},
            {"policy": "pair", "identifier": "x2", "cost": b},
        ]})
    };
    let (status, both) = client.post("/v1/ratelimit/many", &pair(2, 2)).await;
    assert_eq!(status, 200, "{both}");
    assert_eq!(both["success"], true, "{both}");
    let (_, refused) = client.post("/v1/ratelimit/many", &pair(1, 2)).await;
    assert_eq!(refused["success"], false, "x2 has 1 left: {refused}");
    let x1 = client
        .decide(json!({"policy": "pair", "identifier": "x1", "cost": 0}))
        .await;
    assert_eq!(x1["remaining"], 1, "x1's unit came back: {x1}");

    // Six identifiers against a global 5: the sixth is denied by the global limit, and what
    // its own slot took comes back. (A global bucket of a day, not a window of an hour: Redis's
    // clock is real, and a run across a window's boundary would get the 5 again.)
    for i in 0..5 {
        let d = client
            .decide(json!({"policy": "shared", "identifier": format!("s{i}")}))
            .await;
        assert_eq!(d["success"], true, "{d}");
    }
    // Keys follow the identifier: s0's bucket is in s0's slot.
    let s0 = "limiterd:shared:{s0}:identifier:0";
    let exists: bool = redis::cmd("EXISTS")
        .arg(s0)
        .query(&mut cluster.nodes[cluster.master_of(s0)].client())
        .expect("EXISTS");
    assert!(exists, "{s0}");
    let denied = client
        .decide(json!({"policy": "shared", "identifier": "s5"}))
        .await;
    assert_eq!(denied["success"], false, "{denied}");
    let peek = client
        .decide(json!({"policy": "shared", "identifier": "s5", "cost": 0}))
        .await;
    assert_eq!(peek["remaining"], 0, "the global limit binds: {peek}");
    // s5's own bucket is whole: its state (if the key has not expired yet) owes nothing. A
    // state is three big-endian doubles then its limit; a bucket's second is its debt.
    let key = "limiterd:shared:{s5}:identifier:0";
    let raw: Option<Vec<u8>> = redis::cmd("GET")
        .arg(key)
        .query(&mut cluster.nodes[cluster.master_of(key)].client())
        .expect("GET");
    if let Some(raw) = raw {
        let debt = f64::from_be_bytes(raw[8..16].try_into().expect("a state"));
        assert_eq!(debt, 0.0, "s5's bucket got its unit back");
    }
}
