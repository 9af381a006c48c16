//! limiterd as users run it: the binary started as a process on a free loopback port, driven
//! by a real HTTP client (hyper, keep-alive). The limits used either never refill within a
//! test (buckets per hour, per minute) or are checked after a refund at the same instant, so
//! the counts are exact without sleeping; the fixed windows counted are counted within one
//! window (a run that failed across a boundary runs again: `support/windows.rs`).

use limiter_testkit::redis_server;

use crate::support::windows::{MINUTE_MS, in_one_window};
use crate::support::{Client, Counting, Daemon, temp_file};
use serde_json::json;

#[tokio::test]
async fn serves_the_built_in_policies_exactly() {
    let daemon = Daemon::start(&[]);
    let mut client = Client::connect(daemon.addr).await;

    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    let first = client
        .decide(json!({"policy": "api", "identifier": "u1"}))
        .await;
    assert_eq!(first["success"], true);
    assert_eq!(first["limit"], 20);
    assert_eq!(first["remaining"], 19);
    assert_eq!(first["retry_after_ms"], 0);
    assert_eq!(first["source"], "memory");
    let reset = first["reset_at_ms"].as_u64().expect("a number");
    // Full again when the slowest limit is: the hour's sliding window, up to two windows.
    assert!(
        reset > before && reset <= before + 2 * 3_600_000 + 1_000,
        "{first}"
    );

    // 5 logins per minute: the sixth is denied with a wait, and a peek changes nothing.
    for n in 1..=5 {
        let d = client
            .decide(json!({"policy": "login", "identifier": "u1"}))
            .await;
        assert_eq!(d["success"], true);
        assert_eq!(d["remaining"], 5 - n);
    }
    let denied = client
        .decide(json!({"policy": "login", "identifier": "u1"}))
        .await;
    assert_eq!(denied["success"], false);
    let wait = denied["retry_after_ms"].as_u64().expect("a number");
    assert!(wait > 0 && wait <= 60_000, "{denied}");
    let peek = client
        .decide(json!({"policy": "login", "identifier": "u2", "cost": 0}))
        .await;
    assert_eq!(
        (peek["success"].clone(), peek["remaining"].clone()),
        (json!(true), json!(5))
    );
    let peek = client
        .decide(json!({"policy": "login", "identifier": "u2", "cost": 0}))
        .await;
    assert_eq!(peek["remaining"], 5, "a peek takes nothing");

    // Ad-hoc limits, kept apart by namespace.
    let adhoc = |ns: &str| json!({"namespace": ns, "identifier": "u1", "limit": 2, "duration_ms": 3_600_000});
    assert_eq!(client.decide(adhoc("mail")).await["success"], true);
    assert_eq!(client.decide(adhoc("mail")).await["success"], true);
    assert_eq!(client.decide(adhoc("mail")).await["success"], false);
    assert_eq!(client.decide(adhoc("sms")).await["success"], true);

    let (status, health) = client.send("GET", "/healthz", "").await;
    assert_eq!((status, health.as_str()), (200, "ok\n"));
    let (status, metrics) = client.send("GET", "/metrics", "").await;
    assert_eq!(status, 200);
    for line in [
        // The two peeks took nothing: counted apart, not as allowed.
        "limiterd_decisions_total{policy=\"login\",result=\"allowed\"} 5",
        "limiterd_decisions_total{policy=\"login\",result=\"peeked\"} 2",
        "limiterd_decisions_total{policy=\"login\",result=\"denied\"} 1",
        "limiterd_decisions_total{policy=\"(ad hoc)\",result=\"denied\"} 1",
        "limiterd_request_duration_seconds_count 13",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
    assert!(metrics.contains("limiterd_store_keys "), "{metrics}");
}

/// Logins: a token bucket of 5 per hour, which refills nothing within a test
/// (`process_edges.rs` checks it as a file too).
pub(crate) const LOGIN: &str =
    "[policies.login]\nlimits = [{ algorithm = \"token_bucket\", count = 5, period = \"1h\" }]\n";

#[tokio::test]
async fn a_batch_is_all_or_nothing_in_memory() {
    let config = temp_file("batch-memory.toml", LOGIN);
    batch_is_all_or_nothing(&["--config", config.to_str().expect("UTF-8 path")]).await;
}

#[tokio::test]
async fn a_batch_is_all_or_nothing_on_redis() {
    let server = redis_server::RedisServer::start();
    let config = temp_file(&format!("batch-redis-{}.toml", server.port), LOGIN);
    let url = server.url();
    batch_is_all_or_nothing(&[
        "--config",
        config.to_str().expect("UTF-8 path"),
        "--redis",
        &url,
    ])
    .await;
}

#[tokio::test]
async fn an_ad_hoc_limit_changed_by_its_caller_keeps_the_consumption_in_memory() {
    ad_hoc_limit_changes_keep_consumption(&[]).await;
}

#[tokio::test]
async fn an_ad_hoc_limit_changed_by_its_caller_keeps_the_consumption_on_redis() {
    let server = redis_server::RedisServer::start();
    ad_hoc_limit_changes_keep_consumption(&["--redis", &server.url()]).await;
}

/// The counter is the caller's namespace and identifier, not the limit it sends: 5 of 10
/// taken is 10 of 20 when it sends 20 (10 left, not a fresh 20), and back to 10 it is still
/// spent; in a batch, the second shape sees what the first took.
async fn ad_hoc_limit_changes_keep_consumption(args: &[&str]) {
    let daemon = Daemon::start(args);
    let mut client = Client::connect(daemon.addr).await;
    let ad_hoc = |id: &str, limit: u64, cost: u64| json!({"namespace": "mail", "identifier": id, "limit": limit, "duration_ms": 3_600_000, "cost": cost});
    for _ in 0..5 {
        assert_eq!(client.decide(ad_hoc("u", 10, 1)).await["success"], true);
    }
    let raised = client.decide(ad_hoc("u", 20, 0)).await;
    assert_eq!(
        (&raised["limit"], &raised["remaining"]),
        (&json!(20), &json!(10)),
        "{raised}"
    );
    let spent = client.decide(ad_hoc("u", 20, 10)).await;
    assert_eq!(spent["success"], true, "{spent}");
    let back = client.decide(ad_hoc("u", 10, 1)).await;
    assert_eq!(back["success"], false, "20 of 20 is 10 of 10: {back}");
    assert_eq!(client.decide(ad_hoc("u", 40, 0)).await["remaining"], 0);
    // Another identifier, and the same one in another namespace, are untouched.
    assert_eq!(client.decide(ad_hoc("v", 20, 0)).await["remaining"], 20);
    // One batch, two shapes of one identifier: 3 of 6 under the first is 6 of 12 under the
    // second, which then has 6 left for its 6.
    let (status, batch) = client
        .post(
            "/v1/ratelimit/many",
            &json!({"requests": [ad_hoc("w", 6, 3), ad_hoc("w", 12, 6)]}),
        )
        .await;
    assert_eq!(status, 200, "{batch}");
    assert_eq!(batch["success"], true, "{batch}");
    assert_eq!(batch["results"][1]["remaining"], 0, "{batch}");
    assert_eq!(client.decide(ad_hoc("w", 6, 0)).await["remaining"], 0);
}

/// The same batches and the same answers, whatever the store: a denied batch takes nothing,
/// its admitted items report what they hold, the same identifier twice counts twice.
async fn batch_is_all_or_nothing(args: &[&str]) {
    let daemon = Daemon::start(args);
    let mut client = Client::connect(daemon.addr).await;
    let login = |id: &str, cost: u64| json!({"policy": "login", "identifier": id, "cost": cost});
    let (status, ok) = client
        .post(
            "/v1/ratelimit/many",
            &json!({"requests": [login("a", 3), login("b", 1)]}),
        )
        .await;
    assert_eq!(status, 200, "{ok}");
    assert_eq!(ok["success"], true);
    assert_eq!(ok["results"][0]["remaining"], 2);
    assert_eq!(ok["results"][1]["remaining"], 4);
    // `a` has 2 left: the batch is denied as a whole and `b` keeps its 4.
    let (_, denied) = client
        .post(
            "/v1/ratelimit/many",
            &json!({"requests": [login("b", 1), login("a", 3)]}),
        )
        .await;
    assert_eq!(denied["success"], false, "{denied}");
    assert_eq!(denied["results"][0]["success"], true, "{denied}");
    assert_eq!(
        denied["results"][0]["remaining"], 4,
        "b reports what it holds: {denied}"
    );
    assert_eq!(denied["results"][1]["success"], false);
    assert!(
        denied["results"][1]["retry_after_ms"]
            .as_u64()
            .expect("a number")
            > 0
    );
    let peek = client.decide(login("b", 0)).await;
    assert_eq!(peek["remaining"], 4, "the denied batch took nothing from b");
    let peek = client.decide(login("a", 0)).await;
    assert_eq!(peek["remaining"], 2);
    // The same identifier twice: 3 + 3 of c's 5 is over, and c keeps all 5.
    let (_, twice) = client
        .post(
            "/v1/ratelimit/many",
            &json!({"requests": [login("c", 3), login("c", 3)]}),
        )
        .await;
    assert_eq!(twice["success"], false, "{twice}");
    assert_eq!(twice["results"][0]["remaining"], 5, "{twice}");
    assert_eq!(twice["results"][1]["remaining"], 2, "{twice}");
    let (_, fits) = client
        .post(
            "/v1/ratelimit/many",
            &json!({"requests": [login("c", 3), login("c", 2)]}),
        )
        .await;
    assert_eq!(fits["success"], true, "{fits}");
    assert_eq!(client.decide(login("c", 0)).await["remaining"], 0);
    // Counted as they took: 4 units taken, 2 denials, 2 items admitted by their limits in
    // refused batches (nothing taken), 3 peeks.
    let (_, metrics) = client.send("GET", "/metrics", "").await;
    for (result, n) in [
        ("allowed", 4),
        ("denied", 2),
        ("batch_refused", 2),
        ("peeked", 3),
    ] {
        let line = format!("limiterd_decisions_total{{policy=\"login\",result=\"{result}\"}} {n}");
        assert!(metrics.contains(&line), "{line} in:\n{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_on_one_redis_admit_exactly_the_limit() {
    let server = redis_server::RedisServer::start();
    let config = temp_file(
        &format!("redis-{}.toml", server.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\non_failure = \"closed\"\n\n\
             [policies.shared]\nlimits = [{{ algorithm = \"token_bucket\", count = 50, period = \"1h\" }}]\n",
            server.url()
        ),
    );
    let config = config.to_str().expect("UTF-8 path").to_owned();
    let first = Daemon::start(&["--config", &config]);
    // The second takes the same file's policies and is pointed at Redis by the flag.
    let policies = temp_file(
        "shared-memory.toml",
        "[policies.shared]\nlimits = [{ algorithm = \"token_bucket\", count = 50, period = \"1h\" }]\n",
    );
    let second = Daemon::start(&[
        "--config",
        policies.to_str().expect("UTF-8 path"),
        "--redis",
        &server.url(),
    ]);
    let mut tasks = Vec::new();
    for addr in [first.addr, second.addr, first.addr, second.addr] {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(addr).await;
            let mut admitted = 0;
            for _ in 0..30 {
                let d = client
                    .decide(json!({"policy": "shared", "identifier": "everyone"}))
                    .await;
                // Denials may come from the deny cache; every admission is Redis's.
                let source = d["source"].as_str().expect("a source");
                assert!(
                    source == "redis" || (source == "deny_cache" && d["success"] == false),
                    "{d}"
                );
                admitted += u32::from(d["success"] == true);
            }
            admitted
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("task");
    }
    assert_eq!(
        total, 50,
        "120 calls through two processes admit exactly the shared 50"
    );
}

/// A policy switched to leased mode with one option (`lease_slack`): two processes decide
/// most calls locally, and together stay within the limit and its slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leased_processes_stay_within_the_limit_and_its_slack() {
    let server = redis_server::RedisServer::start();
    let config = temp_file(
        &format!("leased-{}.toml", server.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 1000\non_failure = \"closed\"\n\n\
             [policies.shared]\nlimits = [{{ algorithm = \"token_bucket\", count = 200, period = \"1h\" }}]\n\
             lease_slack = \"10%\"\n",
            server.url()
        ),
    );
    let config = config.to_str().expect("UTF-8 path").to_owned();
    let first = Daemon::start(&["--config", &config]);
    let second = Daemon::start(&["--config", &config]);
    let mut tasks = Vec::new();
    for addr in [first.addr, second.addr, first.addr, second.addr] {
        tasks.push(tokio::spawn(async move {
            let mut client = Client::connect(addr).await;
            let (mut admitted, mut local) = (0, 0);
            for _ in 0..80 {
                let d = client
                    .decide(json!({"policy": "shared", "identifier": "everyone"}))
                    .await;
                let source = d["source"].as_str().expect("a source");
                assert!(source == "redis" || source == "lease", "{d}");
                admitted += u32::from(d["success"] == true);
                local += u32::from(source == "lease");
            }
            (admitted, local)
        }));
    }
    let (mut total, mut local) = (0, 0);
    for task in tasks {
        let (a, l) = task.await.expect("task");
        total += a;
        local += l;
    }
    // Every admitted unit came from Redis's 200 (nothing refills to speak of in an hour's
    // limit); at most the slack (20) sat unspent in leases when the calls ended.
    assert!((180..=220).contains(&total), "{total} admitted");
    assert!(local > 160, "{local} of 320 decisions made locally");
    println!("leased: {total} admitted, {local} of 320 decided locally");
    let (code, text) = Client::connect(first.addr)
        .await
        .send("GET", "/debug/config", "")
        .await;
    assert_eq!(code, 200, "{text}");
    let status: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        status["policies"]["shared"]["lease"]["slack"], "10% of each burst",
        "{status}"
    );
}

/// Operators read what changes on stderr: `--log-json` writes one JSON object per line (the
/// start, and the Redis circuit breaker opening when Redis dies), stdout keeps the banner; a
/// bad `--log-level` is refused naming the flag.
const ALIGNED: &str = r#"
[policies.daily]
limits = [{ algorithm = "fixed_window", count = 3, period = "1d" }]
[policies.minutely]
limits = [{ algorithm = "fixed_window", count = 3, period = "1m" }]
[policies.sliding]
limits = [{ algorithm = "sliding_window", count = 3, period = "1h" }]
"#;

// A run counts three calls and a denial in one window of a minute: one that failed across a
// minute's boundary runs again (on a fresh daemon and Redis).
#[tokio::test]
async fn windows_are_aligned_to_the_unix_epoch_in_memory() {
    in_one_window(MINUTE_MS, || windows_are_aligned_to_the_unix_epoch(false)).await;
}

#[tokio::test]
async fn windows_are_aligned_to_the_unix_epoch_on_redis() {
    in_one_window(MINUTE_MS, || windows_are_aligned_to_the_unix_epoch(true)).await;
}

/// A day's fixed window resets at the next 00:00 UTC and a minute's on the minute, whichever
/// store counts (memory, or a Redis of its own), and `reset_at_ms` is the same instant, to the
/// millisecond, for every call in the window. (A process counting from its own start would
/// reset a day after it started.)
async fn windows_are_aligned_to_the_unix_epoch(on_redis: bool) {
    let counting = Counting::new(on_redis);
    let config = temp_file(&counting.file_name("aligned", "toml"), ALIGNED);
    let mut args = vec!["--config", config.to_str().expect("UTF-8 path")];
    args.extend(counting.args());
    let daemon = Daemon::start(&args);
    let mut client = Client::connect(daemon.addr).await;
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_millis() as u64
    };
    // Exactly: `reset_at_ms` is counted from the instant the store decided, so a window's
    // answers all name its end, to the millisecond.
    let near = |got: u64, want: u64| got == want;
    for (policy, period_ms) in [("daily", 86_400_000u64), ("minutely", 60_000)] {
        let mut resets = Vec::new();
        for n in 0..3u64 {
            let before = unix_ms();
            let d = client
                .decide(json!({"policy": policy, "identifier": "u"}))
                .await;
            let after = unix_ms();
            assert_eq!(
                (d["success"].clone(), d["remaining"].clone()),
                (json!(true), json!(2 - n))
            );
            let reset = d["reset_at_ms"].as_u64().expect("a number");
            // The window the call fell in ends at the next multiple of the period (a call
            // straddling a boundary may see either).
            let ends = [before / period_ms + 1, after / period_ms + 1].map(|w| w * period_ms);
            assert!(
                ends.iter().any(|&end| near(reset, end)),
                "{policy}: reset_at_ms {reset}, windows end at {ends:?}: {d}"
            );
            resets.push(reset);
        }
        let denied = client
            .decide(json!({"policy": policy, "identifier": "u"}))
            .await;
        assert_eq!(denied["success"], false, "{denied}");
        if policy == "daily" {
            // No boundary in a test's span (unless run at midnight): one instant throughout.
            assert!(resets.windows(2).all(|w| near(w[0], w[1])), "{resets:?}");
            let retry = denied["retry_after_ms"].as_u64().expect("a number");
            let left_today = period_ms - unix_ms() % period_ms;
            assert!(
                retry.abs_diff(left_today) <= 1_000,
                "{retry} vs {left_today}: {denied}"
            );
        }
    }
}
