//! A call's calendar quotas on Redis asked with its policy's stack, through a real limiterd
//! over HTTP: when a quota denies, what the other quotas and the stack took goes back, alone
//! and in a batch, and each call is counted once; the same while Redis fails and the local
//! fallbacks decide; a part Redis cannot read (its key overwritten) fails the call and what
//! the other parts took goes back; callers racing leak no unit; a leased policy's rate limits
//! are still decided on its lease.

use limiter_testkit::redis_server::RedisServer;
use serde_json::{Value, json};

use crate::support::calendars::zone_with_a_midnight_ahead;
use crate::support::{Client, Daemon};

/// A limiterd on `server` with policy `gated`: a day's `day` per identifier (in a zone whose
/// midnight is ahead) and a bucket of `bucket` an hour for everyone, under failure policy
/// `on_failure`.
fn day_and_bucket(server: &RedisServer, day: u64, bucket: u64, on_failure: &str) -> Daemon {
    let (zone, _) = zone_with_a_midnight_ahead();
    Daemon::on_redis(
        &format!("calendar-{on_failure}-gated-{}.toml", server.port),
        &format!(
            "[policies.gated]\n\
             on_failure = \"{on_failure}\"\n\
             limits = [\n\
               {{ algorithm = \"fixed_window\", count = {day}, period = \"1d\", calendar = \"{zone}\" }},\n\
               {{ algorithm = \"token_bucket\", count = {bucket}, period = \"1h\", key = \"global\" }},\n\
             ]\n"
        ),
        &server.url(),
    )
}

/// A call's quotas and its stack are taken together: when one quota denies, what the others
/// and the stack took goes back, alone or in a batch.
#[tokio::test]
async fn a_quota_that_denies_leaves_the_other_quotas_and_the_stack_untouched() {
    let server = RedisServer::start();
    let (zone, _) = zone_with_a_midnight_ahead();
    // A day's 1 per identifier, a week's 2 for everyone, a bucket of 2 an hour for everyone:
    // the week and the bucket each hold exactly what two admitted calls take.
    let daemon = Daemon::on_redis(
        &format!("calendar-gated-{}.toml", server.port),
        &format!(
            "[policies.gated]\n\
             limits = [\n\
               {{ algorithm = \"fixed_window\", count = 1, period = \"1d\", calendar = \"{zone}\" }},\n\
               {{ algorithm = \"fixed_window\", count = 2, period = \"1w\", calendar = \"{zone}\", key = \"global\" }},\n\
               {{ algorithm = \"token_bucket\", count = 2, period = \"1h\", key = \"global\" }},\n\
             ]\n"
        ),
        &server.url(),
    );
    let mut client = Client::connect(daemon.addr).await;
    let item = |identifier: &str| json!({"policy": "gated", "identifier": identifier});

    let first = client.decide(item("ann")).await;
    assert_eq!(first["success"], true, "{first}");
    // Ann's day is spent: the week and the bucket, asked with it, give their units back.
    let again = client.decide(item("ann")).await;
    assert_eq!(again["success"], false, "{again}");
    // In a batch too: Ann's day refuses it, and Dan's units in every quota go back.
    let (status, batch) = client
        .post(
            "/v1/ratelimit/many",
            &json!({"requests": [item("dan"), item("ann")]}),
        )
        .await;
    assert_eq!((status, &batch["success"]), (200, &json!(false)), "{batch}");
    // So the week and the bucket still hold one unit each, which Dan takes; then none is left.
    let dan = client.decide(item("dan")).await;
    assert_eq!(
        (&dan["success"], &dan["remaining"]),
        (&json!(true), &json!(0)),
        "the week's and the bucket's last unit: {dan}"
    );
    let erin = client.decide(item("erin")).await;
    assert_eq!(
        erin["success"], false,
        "the week and the bucket are spent: {erin}"
    );
    // Each call counted once, by its answer: Ann's and Dan's admissions; Ann's two denials and
    // Erin's; Dan's item of the refused batch.
    let (_, text) = client.send("GET", "/metrics", "").await;
    for (result, n) in [("allowed", 2), ("denied", 3), ("batch_refused", 1)] {
        let line = format!("limiterd_decisions_total{{policy=\"gated\",result=\"{result}\"}} {n}");
        assert!(text.lines().any(|l| l == line), "{line}: {text}");
    }
}

