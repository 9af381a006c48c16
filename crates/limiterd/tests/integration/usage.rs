//! Usage that already happened, and the contract a client reads, over the HTTP API of a real
//! limiterd: a `cost` flagged `record` is counted whatever the limits hold (the check-then-
//! charge pattern leaks nothing), in memory, on Redis and leased; answers against a lease
//! describe the key's budget; the caller's `time` decides in memory and is checked everywhere;
//! `current` is what is in use.

use limiter_testkit::redis_server;

use crate::support::windows::{DAY_MS, in_one_window};
use crate::support::{Client, Counting, Daemon, temp_file};
use serde_json::{Value, json};

const TOKENS: &str = "[policies.tokens]\n\
    limits = [{ algorithm = \"fixed_window\", count = 10000, period = \"1d\" }]\n\
    [policies.bucket]\n\
    limits = [{ algorithm = \"token_bucket\", count = 1000, period = \"1h\" }]\n";

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Where [`check_then_charge`] counts.
#[derive(Clone, Copy)]
enum Store {
    Memory,
    Redis,
    /// On Redis, with leases of 1% of the quota.
    Leased,
}

/// Check, charge, check, charge past the limit, check: the second charge is recorded, and every
/// check after it is refused, on a fresh daemon (and Redis) counting on `store`. `TOKENS` is a
/// window of a day: a run that failed across midnight UTC runs again.
async fn check_then_charge(store: Store) {
    let counting = Counting::new(matches!(store, Store::Redis | Store::Leased));
    let (text, name) = match store {
        Store::Leased => (
            format!("{TOKENS}lease_slack = \"1%\"\n").replace(
                "[policies.bucket]",
                "lease_slack = \"1%\"\n[policies.bucket]",
            ),
            "usage-leased",
        ),
        Store::Redis | Store::Memory => (TOKENS.to_owned(), "usage"),
    };
    let config = temp_file(&counting.file_name(name, "toml"), &text);
    let mut args = vec!["--config", config.to_str().expect("UTF-8")];
    args.extend(counting.args());
    // Leased, the charges are larger than any lease: Redis records what the lease does not cover.
    let source = if counting.server.is_some() {
        "redis"
    } else {
        "memory"
    };
    let policy = "tokens";
    let daemon = Daemon::start(&args);
    let mut client = Client::connect(daemon.addr).await;
    let ask = |cost: u64, record: bool| json!({"policy": policy, "identifier": "team", "cost": cost, "record": record});
    let check = client.decide(ask(0, false)).await;
    assert_eq!(
        (check["success"].clone(), check["current"].clone()),
        (json!(true), json!(0))
    );
    let first = client.decide(ask(6_000, true)).await;
    assert_eq!(first["success"], true, "{first}");
    assert_eq!(first["current"], 6_000, "{first}");
    let check = client.decide(ask(0, false)).await;
    assert_eq!(check["remaining"], 4_000, "{check}");
    let second = client.decide(ask(6_000, true)).await;
    assert_eq!(
        second["success"], false,
        "the second charge goes over: {second}"
    );
    assert_eq!(second["source"], source, "{second}");
    assert!(
        second["retry_after_ms"].as_u64().expect("a wait") > 0,
        "{second}"
    );
    for _ in 0..3 {
        let check = client.decide(ask(0, false)).await;
        assert_eq!(check["success"], false, "the quota leaked: {check}");
        assert_eq!(check["remaining"], 0, "{check}");
        assert_eq!(check["current"], 10_000, "{check}");
    }
    let request = client.decide(ask(1, false)).await;
    assert_eq!(request["success"], false, "{request}");
}

#[tokio::test]
async fn recorded_usage_never_leaks_the_quota_in_memory() {
    in_one_window(DAY_MS, || check_then_charge(Store::Memory)).await;
}

#[tokio::test]
async fn recorded_usage_never_leaks_the_quota_on_redis() {
    in_one_window(DAY_MS, || check_then_charge(Store::Redis)).await;
}

