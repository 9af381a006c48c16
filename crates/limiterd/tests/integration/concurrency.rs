//! Concurrency limits through a real limiterd over HTTP: an admitted call's answer carries a
//! permit, a call past the count is refused taking nothing, a release answers whether the
//! permit was held (idempotent), the metrics count what is held; in memory, and on Redis
//! shared by two processes (a permit taken through one is released through the other, and
//! either scrapes the fleet's count); a permit key Redis cannot read fails the call and
//! keeps no unit; while Redis fails, on local stand-ins, all or nothing.

use limiter_testkit::redis_server::RedisServer;

use crate::support::{Client, Daemon, temp_file};
use serde_json::{Value, json};

const POLICIES: &str = "[policies.exports]\n\
    limits = [\n\
      { algorithm = \"concurrency\", count = 2, ttl = \"10m\" },\n\
      { algorithm = \"fixed_window\", count = 100, period = \"1h\" },\n\
    ]\n\
    [policies.api]\n\
    limits = [{ algorithm = \"token_bucket\", count = 10, period = \"1s\" }]\n\
    [policies.solo]\n\
    limits = [{ algorithm = \"concurrency\", count = 1, ttl = \"10m\" }]\n";

fn ask(identifier: &str) -> Value {
    json!({"policy": "exports", "identifier": identifier})
}

fn permit(answer: &Value) -> String {
    answer["permit"]
        .as_str()
        .unwrap_or_else(|| panic!("an admitted call carries a permit: {answer}"))
        .to_owned()
}

/// Releases `permit` twice: the first release gives it back, the second finds it gone.
async fn released_once(client: &mut Client, identifier: &str, permit: &str) {
    let twice = [
        release(client, identifier, permit).await,
        release(client, identifier, permit).await,
    ];
    assert_eq!(
        twice,
        [
            (200, json!({"released": true})),
            (200, json!({"released": false}))
        ]
    );
}

/// A limiterd on `server` with policy `gated`: a permit per identifier and a bucket of 2 an
/// hour for everyone (exactly what two admitted calls take), under failure policy
/// `on_failure`.
fn permit_and_bucket(server: &RedisServer, on_failure: &str) -> Daemon {
    Daemon::on_redis(
        &format!("concurrency-{on_failure}-gated-{}.toml", server.port),
        &format!(
            "[policies.gated]\non_failure = \"{on_failure}\"\n\
             limits = [\n\
               {{ algorithm = \"concurrency\", count = 1, ttl = \"10m\" }},\n\
               {{ algorithm = \"token_bucket\", count = 2, period = \"1h\", key = \"global\" }},\n\
             ]\n"
        ),
        &server.url(),
    )
}

async fn release(client: &mut Client, identifier: &str, permit: &str) -> (u16, Value) {
    let body = json!({"policy": "exports", "identifier": identifier, "permit": permit});
    client.post("/v1/ratelimit/release", &body).await
}

#[tokio::test]
async fn permits_are_handed_out_refused_past_the_count_and_released_once_in_memory() {
    let config = temp_file("concurrency-memory.toml", POLICIES);
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);
    let mut client = Client::connect(daemon.addr).await;

    let first = client.decide(ask("acme")).await;
    assert_eq!(first["success"], true, "{first}");
    assert_eq!(
        (first["limit"].clone(), first["remaining"].clone()),
        (json!(2), json!(1))
    );
    let first = permit(&first);
    let second = permit(&client.decide(ask("acme")).await);
    let busy = client.decide(ask("acme")).await;
    assert_eq!(busy["success"], false, "{busy}");
    assert!(busy.get("permit").is_none(), "{busy}");
    assert!(
        busy["retry_after_ms"].as_u64().expect("a wait") > 0,
        "{busy}"
    );
    assert!(
        !permit(&client.decide(ask("globex")).await).is_empty(),
        "another identifier"
    );

    let (_, text) = client.send("GET", "/metrics", "").await;
    assert!(
        text.contains("limiterd_permits_held{policy=\"exports\"} 3"),
        "{text}"
    );
    released_once(&mut client, "acme", &first).await;
    assert_eq!(
        release(&mut client, "globex", &second).await.1,
        json!({"released": false})
    );
    let third = permit(&client.decide(ask("acme")).await);
    assert_ne!(third, first);
    let (_, text) = client.send("GET", "/metrics", "").await;
    for line in [
        "limiterd_permit_releases_total{policy=\"exports\",result=\"released\"} 1",
        "limiterd_permit_releases_total{policy=\"exports\",result=\"not_held\"} 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }

    // A report (cost 0) says what a call would meet, and takes no permit.
    let report = client
        .decide(json!({"policy": "exports", "identifier": "acme", "cost": 0}))
        .await;
    assert!(
        report.get("permit").is_none(),
        "a report takes no permit: {report}"
    );

    // Batches, unknown policies and policies without permits are refused, naming the fix.
    let (status, refused) = client
        .post("/v1/ratelimit/many", &json!({"requests": [ask("acme")]}))
        .await;
    assert_eq!(status, 400, "{refused}");
    assert!(refused.to_string().contains("decide it alone"), "{refused}");
    let (status, unknown) = client
        .post(
            "/v1/ratelimit/release",
            &json!({"policy": "nope", "identifier": "a", "permit": "x"}),
        )
        .await;
    assert_eq!(
        (status, unknown["error"]["code"].clone()),
        (400, json!("unknown_policy"))
    );
    let (status, none) = client
        .post(
            "/v1/ratelimit/release",
            &json!({"policy": "api", "identifier": "a", "permit": "x"}),
        )
        .await;
    assert_eq!(status, 400, "{none}");
    assert!(
        none.to_string().contains("has no concurrency limit"),
        "{none}"
    );
    let (status, missing) = client
        .post(
            "/v1/ratelimit/release",
            &json!({"policy": "exports", "identifier": "a"}),
        )
        .await;
    assert_eq!(status, 400, "{missing}");
}