/// While Redis fails, a falling-back policy decides its quota and its stack on their local
/// stand-ins, together as on Redis: a call the quota denies gives back what the stack's
/// fallback took for it (a denied call changes no limit, on Redis or beside it).
#[tokio::test]
async fn while_redis_fails_a_quota_that_denies_leaves_the_fallback_stack_untouched() {
    let mut server = RedisServer::start();
    // A day's 1 per identifier and a bucket of 2 an hour for everyone: the bucket holds
    // exactly what two admitted calls take.
    let daemon = day_and_bucket(&server, 1, 2, "fallback");
    let mut client = Client::connect(daemon.addr).await;
    let item = |identifier: &str| json!({"policy": "gated", "identifier": identifier});
    server.kill();

    let first = client.decide(item("ann")).await;
    assert_eq!(
        (&first["success"], &first["source"]),
        (&json!(true), &json!("fallback")),
        "{first}"
    );
    // Ann's day is spent: the bucket's unit, taken by the fallback beside it, goes back.
    let again = client.decide(item("ann")).await;
    assert_eq!(again["success"], false, "{again}");
    // So the bucket still holds one unit, which Dan takes; then none is left for Erin.
    let dan = client.decide(item("dan")).await;
    assert_eq!(
        (&dan["success"], &dan["remaining"]),
        (&json!(true), &json!(0)),
        "the bucket's last unit: {dan}"
    );
    let erin = client.decide(item("erin")).await;
    assert_eq!(erin["success"], false, "the bucket is spent: {erin}");
}

/// A part Redis cannot decide (its key overwritten by an operator) fails the call by the
/// policy's failure policy (closed here: 503 naming the key), and what the other parts took
/// for it goes back: the stack's unit when the quota's key is bad, the quota's when the
/// bucket's is, alone and in a batch.
#[tokio::test]
async fn a_part_redis_cannot_read_gives_back_what_the_others_took() {
    let server = RedisServer::start();
    // A day's 2 per identifier and a bucket of 3 an hour for everyone, failing closed.
    let daemon = day_and_bucket(&server, 2, 3, "closed");
    let mut client = Client::connect(daemon.addr).await;
    let item = |identifier: &str| json!({"policy": "gated", "identifier": identifier});
    let first = client.decide(item("ann")).await;
    assert_eq!(first["success"], true, "{first}");
    let mut redis = server.client();
    let mut set = |key: &str, value: Option<&str>| {
        let command = match value {
            Some(value) => redis::cmd("SET").arg(key).arg(value).clone(),
            None => redis::cmd("DEL").arg(key).clone(),
        };
        command.query::<()>(&mut redis).unwrap();
    };
    // The bucket's key overwritten: Ann's call fails, and her day's unit goes back.
    let bucket = "limiterd:{gated}:global:0";
    set(bucket, Some("not a state"));
    let (status, failed) = client.post("/v1/ratelimit", &item("ann")).await;
    assert_eq!(status, 503, "{failed}");
    assert!(failed.to_string().contains(bucket), "{failed}");
    set(bucket, None);
    let second = client.decide(item("ann")).await;
    assert_eq!(
        (&second["success"], &second["remaining"]),
        (&json!(true), &json!(0)),
        "her day's second unit: {second}"
    );
    // Bob's quota key overwritten: his call fails, and the bucket's unit goes back (the
    // bucket, emptied above, gave Ann one of its 3).
    set("limiterd:quota:gated:0:{bob}", Some("not a state"));
    let (status, failed) = client.post("/v1/ratelimit", &item("bob")).await;
    assert_eq!(status, 503, "{failed}");
    assert!(failed.to_string().contains("{bob}"), "{failed}");
    // In a batch too: Bob's bad key fails it, and Carol's units in the quota and the bucket go
    // back.
    let (status, failed) = client
        .post(
            "/v1/ratelimit/many",
            &json!({"requests": [item("carol"), item("bob")]}),
        )
        .await;
    assert_eq!(status, 503, "{failed}");
    for (who, left) in [("carol", 1), ("dan", 0)] {
        let taken = client.decide(item(who)).await;
        assert_eq!(
            (&taken["success"], &taken["remaining"]),
            (&json!(true), &json!(left)),
            "{who}: {taken}"
        );
    }
    let erin = client.decide(item("erin")).await;
    assert_eq!(erin["success"], false, "the bucket is spent: {erin}");
}

