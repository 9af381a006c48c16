//! A store failure as an operator meets it: a key on Redis holding what limiterd did not
//! write, under `on_failure = "open"`, admits the call without counting it, and the log names
//! the key, at most one line every ten seconds (with how many were left out), where before
//! only a counter moved; under `on_failure = "fallback"` the same for every part that falls
//! back (the stack, a calendar quota, permits); and a gauge read from the store at a scrape.

use limiter_testkit::redis_server::RedisServer;
use redis::Commands;

use crate::support::{Daemon, temp_file};
use serde_json::json;

#[tokio::test]
async fn a_key_limiterd_did_not_write_is_named_in_a_paced_warning_when_the_policy_fails_open() {
    let redis = RedisServer::start();
    let file = temp_file(
        &format!("fail-open-{}.toml", redis.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\non_failure = \"open\"\n\
             [policies.api]\nlimits = [{{ algorithm = \"token_bucket\", count = 5, period = \"1h\" }}]\n",
            redis.url()
        ),
    );
    let daemon = Daemon::start_recorded(&["--config", file.to_str().expect("UTF-8")], &[]);
    let mut client = crate::support::Client::connect(daemon.addr).await;
    let ask = json!({"policy": "api", "identifier": "spoilt"});
    let first = client.decide(ask.clone()).await;
    assert_eq!(first["source"], "redis", "{first}");
    let mut conn = redis.client();
    let keys: Vec<String> = conn.keys("limiterd:*spoilt*").expect("KEYS");
    let [key] = keys.as_slice() else {
        panic!("one key for the identifier: {keys:?}");
    };
    let _: () = conn.set(key, "not a state").expect("SET");
    for _ in 0..3 {
        let answer = client.decide(ask.clone()).await;
        assert_eq!(
            (answer["success"].clone(), answer["source"].clone()),
            (json!(true), json!("fail_open")),
            "{answer}"
        );
    }
    let output = daemon.wait_for_output(key.as_str());
    let warnings: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("a store call failed"))
        .collect();
    assert_eq!(warnings.len(), 1, "paced, not one a call:\n{output}");
    assert!(warnings[0].contains(key.as_str()), "{output}");
    let held: String = conn.get(key).expect("GET");
    assert_eq!(held, "not a state", "left as found");
}

/// Under `on_failure = "fallback"`, a policy of `limit` (one limit, its key spoilt after the
/// first call) decides `calls` more calls on this node's stand-in: each admitted, each counted
/// as the fallback's answer, and the log names the spoilt key once (paced). Every part that can
/// fall back does this: the stack, a calendar quota and permits, whether the call takes or
/// only reads (`cost`).
async fn a_fallback_names_the_spoilt_key(limit: &str, cost: u64) {
    let redis = RedisServer::start();
    let file = temp_file(
        &format!("fallback-{}.toml", redis.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\non_failure = \"fallback\"\nfleet_size = 1\n\
             [policies.api]\nlimits = [{limit}]\n",
            redis.url()
        ),
    );
    let daemon = Daemon::start_recorded(&["--config", file.to_str().expect("UTF-8")], &[]);
    let mut client = crate::support::Client::connect(daemon.addr).await;
    let ask = json!({"policy": "api", "identifier": "spoilt", "cost": cost});
    let first = client
        .decide(json!({"policy": "api", "identifier": "spoilt"}))
        .await;
    assert_eq!(first["success"], true, "{limit}: {first}");
    let mut conn = redis.client();
    let keys: Vec<String> = conn.keys("limiterd:*spoilt*").expect("KEYS");
    let [key] = keys.as_slice() else {
        panic!("{limit}: one key for the identifier: {keys:?}");
    };
    let _: () = conn.set(key, "not a state").expect("SET");
    let calls = 3;
    for _ in 0..calls {
        let answer = client.decide(ask.clone()).await;
        assert_eq!(answer["success"], true, "{limit}: {answer}");
        assert_eq!(answer["source"], "fallback", "{limit}: {answer}");
    }
    let output = daemon.wait_for_output(key.as_str());
    let warnings: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("a store call failed"))
        .collect();
    assert_eq!(warnings.len(), 1, "{limit}: paced:\n{output}");
    assert!(warnings[0].contains(key.as_str()), "{limit}: {output}");
    let (_, metrics) = client.send("GET", "/metrics", "").await;
    let counted = |name: &str| {
        metrics
            .lines()
            .find(|line| line.starts_with(name))
            .and_then(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
    };
    assert_eq!(
        counted("limiterd_failure_policy_total{policy=\"fallback\"}"),
        Some(calls),
        "{limit}: each call the fallback answered counted:\n{metrics}"
    );
    assert_eq!(
        counted("limiterd_backend_errors_total"),
        Some(calls),
        "{limit}: {metrics}"
    );
}

