//! Calendar quotas through a real limiterd over HTTP on Redis, two processes sharing one
//! server: the quota is counted once for the fleet, beside the policy's rate limit and all or
//! nothing with it, and `reset_at_ms` names the next local midnight in the policy's zone; in a
//! batch, all or nothing with the batch's other items; while Redis fails, a falling-back policy
//! counts this node's share of the quota in the process.

use limiter_testkit::redis_server::RedisServer;

use crate::support::calendars::{zone_with_a_midnight_ahead, zone_with_a_month_ahead};
use crate::support::windows::{DAY_MS, in_one_window, unix_ms};
use crate::support::{Client, Daemon, temp_file};
use serde_json::{Value, json};

/// A policy of 3 a day in `zone` beside a bucket of 2 an hour.
fn daily_policy(zone: &str) -> String {
    format!(
        "[policies.daily]\n\
         limits = [\n\
           {{ algorithm = \"fixed_window\", count = 3, period = \"1d\", calendar = \"{zone}\" }},\n\
           {{ algorithm = \"token_bucket\", count = 2, period = \"1h\" }},\n\
         ]\n"
    )
}

fn ask(cost: u64) -> Value {
    json!({"policy": "daily", "identifier": "acme", "cost": cost})
}

#[tokio::test]
async fn a_fleet_shares_a_calendar_quota_all_or_nothing_with_its_rate() {
    let server = RedisServer::start();
    let (zone, midnight) = zone_with_a_midnight_ahead();
    let config = temp_file(
        &format!("calendar-redis-{}.toml", server.port),
        &daily_policy(zone),
    );
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
    let reset = first["reset_at_ms"].as_u64().expect("a reset");
    // Full again when both are: at the quota's midnight (the bucket's 1 of 2 is back sooner).
    assert_eq!(reset, midnight, "{zone}: {first}");

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
    // A batch of one decides as the call alone: the bucket is spent.
    let (status, many) = a
        .post("/v1/ratelimit/many", &json!({"requests": [ask(1)]}))
        .await;
    assert_eq!((status, &many["success"]), (200, &json!(false)), "{many}");
}

#[tokio::test]
async fn a_batch_counts_its_calendar_quotas_all_or_nothing_with_its_stacks() {
    let server = RedisServer::start();
    let (zone, month_end_ms) = zone_with_a_month_ahead();
    let config = temp_file(
        &format!("calendar-batch-{}.toml", server.port),
        &format!(
            "[policies.monthly]\n\
             limits = [\n\
               {{ algorithm = \"fixed_window\", count = 2, period = \"1mo\", calendar = \"{zone}\" }},\n\
               {{ algorithm = \"token_bucket\", count = 10, period = \"1h\" }},\n\
             ]\n\
             [policies.hourly]\n\
             limits = [{{ algorithm = \"token_bucket\", count = 2, period = \"1h\" }}]\n\
             [policies.quota_only]\n\
             limits = [{{ algorithm = \"fixed_window\", count = 5, period = \"1mo\", calendar = \"{zone}\" }}]\n"
        ),
    );
    let url = server.url();
    let daemon = Daemon::start(&[
        "--config",
        config.to_str().expect("UTF-8"),
        "--redis",
        url.as_str(),
    ]);
    let mut client = Client::connect(daemon.addr).await;
    let item = |policy: &str, identifier: &str, cost: u64| json!({"policy": policy, "identifier": identifier, "cost": cost});
    let mut batch = async |items: Vec<Value>| {
        let (status, answer) = client
            .post("/v1/ratelimit/many", &json!({ "requests": items }))
            .await;
        assert_eq!(status, 200, "{answer}");
        answer
    };

    // Admitted: the month's quota (1 of 2 left) binds the monthly item's answer.
    let both = batch(vec![item("monthly", "acme", 1), item("hourly", "acme", 1)]).await;
    assert_eq!(both["success"], true, "{both}");
    assert_eq!(both["results"][0]["remaining"], 1, "{both}");
    // The hourly item asks for 2 of its 1 left: the batch is refused and the quota's unit given
    // back, so a peek in the next batch still sees 1 left this month.
    let refused = batch(vec![item("monthly", "acme", 1), item("hourly", "acme", 2)]).await;
    assert_eq!(refused["success"], false, "{refused}");
    let peek = batch(vec![item("monthly", "acme", 0), item("hourly", "bob", 1)]).await;
    assert_eq!(peek["success"], true, "{peek}");
    assert_eq!(
        peek["results"][0]["remaining"], 1,
        "the unit came back: {peek}"
    );
    // The month's last unit, beside bob's last hourly one.
    let last = batch(vec![item("monthly", "acme", 1), item("hourly", "bob", 1)]).await;
    assert_eq!(last["success"], true, "{last}");
    assert_eq!(last["results"][0]["remaining"], 0, "{last}");
    // The quota binds: its reset is the next month's start in its zone, to the millisecond.
    assert_eq!(last["results"][0]["reset_at_ms"], month_end_ms, "{last}");
    // The quota denies: the batch is refused before any stack takes a unit, and carol's hourly
    // item reports her 2 untouched.
    let over = batch(vec![item("hourly", "carol", 1), item("monthly", "acme", 1)]).await;
    assert_eq!(over["success"], false, "{over}");
    assert_eq!(over["results"][1]["success"], false, "{over}");
    assert_eq!(over["results"][1]["reset_at_ms"], month_end_ms, "{over}");
    assert_eq!(over["results"][0]["remaining"], 2, "{over}");
    let carol = batch(vec![item("hourly", "carol", 2), item("monthly", "dan", 1)]).await;
    assert_eq!(carol["success"], true, "carol still had both: {carol}");
    // Alone, a report names the same boundary.
    let alone = client.decide(item("monthly", "acme", 0)).await;
    assert_eq!(alone["reset_at_ms"], month_end_ms, "{alone}");
    // A policy of a quota alone (its stack has no layer) is answered by Redis, which counted it.
    let only = client.decide(item("quota_only", "acme", 1)).await;
    assert_eq!(
        (&only["success"], &only["remaining"], &only["source"]),
        (&json!(true), &json!(4), &json!("redis")),
        "{only}"
    );
    assert_eq!(only["reset_at_ms"], month_end_ms, "{only}");
}