#[tokio::test]
async fn a_fleet_on_redis_shares_the_permits_and_releases_through_any_process() {
    let server = RedisServer::start();
    let config = temp_file(&format!("concurrency-redis-{}.toml", server.port), POLICIES);
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

    let first = a.decide(ask("acme")).await;
    assert_eq!(first["source"], "redis", "{first}");
    let first = permit(&first);
    let _second = permit(&b.decide(ask("acme")).await);
    let busy = a.decide(ask("acme")).await;
    assert_eq!(
        busy["success"], false,
        "two permits held across the fleet: {busy}"
    );
    assert_eq!(b.decide(ask("acme")).await["success"], false);
    // Either process scrapes the fleet's count, from Redis.
    let held = |n: u64| format!("limiterd_permits_held{{policy=\"exports\"}} {n}");
    for client in [&mut a, &mut b] {
        let (_, text) = client.send("GET", "/metrics", "").await;
        assert!(text.lines().any(|l| l == held(2)), "{text}");
    }

    // Taken through the first process, released through the second.
    assert_eq!(
        release(&mut b, "acme", &first).await,
        (200, json!({"released": true}))
    );
    assert_eq!(
        release(&mut a, "acme", &first).await.1,
        json!({"released": false})
    );
    let (_, text) = a.send("GET", "/metrics", "").await;
    assert!(text.lines().any(|l| l == held(1)), "released: {text}");
    assert!(b.decide(ask("acme")).await.get("permit").is_some());
    // Each process counts the releases it answered: summed, the fleet's.
    let released = "limiterd_permit_releases_total{policy=\"exports\",result=\"released\"} 1";
    let not_held = "limiterd_permit_releases_total{policy=\"exports\",result=\"not_held\"} 1";
    let (_, text_b) = b.send("GET", "/metrics", "").await;
    assert!(text_b.lines().any(|l| l == released), "{text_b}");
    let (_, text_a) = a.send("GET", "/metrics", "").await;
    assert!(text_a.lines().any(|l| l == not_held), "{text_a}");

    // A concurrency limit alone (no rate limit, so no layer in the stack): Redis answers it,
    // admitted, busy and reported.
    let solo = |cost: u64| json!({"policy": "solo", "identifier": "acme", "cost": cost});
    for (cost, success) in [(1, true), (1, false), (0, false)] {
        let answer = a.decide(solo(cost)).await;
        assert_eq!(
            (&answer["success"], &answer["source"]),
            (&json!(success), &json!("redis")),
            "{answer}"
        );
    }
}

