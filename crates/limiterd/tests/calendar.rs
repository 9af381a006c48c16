//! Calendar quotas through a real limiterd over HTTP on Redis, two processes sharing one
//! server: the quota is counted once for the fleet, beside the policy's rate limit and all or
//! nothing with it, and `reset_at_ms` names the next local midnight in the policy's zone; while
//! Redis fails, a falling-back policy counts this node's share of the quota in the process.

use limiter_testkit::redis_server::RedisServer;
#[allow(dead_code)]
mod support;

use serde_json::{Value, json};
use support::{Client, Daemon, temp_file};

const POLICIES: &str = "[policies.daily]\n\
    limits = [\n\
      { algorithm = \"fixed_window\", count = 3, period = \"1d\", calendar = \"Asia/Tokyo\" },\n\
      { algorithm = \"token_bucket\", count = 2, period = \"1h\" },\n\
    ]\n";

fn ask(cost: u64) -> Value {
    json!({"policy": "daily", "identifier": "acme", "cost": cost})
}

/// The next midnight in Tokyo (UTC+9, no daylight saving) after now, in Unix ms.
fn next_tokyo_midnight_ms() -> u64 {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    let day = 86_400_000;
    let offset = 9 * 3_600_000;
    (now_ms + offset) / day * day + day - offset
}

#[tokio::test]
async fn a_fleet_shares_a_calendar_quota_all_or_nothing_with_its_rate() {
    let server = RedisServer::start();
    let config = temp_file(&format!("calendar-redis-{}.toml", server.port), POLICIES);
    let url = server.url();
    let args = [
        "--config",
        config.to_str().expect("UTF-8"),
        "--redis",
        url.as_str(),
    ];
    let (one, two) = (Daemon::start(&args), Daemon::start(&args));
    let mut a = Client::connect(one.addr).await;
    let mut b = Client::connect(two.addr).await;

    let first = a.decide(ask(1)).await;
    assert_eq!(first["success"], true, "{first}");
    let midnight = next_tokyo_midnight_ms();
    let reset = first["reset_at_ms"].as_u64().expect("a reset");
    // The tighter limit binds the answer: the quota (2 left of 3 today) or the bucket (1 of 2).
    assert!(reset <= midnight, "{first}");

    // The bucket has 1 left: a call of 2 is denied by it, and the quota counts nothing.
    let denied = b.decide(ask(2)).await;
    assert_eq!(denied["success"], false, "{denied}");
    let report = b.decide(ask(0)).await;
    assert_eq!(report["success"], true, "{report}");
    assert_eq!(
        report["remaining"], 1,
        "the bucket's 1, the quota's 2: {report}"
    );

    // Through the other process: the quota is the fleet's.
    assert_eq!(a.decide(ask(1)).await["success"], true);
    let spent = b.decide(ask(1)).await;
    assert_eq!(spent["success"], false, "the bucket is spent: {spent}");
    let (status, many) = a
        .post("/v1/ratelimit/many", &json!({"requests": [ask(1)]}))
        .await;
    assert_eq!(
        status, 400,
        "a calendar quota on Redis is decided alone: {many}"
    );
}

#[tokio::test]
async fn while_redis_fails_a_falling_back_policy_counts_its_share_of_the_quota_here() {
    let mut server = RedisServer::start();
    let url = server.url();
    // A fleet of two: while Redis fails, this node counts at most 4 / 2 = 2 a day for the
    // whole quota (keyed globally), and each identifier's bucket holds 2 / 2 = 1.
    let config = temp_file(
        &format!("calendar-fallback-{}.toml", server.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{url}\"\non_failure = \"fallback\"\nfleet_size = 2\n\
             [policies.daily]\n\
             limits = [\n\
               {{ algorithm = \"fixed_window\", count = 4, period = \"1d\", calendar = \"UTC\", key = \"global\" }},\n\
               {{ algorithm = \"token_bucket\", count = 2, period = \"1h\" }},\n\
             ]\n"
        ),
    );
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);
    let mut client = Client::connect(daemon.addr).await;
    let ask = |identifier: &str| json!({"policy": "daily", "identifier": identifier});
    assert_eq!(client.decide(ask("warm")).await["success"], true);

    server.kill();
    assert_eq!(client.decide(ask("ann")).await["success"], true);
    // Ann's bucket (her share: 1) denies her second call, and the quota's unit goes back.
    let denied = client.decide(ask("ann")).await;
    assert_eq!(denied["success"], false, "{denied}");
    assert_eq!(denied["limit"], 1, "the bucket's share binds: {denied}");
    // So the node's share of the quota still has one unit, for bob; then none, for carol.
    assert_eq!(client.decide(ask("bob")).await["success"], true);
    let over = client.decide(ask("carol")).await;
    assert_eq!(
        over["success"], false,
        "the node's share of the day is spent: {over}"
    );
    assert_eq!(over["limit"], 2, "the quota's share binds: {over}");
    let midnight = {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as u64;
        now_ms / 86_400_000 * 86_400_000 + 86_400_000
    };
    let reset = over["reset_at_ms"].as_u64().expect("a reset");
    assert!(
        reset.abs_diff(midnight) <= 1_000,
        "the next UTC midnight: {over}"
    );
}

#[tokio::test]
async fn while_redis_fails_each_failure_policy_answers_reports_and_calls_on_gated_policies() {
    let mut server = RedisServer::start();
    let url = server.url();
    // One policy per failure policy, each with a calendar quota and a concurrency limit kept
    // on Redis beside its rate limit.
    let gated = |name: &str, on_failure: &str| {
        format!(
            "[policies.{name}]\non_failure = \"{on_failure}\"\nlimits = [\n\
               {{ algorithm = \"fixed_window\", count = 10, period = \"1mo\", calendar = \"UTC\" }},\n\
               {{ algorithm = \"concurrency\", count = 10 }},\n\
               {{ algorithm = \"token_bucket\", count = 10, period = \"1h\" }},\n]\n"
        )
    };
    let config = temp_file(
        &format!("calendar-failures-{}.toml", server.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{url}\"\n{}{}{}",
            gated("open", "open"),
            gated("closed", "closed"),
            gated("fallback", "fallback"),
        ),
    );
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);
    let mut client = Client::connect(daemon.addr).await;
    let ask =
        |policy: &str, cost: u64| json!({"policy": policy, "identifier": "acme", "cost": cost});
    for policy in ["open", "closed", "fallback"] {
        assert_eq!(client.decide(ask(policy, 1)).await["success"], true);
    }

    server.kill();
    for cost in [0, 1] {
        let (status, open) = client.post("/v1/ratelimit", &ask("open", cost)).await;
        assert_eq!(
            (status, &open["success"]),
            (200, &json!(true)),
            "cost {cost}: {open}"
        );
        let (status, closed) = client.post("/v1/ratelimit", &ask("closed", cost)).await;
        assert_eq!(status, 503, "cost {cost}: {closed}");
        let (status, fallback) = client.post("/v1/ratelimit", &ask("fallback", cost)).await;
        assert_eq!(
            (status, &fallback["success"]),
            (200, &json!(true)),
            "cost {cost}: {fallback}"
        );
    }
}
