//! unkey's v2 API on two limiterd processes on one Redis, as unkey's SDKs would call a fleet
//! behind a load balancer: one budget counted across both, and overrides changed through one
//! seen through the other at once (reads and the namespace's bound) and applied to its
//! decisions within a poll.

use crate::support;

use crate::support::unkey::{KEY, limit, name, root};
use crate::support::{Client, Daemon};
use limiter_testkit::redis_server::RedisServer;
use serde_json::{Value, json};

/// Two limiterd processes on one Redis, started with `args` beside `--redis`, and a client of
/// each (dropped in that order: clients, processes, Redis).
struct Fleet {
    clients: [Client; 2],
    _daemons: [Daemon; 2],
    redis: RedisServer,
}

impl Fleet {
    async fn start(args: &[&str]) -> Self {
        let redis = RedisServer::start();
        let url = redis.url();
        let start = || {
            let mut all = vec!["--log-level", "warn", "--redis", url.as_str()];
            all.extend_from_slice(args);
            Daemon::start_with_env(&all, &[("LIMITERD_ROOT_KEY", KEY)])
        };
        let daemons = [start(), start()];
        let clients = [
            Client::connect(daemons[0].addr).await,
            Client::connect(daemons[1].addr).await,
        ];
        Self {
            clients,
            _daemons: daemons,
            redis,
        }
    }
}

#[tokio::test]
async fn two_instances_on_one_redis_count_one_budget_and_share_overrides() {
    let mut fleet = Fleet::start(&[]).await;
    let clients = &mut fleet.clients;
    // Five calls of a budget of 3, alternating between the instances: exactly 3 pass.
    let mut passed = 0;
    for i in 0..5 {
        let (status, value) = root(
            &mut clients[i % 2],
            "limit",
            &limit("fleet", "ada", 3, 60_000, None),
        )
        .await;
        assert_eq!(status, 200, "{value}");
        passed += usize::from(value["data"]["success"] == true);
    }
    assert_eq!(passed, 3);
    // An override set on one instance applies on the other (it polls every 250 ms).
    let set = json!({"namespace": "fleet", "identifier": "vip_*", "limit": 1, "duration": 60_000});
    let (status, value) = root(&mut clients[0], "setOverride", &set).await;
    assert_eq!(status, 200, "{value}");
    let id = value["data"]["overrideId"].clone();
    // Kept under limiterd's prefix, inside the documented ACL rule's `~limiterd:*`.
    let kept = limiter_testkit::redis_server::raw_command(
        fleet.redis.port,
        "EXISTS limiterd:{records:overrides}:hash",
    );
    assert_eq!(kept.as_deref(), Some(":1\r\n"), "{kept:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (_, value) = root(
            &mut clients[1],
            "limit",
            &limit("fleet", "vip_1", 100, 60_000, Some(0)),
        )
        .await;
        if value["data"]["overrideId"] == id {
            assert_eq!(value["data"]["limit"], 1, "{value}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the other instance never applied the override"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let (_, value) = root(&mut clients[1], "getOverride", &name("fleet", "vip_*")).await;
    assert_eq!(value["data"]["overrideId"], id, "{value}");
    // Deleted on the second, gone on the first too.
    let (status, _) = root(&mut clients[1], "deleteOverride", &name("fleet", "vip_*")).await;
    assert_eq!(status, 200);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (status, _) = root(&mut clients[0], "getOverride", &name("fleet", "vip_*")).await;
        if status == 404 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first instance never saw the deletion"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
}

/// Reads of the overrides answer what the fleet holds: an override set on one instance is found
/// by the other's `getOverride` and `listOverrides` at once (not after its next poll), and one
/// deleted there is gone from the first at once.
#[tokio::test]
async fn override_reads_on_one_instance_see_the_others_changes_at_once() {
    let mut fleet = Fleet::start(&[]).await;
    let clients = &mut fleet.clients;
    let listed = |value: &Value| -> Vec<String> {
        let data = value["data"].as_array().cloned().unwrap_or_default();
        data.iter()
            .filter_map(|o| o["identifier"].as_str().map(str::to_owned))
            .collect()
    };
    for round in 0..10_u64 {
        let (setter, reader) = if round % 2 == 0 { (0, 1) } else { (1, 0) };
        let identifier = format!("team_{round}");
        let set = json!({"namespace": "now", "identifier": identifier, "limit": round + 1, "duration": 60_000});
        let (status, value) = root(&mut clients[setter], "setOverride", &set).await;
        assert_eq!(status, 200, "{value}");
        let (status, value) = root(
            &mut clients[reader],
            "getOverride",
            &name("now", &identifier),
        )
        .await;
        assert_eq!(
            status, 200,
            "round {round}: set on one, not found on the other: {value}"
        );
        assert_eq!(value["data"]["limit"], round + 1, "{value}");
        let (status, value) = root(
            &mut clients[reader],
            "listOverrides",
            &json!({"namespace": "now"}),
        )
        .await;
        assert_eq!(status, 200, "{value}");
        assert_eq!(
            listed(&value),
            std::slice::from_ref(&identifier),
            "round {round}: {value}"
        );
        let (status, _) = root(
            &mut clients[reader],
            "deleteOverride",
            &name("now", &identifier),
        )
        .await;
        assert_eq!(status, 200);
        let (status, value) = root(
            &mut clients[setter],
            "getOverride",
            &name("now", &identifier),
        )
        .await;
        assert_eq!(
            status, 404,
            "round {round}: deleted on one, found on the other: {value}"
        );
        let (_, value) = root(
            &mut clients[setter],
            "listOverrides",
            &json!({"namespace": "now"}),
        )
        .await;
        assert_eq!(
            listed(&value),
            Vec::<String>::new(),
            "round {round}: {value}"
        );
    }
}

/// On Redis, `setOverride` counts a namespace's bound on the fleet's overrides as they are
/// when it is asked: an instance that has not polled since another instance filled the
/// namespace still refuses one more, and sees the room a deletion there made.
#[tokio::test]
async fn the_bound_on_a_namespace_counts_the_other_instances_overrides_at_once() {
    let config = support::temp_file(
        "max-overrides-fleet.toml",
        "[policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 10, period = \"1m\" }]\n[overrides]\nmax_per_namespace = 1\n",
    );
    let mut fleet = Fleet::start(&["--config", config.to_str().unwrap()]).await;
    let clients = &mut fleet.clients;
    let set = |identifier: &str| json!({"namespace": "api", "identifier": identifier, "limit": 1, "duration": 60_000});
    for round in 0..5 {
        let (status, value) = root(&mut clients[0], "setOverride", &set("a")).await;
        assert_eq!(status, 200, "{value}");
        let (status, value) = root(&mut clients[1], "setOverride", &set("b")).await;
        assert_eq!(
            status, 400,
            "round {round}: one more than the bound, through the other: {value}"
        );
        let (status, _) = root(&mut clients[0], "deleteOverride", &name("api", "a")).await;
        assert_eq!(status, 200);
        let (status, value) = root(&mut clients[1], "setOverride", &set("b")).await;
        assert_eq!(
            status, 200,
            "round {round}: the room a deletion made: {value}"
        );
        let (status, _) = root(&mut clients[1], "deleteOverride", &name("api", "b")).await;
        assert_eq!(status, 200);
    }
}