/// A leased policy's quota is counted on Redis at each call, and its rate limits are decided
/// against the lease, as without a quota: no call to Redis for them.
#[tokio::test]
async fn a_leased_policy_decides_its_rate_limits_on_the_lease_beside_its_quota() {
    let server = RedisServer::start();
    let (zone, _) = zone_with_a_midnight_ahead();
    let daemon = Daemon::on_redis(
        &format!("calendar-leased-{}.toml", server.port),
        &format!(
            "[policies.leased]\n\
             limits = [\n\
               {{ algorithm = \"fixed_window\", count = 100000, period = \"1d\", calendar = \"{zone}\" }},\n\
               {{ algorithm = \"token_bucket\", count = 100, period = \"1h\" }},\n\
             ]\n\
             lease_slack = \"10%\"\n"
        ),
        &server.url(),
    );
    let mut client = Client::connect(daemon.addr).await;
    let mut from_the_lease = 0;
    for _ in 0..40 {
        let answer = client.decide(ask_leased()).await;
        assert_eq!(answer["success"], true, "{answer}");
        // The bucket binds (fewer left than the day's quota): its answer names where it came from.
        from_the_lease += u32::from(answer["source"] == "lease");
    }
    assert!(
        from_the_lease >= 30,
        "{from_the_lease} of 40 decided on the lease"
    );
}

fn ask_leased() -> Value {
    json!({"policy": "leased", "identifier": "acme"})
}

/// Callers racing, each asking twice per identifier, so every second call is denied by its
/// identifier's day while the bucket and the week's quota were asked with it: the calls
/// admitted, with what is left once they stop, are exactly their count (one unit leaked to a
/// denied call would admit fewer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_callers_denied_by_a_quota_leak_no_unit() {
    let server = RedisServer::start();
    let (zone, _) = zone_with_a_midnight_ahead();
    let daemon = Daemon::on_redis(
        &format!("calendar-race-{}.toml", server.port),
        &format!(
            "[policies.daily]\n\
             limits = [\n\
               {{ algorithm = \"fixed_window\", count = 1, period = \"1d\", calendar = \"{zone}\" }},\n\
               {{ algorithm = \"fixed_window\", count = 30, period = \"1w\", calendar = \"{zone}\", key = \"global\" }},\n\
               {{ algorithm = \"token_bucket\", count = 30, period = \"1d\", key = \"global\" }},\n\
             ]\n"
        ),
        &server.url(),
    );
    let callers = (0..6).map(|caller| {
        let addr = daemon.addr;
        tokio::spawn(async move {
            let mut client = Client::connect(addr).await;
            let (mut admitted, mut denied_by_day) = (0_u64, 0_u64);
            for n in 0.. {
                let ask = json!({"policy": "daily", "identifier": format!("{caller}-{n}")});
                for _ in 0..2 {
                    let answer = client.decide(ask.clone()).await;
                    if answer["success"] == true {
                        admitted += 1;
                    } else if answer["limit"] == 1 {
                        denied_by_day += 1;
                    } else {
                        assert_eq!(answer["limit"], 30, "{answer}");
                        return (admitted, denied_by_day);
                    }
                }
            }
            unreachable!("the week runs out")
        })
    });
    let (mut admitted, mut denied_by_day) = (0, 0);
    for caller in callers.collect::<Vec<_>>() {
        let (a, d) = caller.await.expect("a caller");
        admitted += a;
        denied_by_day += d;
    }
    // A caller stops at its first denial by the week or the bucket, which may come while a
    // racing denied call still holds a unit it gives back a round trip later: what is left
    // once all have stopped is taken now, one fresh identifier at a time.
    let mut client = Client::connect(daemon.addr).await;
    let mut left = 0_u64;
    for n in 0..30 {
        let answer = client
            .decide(json!({"policy": "daily", "identifier": format!("after-{n}")}))
            .await;
        if answer["success"] != true {
            break;
        }
        left += 1;
    }
    println!("racing: {admitted} admitted, {denied_by_day} denied by their day, {left} left");
    assert_eq!(admitted + left, 30, "{denied_by_day} denials leaked units");
}