#[tokio::test]
async fn recorded_usage_never_leaks_the_quota_leased() {
    in_one_window(DAY_MS, || check_then_charge(Store::Leased)).await;
}

/// Answers made against a lease describe the key's budget as the last Redis answer knew it:
/// `remaining` counts down by one per call (Redis's remaining plus what the lease holds), and
/// `reset_at_ms` is one instant, a full bucket's worth ahead at most.
#[tokio::test]
async fn leased_answers_report_the_keys_budget_and_its_reset() {
    let server = redis_server::RedisServer::start();
    let text = TOKENS.replace(
        "period = \"1h\" }]\n",
        "period = \"1h\" }]\nlease_slack = \"10%\"\n",
    );
    let config = temp_file(&format!("usage-honest-{}.toml", server.port), &text);
    let daemon = Daemon::start(&[
        "--config",
        config.to_str().expect("UTF-8"),
        "--redis",
        &server.url(),
    ]);
    let mut client = Client::connect(daemon.addr).await;
    let mut answers: Vec<Value> = Vec::new();
    for _ in 0..40 {
        answers.push(
            client
                .decide(json!({"policy": "bucket", "identifier": "k"}))
                .await,
        );
    }
    let leased: Vec<&Value> = answers.iter().filter(|a| a["source"] == "lease").collect();
    assert!(
        leased.len() > 30,
        "most answers are local: {}",
        leased.len()
    );
    for (n, answer) in answers.iter().enumerate() {
        assert_eq!(answer["success"], true, "{answer}");
        // Call n leaves 1000 - (n + 1) of the key's budget, wherever it was decided.
        assert_eq!(
            answer["remaining"],
            1_000 - (n as u64 + 1),
            "call {n}: {answer}"
        );
        assert_eq!(answer["current"], n as u64 + 1, "call {n}: {answer}");
    }
    let now = unix_ms();
    for answer in &leased {
        let reset = answer["reset_at_ms"].as_u64().expect("a number");
        // 3.6 s a token: the bucket is full again within (taken + leased) tokens' time.
        assert!(reset > now && reset <= now + 1_000 * 3_600, "{answer}");
    }
    let resets: std::collections::BTreeSet<u64> = leased
        .iter()
        .map(|a| a["reset_at_ms"].as_u64().expect("a number"))
        .collect();
    // One lease's answers share one reset instant (each renewal may move it, by what it took).
    assert!(resets.len() <= 3, "{resets:?}");
}

/// A request's `time` decides in memory: a fixed window's count at a past instant is that
/// window's. A time before the process's clock starts, or far ahead of it, is a 400 naming
/// `time`; one a little ahead is decided now.
#[tokio::test]
async fn the_callers_time_decides_in_memory_and_is_checked() {
    let config = temp_file(
        "usage-time.toml",
        "[policies.minute]\nlimits = [{ algorithm = \"fixed_window\", count = 2, period = \"1m\" }]\n",
    );
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);
    let mut client = Client::connect(daemon.addr).await;
    let now = unix_ms();
    // Two minutes ago (when the process ran too: it counts from the start of this week, unless
    // the test runs in a week's first two minutes).
    let past = now - 120_000;
    let this_window_end = (now / 60_000 + 1) * 60_000;
    let past_window_end = (past / 60_000 + 1) * 60_000;
    for remaining in [1, 0] {
        let d = client
            .decide(json!({"policy": "minute", "identifier": "u", "time": past}))
            .await;
        assert_eq!(
            (d["success"].clone(), d["remaining"].clone()),
            (json!(true), json!(remaining)),
            "{d}"
        );
        assert_eq!(
            d["reset_at_ms"], past_window_end,
            "the past window's end, exactly: {d}"
        );
    }
    // A later request at `now` finds a window of its own.
    let d = client
        .decide(json!({"policy": "minute", "identifier": "u"}))
        .await;
    assert_eq!(d["remaining"], 1, "{d}");
    if now / 60_000 == unix_ms() / 60_000 {
        assert_eq!(d["reset_at_ms"], this_window_end, "{d}");
    }
    // A little ahead (a client's clock running fast): decided now.
    let d = client
        .decide(json!({"policy": "minute", "identifier": "v", "time": unix_ms() + 2_000}))
        .await;
    assert_eq!(d["success"], true, "{d}");
    for (time, says) in [
        (unix_ms() + 3_600_000, "ahead of this server's clock"),
        (1_000, "where this server's clock starts"),
    ] {
        let (status, body) = client
            .post(
                "/v1/ratelimit",
                &json!({"policy": "minute", "identifier": "u", "time": time}),
            )
            .await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["field"], "time", "{body}");
        let message = body["error"]["message"].as_str().expect("a message");
        assert!(message.contains(says), "{message}");
    }
    // A batch is decided at one instant: two times are refused, naming the second.
    let (status, body) = client
        .post(
            "/v1/ratelimit/many",
            &json!({"requests": [
                {"policy": "minute", "identifier": "a", "time": now},
                {"policy": "minute", "identifier": "b", "time": now - 1}
            ]}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["field"].clone()),
        (400, json!("requests[1].time")),
        "{body}"
    );
}