#[tokio::test]
async fn while_redis_fails_a_falling_back_policy_counts_its_share_of_the_quota_here() {
    // A day in UTC: a run that failed across midnight runs again.
    in_one_window(DAY_MS, falling_back_counts_a_share_of_the_quota).await;
}

/// A fleet of two on a fresh Redis that is then killed: the node counts its share of the day.
async fn falling_back_counts_a_share_of_the_quota() {
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
    let midnight = unix_ms() / DAY_MS * DAY_MS + DAY_MS;
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
    // Failing open, each gate alone and a quota beside a bucket: the answer reports the
    // policy's tightest limit whole, as a stack failing open does.
    let open_gates = "[policies.open_quota]\non_failure = \"open\"\n\
        limits = [{ algorithm = \"fixed_window\", count = 3, period = \"1d\", calendar = \"UTC\" }]\n\
        [policies.open_permits]\non_failure = \"open\"\n\
        limits = [{ algorithm = \"concurrency\", count = 2 }]\n\
        [policies.open_quota_and_bucket]\non_failure = \"open\"\n\
        limits = [\n\
          { algorithm = \"fixed_window\", count = 3, period = \"1d\", calendar = \"UTC\" },\n\
          { algorithm = \"token_bucket\", count = 9, period = \"1s\" },\n]\n";
    let config = temp_file(
        &format!("calendar-failures-{}.toml", server.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{url}\"\n{}{}{}{open_gates}",
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
        for (policy, limit) in [
            ("open_quota", 3),
            ("open_permits", 2),
            ("open_quota_and_bucket", 3),
        ] {
            let (status, open) = client.post("/v1/ratelimit", &ask(policy, cost)).await;
            assert_eq!(status, 200, "{policy}, cost {cost}: {open}");
            assert_eq!(
                (&open["limit"], &open["remaining"], &open["source"]),
                (&json!(limit), &json!(limit), &json!("fail_open")),
                "{policy}, cost {cost}: {open}"
            );
            assert!(open.get("permit").is_none(), "{policy}: {open}");
        }
        // In a batch too (quotas counted before the stacks, or reported beside them).
        let batch =
            json!({"requests": [ask("open_quota", cost), ask("open_quota_and_bucket", cost)]});
        let (status, both) = client.post("/v1/ratelimit/many", &batch).await;
        assert_eq!(status, 200, "cost {cost}: {both}");
        for open in both["results"].as_array().expect("results") {
            assert_eq!(
                (&open["limit"], &open["remaining"], &open["source"]),
                (&json!(3), &json!(3), &json!("fail_open")),
                "cost {cost}: {both}"
            );
        }
    }
}

#[tokio::test]
async fn one_configuration_answers_alike_on_redis_and_in_memory() {
    let server = RedisServer::start();
    // A month ending at least an hour ahead: later than carol's bucket is full again, so the
    // month binds every reset compared below.
    let (zone, month_end_ms) = zone_with_a_month_ahead();
    let config = temp_file(
        &format!("calendar-record-{}.toml", server.port),
        &format!(
            "[policies.tokens]\n\
             limits = [{{ algorithm = \"fixed_window\", count = 100, period = \"1mo\", calendar = \"{zone}\" }}]\n\
             [policies.rated]\n\
             limits = [\n\
               {{ algorithm = \"fixed_window\", count = 100, period = \"1mo\", calendar = \"{zone}\" }},\n\
               {{ algorithm = \"token_bucket\", count = 15, period = \"1h\" }},\n\
             ]\n\
             [policies.hourly]\n\
             limits = [{{ algorithm = \"token_bucket\", count = 2, period = \"1h\" }}]\n"
        ),
    );
    let config = config.to_str().expect("UTF-8");
    let url = server.url();
    let on_redis = Daemon::start(&["--config", config, "--redis", url.as_str()]);
    let in_memory = Daemon::start(&["--config", config]);
    let record = |identifier: &str, cost: u64| json!({"policy": "tokens", "identifier": identifier, "cost": cost, "record": true});
    let peek = |identifier: &str| json!({"policy": "tokens", "identifier": identifier, "cost": 0});
    // Each step's answer, on Redis and in memory: the same but for who answered.
    let mut answers = Vec::new();
    for daemon in [&on_redis, &in_memory] {
        let mut client = Client::connect(daemon.addr).await;
        let mut seen = Vec::new();
        // 150 tokens recorded against 100 a month: written, the month in debt.
        seen.push(client.decide(record("ann", 150)).await);
        seen.push(client.decide(peek("ann")).await);
        // A record in a batch another item refuses is written all the same.
        let hourly = |cost: u64| json!({"policy": "hourly", "identifier": "bob", "cost": cost});
        assert_eq!(client.decide(hourly(2)).await["success"], true);
        let (_, refused) = client
            .post(
                "/v1/ratelimit/many",
                &json!({"requests": [
                    record("bob", 30),
                    hourly(1),
                ]}),
            )
            .await;
        assert_eq!(refused["success"], false, "{refused}");
        seen.push(client.decide(peek("bob")).await);
        // A record in a batch a quota refuses (dan's month is spent) is written too, in its
        // stack (carol's bucket of 15 binds: 5 left) as in its quota.
        assert_eq!(client.decide(record("dan", 100)).await["success"], true);
        let take = json!({"policy": "tokens", "identifier": "dan", "cost": 1});
        let carol = json!({"policy": "rated", "identifier": "carol", "cost": 10, "record": true});
        let (_, refused) = client
            .post("/v1/ratelimit/many", &json!({"requests": [carol, take]}))
            .await;
        assert_eq!(refused["success"], false, "{refused}");
        let carol = json!({"policy": "rated", "identifier": "carol", "cost": 0});
        seen.push(client.decide(carol).await);
        // Costs no window or bucket can ever admit: the same error, naming the same limit
        // (the month is limit 0 of the identifier layer, the bucket after it limit 1).
        for (policy, cost) in [("tokens", 101), ("rated", 16)] {
            let ask = json!({"policy": policy, "identifier": "eve", "cost": cost});
            let (status, error) = client.post("/v1/ratelimit", &ask).await;
            assert_eq!(status, 400, "{error}");
            seen.push(error);
        }
        // A month that counts nothing is full now: no reset ahead.
        let (before_ms, mut fresh) = (unix_ms(), client.decide(peek("zed")).await);
        let reset = fresh
            .as_object_mut()
            .expect("an object")
            .remove("reset_at_ms");
        let reset = reset.and_then(|r| r.as_u64()).expect("a reset");
        assert!(before_ms <= reset && reset <= unix_ms() + 1, "{reset}");
        seen.push(fresh);
        // The bucket's cost in a batch, after an item that fits: the batch's error names the
        // same limit (on Redis, found from the item that refuses it).
        let (status, error) = client
            .post(
                "/v1/ratelimit/many",
                &json!({"requests": [
                    {"policy": "hourly", "identifier": "fay", "cost": 1},
                    {"policy": "rated", "identifier": "eve", "cost": 16},
                ]}),
            )
            .await;
        assert_eq!(status, 400, "{error}");
        seen.push(error);
        answers.push(seen);
    }
    for seen in &answers {
        assert_eq!(seen[0]["success"], false, "{}", seen[0]);
        assert_eq!(
            (&seen[1]["success"], &seen[1]["remaining"]),
            (&json!(false), &json!(0))
        );
        assert_eq!(seen[1]["reset_at_ms"], month_end_ms, "{}", seen[1]);
        assert_eq!(
            (&seen[2]["success"], &seen[2]["remaining"]),
            (&json!(true), &json!(70))
        );
        assert_eq!(
            (&seen[3]["success"], &seen[3]["remaining"]),
            (&json!(true), &json!(5))
        );
        let message = |i: usize| {
            seen[i]["error"]["message"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        };
        assert!(
            message(4).starts_with("`cost` 101 is above the burst of 100 of a limit of the policy counted per identifier"),
            "{}",
            seen[4]
        );
        assert!(
            message(5).starts_with(
                "`cost` 16 is above the burst of 15 of a limit of the policy counted per identifier"
            ),
            "{}",
            seen[5]
        );
        assert_eq!(seen[6]["remaining"], 100, "{}", seen[6]);
        assert!(
            message(7).starts_with(
                "`cost` 16 is above the burst of 15 of a limit of the policy counted per identifier"
            ),
            "{}",
            seen[7]
        );
    }
    let without_source = |seen: &Vec<Value>| -> Vec<Value> {
        seen.iter()
            .map(|answer| {
                let mut answer = answer.clone();
                answer.as_object_mut().expect("an object").remove("source");
                answer
                    .as_object_mut()
                    .expect("an object")
                    .remove("retry_after_ms");
                answer
            })
            .collect()
    };
    assert_eq!(without_source(&answers[0]), without_source(&answers[1]));
    assert_eq!(answers[0][1]["source"], "redis");
}
