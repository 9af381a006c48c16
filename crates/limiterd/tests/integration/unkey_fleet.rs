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

/// An override record on Redis that this version cannot read (a newer limiterd's, or one
/// written by hand) is skipped with a warning naming its field, and the records beside it
/// still apply.
#[tokio::test]
async fn a_record_this_version_cannot_read_is_skipped_with_a_warning_naming_it() {
    let (redis, daemon) = recorded_on_redis("warn");
    let mut client = Client::connect(daemon.addr).await;
    let set = json!({"namespace": "mixed", "identifier": "vip", "limit": 1, "duration": 60_000});
    let (status, value) = root(&mut client, "setOverride", &set).await;
    assert_eq!(status, 200, "{value}");
    for command in [
        "HSET limiterd:{records:overrides}:hash from-the-future not-json",
        "INCR limiterd:{records:overrides}:version",
    ] {
        let reply = limiter_testkit::redis_server::raw_command(redis.port, command);
        assert!(
            reply.as_deref().is_some_and(|r| r.starts_with(':')),
            "{reply:?}"
        );
    }
    let output = daemon.wait_for_output("from-the-future");
    assert!(output.contains("not one this version reads"), "{output}");
    let (status, value) = root(&mut client, "getOverride", &name("mixed", "vip")).await;
    assert_eq!(status, 200, "the readable record still reads: {value}");
    let (_, value) = root(
        &mut client,
        "limit",
        &limit("mixed", "vip", 100, 60_000, None),
    )
    .await;
    assert_eq!(value["data"]["limit"], 1, "and still applies: {value}");
}

/// The overrides' version key on Redis holding what no change wrote stops every instance
/// seeing the others' changes: the poll warns naming the key (once while it lasts),
/// `/debug/status` names it while it lasts, and the log says when the overrides read again.
#[tokio::test]
async fn a_version_key_no_change_wrote_is_named_in_a_warning_until_it_is_fixed() {
    let (redis, daemon) = recorded_on_redis("info");
    let version = "limiterd:{records:overrides}:version";
    let raw = |command: &str| limiter_testkit::redis_server::raw_command(redis.port, command);
    assert_eq!(
        raw(&format!("SET {version} spoilt")).as_deref(),
        Some("+OK\r\n")
    );
    // The poll's warning (the first read may have warned too, if the process was starting).
    let output = daemon.wait_for_output("the overrides cannot be read from Redis");
    let warning = output
        .lines()
        .find(|line| line.contains("the overrides cannot be read from Redis"))
        .unwrap_or_default();
    assert!(warning.contains(version), "{output}");
    assert!(output.contains("delete it"), "{output}");
    let mut client = Client::connect(daemon.addr).await;
    let set = json!({"namespace": "spoilt", "identifier": "vip", "limit": 1, "duration": 60_000});
    let (status, value) = root(&mut client, "setOverride", &set).await;
    assert!(
        status >= 500,
        "a change that cannot be kept is refused: {value}"
    );
    assert!(value.to_string().contains(version), "{value}");
    let read_error = |status: &str| {
        let status: Value = serde_json::from_str(status).expect("JSON");
        status["overrides"]["read_error"].clone()
    };
    let (code, status) = client.send("GET", "/debug/status", "").await;
    assert_eq!(code, 200, "{status}");
    let shown = read_error(&status);
    assert!(
        shown.as_str().is_some_and(|e| e.contains(version)),
        "{status}"
    );
    assert_eq!(raw(&format!("DEL {version}")).as_deref(), Some(":1\r\n"));
    let output = daemon.wait_for_output("read from Redis again");
    let (_, status) = client.send("GET", "/debug/status", "").await;
    assert_eq!(read_error(&status), Value::Null, "{status}");
    let warnings = output
        .matches("the overrides cannot be read from Redis")
        .count();
    assert_eq!(warnings, 1, "one warning while it lasted:\n{output}");
    let (status, value) = root(&mut client, "setOverride", &set).await;
    assert_eq!(status, 200, "{value}");
}

/// One limiterd on a fresh Redis, logging at `level` and recorded, with the root key.
fn recorded_on_redis(level: &str) -> (RedisServer, Daemon) {
    let redis = RedisServer::start();
    let url = redis.url();
    let daemon = Daemon::start_recorded(
        &["--log-level", level, "--redis", url.as_str()],
        &[("LIMITERD_ROOT_KEY", KEY)],
    );
    (redis, daemon)
}

/// Redis going away is warned once by each part that meets it, though the poll's errors
/// change at every poll while it lasts (the breaker's names its next probe) and the breaker
/// probes every second: a warning every 250 ms would bury the log.
#[tokio::test]
async fn an_outage_is_warned_once_however_its_errors_change() {
    let (mut redis, daemon) = recorded_on_redis("debug");
    daemon.wait_for_output("the store answered");
    redis.kill();
    // Eight polls (two seconds): the breaker has probed at least once by then.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let output = loop {
        let output = daemon.output();
        let polls = output.matches("the overrides still cannot be read").count();
        if polls >= 8 && output.contains("circuit breaker stays open") {
            break output;
        }
        assert!(std::time::Instant::now() < deadline, "{output}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let warned = |what: &str| {
        output
            .lines()
            .filter(|line| line.contains("WARN") && line.contains(what))
            .count()
    };
    assert_eq!(warned("the overrides"), 1, "{output}");
    assert_eq!(warned("circuit breaker"), 1, "{output}");
}