/// On Redis a permit is asked with the rate limits and the calendar quotas at once: a call
/// refused for want of a permit gives back what they took, and one they refuse gives back its
/// permit.
#[tokio::test]
async fn on_redis_a_permit_and_the_rate_limits_are_all_or_nothing() {
    let server = RedisServer::start();
    let (zone, _) = crate::support::calendars::zone_with_a_midnight_ahead();
    // A permit per identifier; a bucket and a week's quota for everyone, each holding exactly
    // what two admitted calls take.
    let daemon = Daemon::on_redis(
        &format!("concurrency-gated-{}.toml", server.port),
        &format!(
            "[policies.gated]\n\
             limits = [\n\
               {{ algorithm = \"concurrency\", count = 1, ttl = \"10m\" }},\n\
               {{ algorithm = \"token_bucket\", count = 2, period = \"1h\", key = \"global\" }},\n\
               {{ algorithm = \"fixed_window\", count = 2, period = \"1w\", calendar = \"{zone}\", key = \"global\" }},\n\
             ]\n"
        ),
        &server.url(),
    );
    let mut client = Client::connect(daemon.addr).await;
    let ask = |identifier: &str| json!({"policy": "gated", "identifier": identifier});

    let ann = client.decide(ask("ann")).await;
    let _ann_permit = permit(&ann);
    // Ann holds her one permit: refused, and the bucket's and the week's units asked with it
    // go back.
    let busy = client.decide(ask("ann")).await;
    assert_eq!(busy["success"], false, "{busy}");
    assert!(busy.get("permit").is_none(), "{busy}");
    // So Bob gets the last unit of each.
    let bob = client.decide(ask("bob")).await;
    let _bob_permit = permit(&bob);
    assert_eq!(bob["remaining"], 0, "{bob}");
    // Carol's permit is free, but the bucket and the week are spent: the permit goes back.
    let carol = client.decide(ask("carol")).await;
    assert_eq!(carol["success"], false, "{carol}");
    assert!(carol.get("permit").is_none(), "{carol}");
    let (_, text) = client.send("GET", "/metrics", "").await;
    let held = "limiterd_permits_held{policy=\"gated\"} 2";
    assert!(
        text.lines().any(|l| l == held),
        "Ann's and Bob's alone: {text}"
    );
    // Each call counted once, by its answer, whatever else was asked with it.
    for (result, n) in [("allowed", 2), ("denied", 2)] {
        let line = format!("limiterd_decisions_total{{policy=\"gated\",result=\"{result}\"}} {n}");
        assert!(text.lines().any(|l| l == line), "{line}: {text}");
    }
}

/// A permit key holding what no limiter wrote (an operator's `SET`) fails the call by the
/// policy's failure policy (closed: a 503 naming the key), takes no permit, and gives back
/// the bucket's unit asked with it.
#[tokio::test]
async fn on_redis_a_permit_key_redis_cannot_read_gives_back_the_rate_units() {
    let server = RedisServer::start();
    let daemon = permit_and_bucket(&server, "closed");
    let mut client = Client::connect(daemon.addr).await;
    let ask = |identifier: &str| json!({"policy": "gated", "identifier": identifier});
    let _ann = permit(&client.decide(ask("ann")).await);
    let mut redis = server.client();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*permits*{ann}")
        .query(&mut redis)
        .unwrap();
    let [ann_key] = keys.as_slice() else {
        panic!("Ann's permit key: {keys:?}");
    };
    let zed_key = ann_key.replace("{ann}", "{zed}");
    redis::cmd("SET")
        .arg(&zed_key)
        .arg("mine")
        .query::<()>(&mut redis)
        .unwrap();
    let (status, failed) = client.post("/v1/ratelimit", &ask("zed")).await;
    assert_eq!(status, 503, "{failed}");
    assert!(failed.to_string().contains(&zed_key), "{failed}");
    // The bucket's unit taken with Zed's call came back: Bob takes the last, Carol none.
    let bob = client.decide(ask("bob")).await;
    let _bob = permit(&bob);
    assert_eq!(bob["remaining"], 0, "{bob}");
    let carol = client.decide(ask("carol")).await;
    assert_eq!(carol["success"], false, "{carol}");
    let kept: String = redis::cmd("GET").arg(&zed_key).query(&mut redis).unwrap();
    assert_eq!(kept, "mine", "left as found");
}