/// On Redis, Redis's clock decides: a past `time` is checked and changes nothing.
#[tokio::test]
async fn on_redis_the_callers_time_is_checked_and_redis_decides() {
    let server = redis_server::RedisServer::start();
    let config = temp_file(
        &format!("usage-time-redis-{}.toml", server.port),
        "[policies.minute]\nlimits = [{ algorithm = \"fixed_window\", count = 2, period = \"1m\" }]\n",
    );
    let daemon = Daemon::start(&[
        "--config",
        config.to_str().expect("UTF-8"),
        "--redis",
        &server.url(),
    ]);
    let mut client = Client::connect(daemon.addr).await;
    let now = unix_ms();
    let d = client
        .decide(json!({"policy": "minute", "identifier": "u", "time": now - 120_000}))
        .await;
    let window_end = d["reset_at_ms"].as_u64().expect("a number");
    assert_eq!(window_end % 60_000, 0, "a window's end, exactly: {d}");
    assert!(
        window_end > now,
        "decided in Redis's current window, not the past one: {d}"
    );
    let (status, body) = client
        .post(
            "/v1/ratelimit",
            &json!({"policy": "minute", "identifier": "u", "time": now + 3_600_000}),
        )
        .await;
    assert_eq!(
        (status, body["error"]["field"].clone()),
        (400, json!("time")),
        "{body}"
    );
}

/// An error a batch's decision finds (not its parser) names the request at fault as the
/// parser does (`requests[1].cost`), in memory and on Redis alike; a single ask names the
/// field alone.
#[tokio::test]
async fn a_batch_names_the_request_its_decision_refuses() {
    let server = redis_server::RedisServer::start();
    let config = temp_file(
        &format!("usage-batch-fields-{}.toml", server.port),
        "[policies.small]\n\
         limits = [{ algorithm = \"token_bucket\", count = 2, period = \"1h\" }]\n\
         [policies.jobs]\n\
         limits = [{ algorithm = \"concurrency\", count = 1, ttl = \"1m\" }]\n",
    );
    let config = config.to_str().expect("UTF-8");
    let url = server.url();
    let fits = json!({"policy": "small", "identifier": "a", "cost": 1});
    let too_big = json!({"policy": "small", "identifier": "b", "cost": 3});
    let jobs = json!({"policy": "jobs", "identifier": "c"});
    // Refused when its shape is resolved, after the body was read: more than a sliding
    // window counts.
    let uncountable = json!({"namespace": "n", "identifier": "d", "limit": 50_000_000_000_u64,
        "duration_ms": 1000, "algorithm": "sliding_window"});
    let cases = [
        (vec![fits.clone(), too_big.clone()], "requests[1].cost"),
        (vec![too_big.clone()], "requests[0].cost"),
        (vec![too_big.clone(), fits.clone()], "requests[0].cost"),
        (
            vec![fits.clone(), fits.clone(), jobs.clone()],
            "requests[2].policy",
        ),
        (vec![fits.clone(), uncountable.clone()], "requests[1].limit"),
        (vec![uncountable.clone(), fits.clone()], "requests[0].limit"),
    ];
    for args in [
        vec!["--config", config],
        vec!["--config", config, "--redis", url.as_str()],
    ] {
        let daemon = Daemon::start(&args);
        let mut client = Client::connect(daemon.addr).await;
        for (requests, field) in &cases {
            let (status, body) = client
                .post("/v1/ratelimit/many", &json!({ "requests": requests }))
                .await;
            assert_eq!(
                (status, body["error"]["field"].as_str()),
                (400, Some(*field)),
                "{args:?} {requests:?}: {body}"
            );
        }
        let (status, body) = client.post("/v1/ratelimit", &too_big).await;
        assert_eq!(
            (status, body["error"]["field"].as_str()),
            (400, Some("cost")),
            "{body}"
        );
        // Nothing was taken by a refused batch.
        assert_eq!(client.decide(fits.clone()).await["remaining"], 1);
    }
}