#[tokio::test]
async fn a_fallback_names_the_key_that_sent_each_part_there() {
    let bucket = "{ algorithm = \"token_bucket\", count = 100, period = \"1h\" }";
    let quota =
        "{ algorithm = \"fixed_window\", count = 100, period = \"1mo\", calendar = \"UTC\" }";
    let permits = "{ algorithm = \"concurrency\", count = 100, ttl = \"30s\" }";
    for limit in [bucket, quota, permits] {
        a_fallback_names_the_spoilt_key(limit, 1).await;
    }
    // A call that takes nothing reads each part's state: a quota's and the permits' fall back
    // too.
    for limit in [quota, permits] {
        a_fallback_names_the_spoilt_key(limit, 0).await;
    }
}

/// A bounded store that is full refuses new identifiers (503 `store_full`), each counted, and
/// says so in the log once every ten seconds, not once a refusal: a flood of new identifiers
/// is what fills a store.
#[tokio::test]
async fn a_full_store_is_counted_per_refusal_and_logged_paced() {
    let file = temp_file(
        "full-store.toml",
        "[store]\nkind = \"memory\"\nmax_keys = 2\n\
         [policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 5, period = \"1h\" }]\n",
    );
    let daemon = Daemon::start_recorded(&["--config", file.to_str().expect("UTF-8")], &[]);
    let mut client = crate::support::Client::connect(daemon.addr).await;
    for identifier in ["a", "b"] {
        let answer = client
            .decide(json!({"policy": "api", "identifier": identifier}))
            .await;
        assert_eq!(answer["success"], true, "{answer}");
    }
    let refusals = 4;
    for n in 0..refusals {
        let body = json!({"policy": "api", "identifier": format!("new-{n}")}).to_string();
        let (status, answer) = client.send("POST", "/v1/ratelimit", &body).await;
        assert_eq!(status, 503, "{answer}");
        assert!(answer.contains("store_full"), "{answer}");
    }
    let output = daemon.wait_for_output("key store is full");
    let lines = output.matches("key store is full").count();
    assert_eq!(lines, 1, "paced, not a line a refusal:\n{output}");
    let (_, metrics) = client.send("GET", "/metrics", "").await;
    assert!(
        metrics
            .lines()
            .any(|line| line == format!("limiterd_store_full_total {refusals}")),
        "{metrics}"
    );
}

/// The permits a policy holds, read at each scrape, cannot be read when their index on Redis
/// holds what limiterd did not write: the gauge leaves the policy out, each failed read is
/// counted as a store call failed, and the log names the key once (paced), where the gauge
/// used to go missing with nothing said.
#[tokio::test]
async fn a_gauge_the_store_cannot_read_is_named_in_the_log_once() {
    let redis = RedisServer::start();
    let file = temp_file(
        &format!("gauge-spoilt-{}.toml", redis.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\n\
             [policies.api]\nlimits = [{{ algorithm = \"concurrency\", count = 5, ttl = \"30s\" }}]\n",
            redis.url()
        ),
    );
    let daemon = Daemon::start_recorded(&["--config", file.to_str().expect("UTF-8")], &[]);
    let mut client = crate::support::Client::connect(daemon.addr).await;
    let held = client
        .decide(json!({"policy": "api", "identifier": "ann"}))
        .await;
    assert_eq!(held["success"], true, "{held}");
    let (_, metrics) = client.send("GET", "/metrics", "").await;
    assert!(
        metrics.contains("limiterd_permits_held{policy=\"api\"} 1"),
        "{metrics}"
    );
    let mut conn = redis.client();
    let index = "limiterd:permits:{api}";
    let kind: String = redis::cmd("TYPE")
        .arg(index)
        .query(&mut conn)
        .expect("TYPE");
    assert_eq!(kind, "zset", "the index's name as limiterd writes it");
    let _: () = conn.set(index, "not an index").expect("SET");
    let scrapes = 3;
    let mut metrics = String::new();
    for _ in 0..scrapes {
        metrics = client.send("GET", "/metrics", "").await.1;
        assert!(!metrics.contains("limiterd_permits_held{"), "{metrics}");
    }
    assert!(
        metrics
            .lines()
            .any(|line| line == format!("limiterd_backend_errors_total {scrapes}")),
        "{metrics}"
    );
    let output = daemon.wait_for_output(index);
    let warnings: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("could not be read"))
        .collect();
    assert_eq!(warnings.len(), 1, "paced, not a line a scrape:\n{output}");
    assert!(warnings[0].contains(index), "{output}");
}