#[tokio::test]
async fn while_redis_fails_a_falling_back_policy_hands_out_its_share_from_a_local_table() {
    let mut server = RedisServer::start();
    let url = server.url();
    // A fleet of two: while Redis fails, this node holds at most 4 / 2 = 2 per identifier.
    let config = temp_file(
        &format!("concurrency-fallback-{}.toml", server.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{url}\"\non_failure = \"fallback\"\nfleet_size = 2\n\
             [policies.exports]\n\
             limits = [{{ algorithm = \"concurrency\", count = 4, ttl = \"10m\" }}]\n"
        ),
    );
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);
    let mut client = Client::connect(daemon.addr).await;
    let on_redis = permit(&client.decide(ask("acme")).await);
    assert!(!on_redis.starts_with("local-"), "{on_redis}");
    let gauge = "limiterd_permits_held{policy=\"exports\"}";
    let (_, text) = client.send("GET", "/metrics", "").await;
    assert!(text.lines().any(|l| l == format!("{gauge} 1")), "{text}");

    server.kill();
    let first = permit(&client.decide(ask("acme")).await);
    assert!(
        first.starts_with("local-"),
        "from the stand-in table: {first}"
    );
    let second = permit(&client.decide(ask("acme")).await);
    let busy = client.decide(ask("acme")).await;
    assert_eq!(busy["success"], false, "this node's share is 2: {busy}");
    assert!(busy.get("permit").is_none(), "{busy}");
    // A local permit is released locally (Redis is still down), once.
    released_once(&mut client, "acme", &first).await;
    assert!(permit(&client.decide(ask("acme")).await).starts_with("local-"));
    assert_ne!(second, first);
    // Each of the four answers the table gave is counted as the fallback's, as an operator
    // watching the failure policies expects.
    let (_, text) = client.send("GET", "/metrics", "").await;
    let fallback = text
        .lines()
        .find(|l| l.starts_with("limiterd_failure_policy_total{policy=\"fallback\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
    assert!(fallback >= Some(4), "{fallback:?}: {text}");
    // The fleet's count cannot be read while Redis is down: left out, not its last reading.
    assert!(!text.contains(gauge), "{text}");
}

/// While Redis fails, a falling-back policy's permit and rate limit are decided on their local
/// stand-ins, together as on Redis: a call whose permit is busy gives back what the bucket's
/// fallback took for it, and a call the bucket denies gives back its local permit.
#[tokio::test]
async fn while_redis_fails_a_busy_permit_leaves_the_fallback_bucket_untouched() {
    let mut server = RedisServer::start();
    let daemon = permit_and_bucket(&server, "fallback");
    let mut client = Client::connect(daemon.addr).await;
    let item = |identifier: &str| json!({"policy": "gated", "identifier": identifier});
    server.kill();

    let held = client.decide(item("acme")).await;
    assert!(permit(&held).starts_with("local-"), "{held}");
    // Acme's permit is held: its second call is busy, and the bucket's unit goes back.
    let busy = client.decide(item("acme")).await;
    assert_eq!(
        (&busy["success"], &busy["limit"]),
        (&json!(false), &json!(1)),
        "the permit's answer: {busy}"
    );
    // So the bucket still holds one unit, which Bob takes; then none is left for Carol.
    let bob = client.decide(item("bob")).await;
    assert_eq!(bob["success"], true, "the bucket's last unit: {bob}");
    // Carol's calls are denied by the bucket, and the local permit each took goes back: her
    // next call is the bucket's denial again, not a busy permit's.
    for _ in 0..2 {
        let carol = client.decide(item("carol")).await;
        assert_eq!(
            (&carol["success"], &carol["limit"]),
            (&json!(false), &json!(2)),
            "the bucket is spent: {carol}"
        );
    }
}

/// Callers racing on one permit, on Redis: a busy permit gives back exactly what the bucket
/// and the week's quota took with it, whatever the interleaving, so the calls admitted are
/// exactly the rate limits' count (one unit leaked to a busy call would admit fewer; none is
/// ever admitted past them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_callers_on_one_permit_leak_no_rate_unit() {
    let server = RedisServer::start();
    let (zone, _) = crate::support::calendars::zone_with_a_midnight_ahead();
    let daemon = Daemon::on_redis(
        &format!("concurrency-race-{}.toml", server.port),
        &format!(
            "[policies.one]\n\
             limits = [\n\
               {{ algorithm = \"concurrency\", count = 1, ttl = \"10m\" }},\n\
               {{ algorithm = \"token_bucket\", count = 30, period = \"1d\", key = \"global\" }},\n\
               {{ algorithm = \"fixed_window\", count = 30, period = \"1w\", calendar = \"{zone}\", key = \"global\" }},\n\
             ]\n"
        ),
        &server.url(),
    );
    let callers = (0..6).map(|_| {
        let addr = daemon.addr;
        tokio::spawn(async move {
            let mut client = Client::connect(addr).await;
            let ask = json!({"policy": "one", "identifier": "x"});
            let (mut admitted, mut busy) = (0_u64, 0_u64);
            loop {
                let answer = client.decide(ask.clone()).await;
                if answer["success"] == true {
                    admitted += 1;
                    let body =
                        json!({"policy": "one", "identifier": "x", "permit": permit(&answer)});
                    let (status, _) = client.post("/v1/ratelimit/release", &body).await;
                    assert_eq!(status, 200);
                } else if answer["limit"] == 1 {
                    busy += 1; // another caller holds the permit: ask again
                } else {
                    assert_eq!(answer["limit"], 30, "{answer}");
                    return (admitted, busy);
                }
            }
        })
    });
    let (mut admitted, mut busy) = (0, 0);
    for caller in callers.collect::<Vec<_>>() {
        let (a, b) = caller.await.expect("a caller");
        admitted += a;
        busy += b;
    }
    println!("racing: {admitted} admitted, {busy} busy");
    assert_eq!(admitted, 30, "{busy} busy answers leaked rate units");
}