/// A cost no limit of a policy can ever admit is refused in the caller's terms: the burst it
/// is above and how that limit counts (not the stack's layer and index, which number neither
/// a concurrency limit nor the policy's order), with both ways out; alike on both stores.
#[tokio::test]
async fn a_cost_above_a_burst_is_refused_naming_the_burst_and_how_it_counts() {
    let server = redis_server::RedisServer::start();
    let config = temp_file(
        &format!("usage-cost-words-{}.toml", server.port),
        "[policies.exports]\n\
         limits = [\n\
           { algorithm = \"concurrency\", count = 2, ttl = \"1m\" },\n\
           { algorithm = \"fixed_window\", count = 10, period = \"1h\" },\n\
           { algorithm = \"token_bucket\", count = 5, period = \"1h\", key = \"global\" },\n\
         ]\n",
    );
    let config = config.to_str().expect("UTF-8");
    let url = server.url();
    for args in [
        vec!["--config", config],
        vec!["--config", config, "--redis", url.as_str()],
    ] {
        let daemon = Daemon::start(&args);
        let mut client = Client::connect(daemon.addr).await;
        for (cost, words, most) in [
            (
                11,
                "`cost` 11 is above the burst of 10 of a limit of the policy counted per identifier",
                10,
            ),
            (
                7,
                "`cost` 7 is above the burst of 5 of a limit of the policy counted for every \
                 identifier together",
                5,
            ),
        ] {
            let ask = json!({"policy": "exports", "identifier": "a", "cost": cost});
            let (status, body) = client.post("/v1/ratelimit", &ask).await;
            let message = body["error"]["message"].as_str().unwrap_or("");
            assert_eq!(status, 400, "{args:?}: {body}");
            assert_eq!(body["error"]["field"], "cost", "{body}");
            assert!(message.starts_with(words), "{args:?}: {message}");
            assert!(
                message.contains(&format!("parts of at most {most} units")),
                "{message}"
            );
            assert!(message.contains("\"record\": true"), "{message}");
            assert!(!message.contains("layer"), "{message}");
        }
    }
}

/// The service reads Unix time from the OS's clock, which NTP keeps at the system clock's
/// rate, not from the counter, whose rate is a calibration's (see `limiterd::ServiceClock`).
#[test]
fn the_service_reads_unix_time_from_the_os_clock() {
    use limiter_core::{Clock, TscClock, unix_origin};
    let clock = limiterd::ServiceClock::new();
    let origin = unix_origin(&clock);
    let (before, reading, after) = (unix_ms(), clock.now(), unix_ms());
    let unix_ms_read = (origin + reading) / 1_000_000;
    // Within a millisecond of the wall clock read around it (the two start aligned).
    assert!(unix_ms_read + 1 >= before && unix_ms_read <= after + 1);
    assert_ne!(
        std::any::type_name::<limiterd::ServiceClock>(),
        std::any::type_name::<TscClock>()
    );
}
