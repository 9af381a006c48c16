//! limiterd as users run it: the binary started as a process on a free loopback port, driven
//! by a real HTTP client (hyper, keep-alive). The limits used either never refill within a
//! test (per hour, per minute) or are checked after a refund at the same instant, so the
//! counts are exact without sleeping.

use limiter_testkit::redis_server;

use std::io::BufRead;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::{Client, Daemon, temp_file};
use serde_json::{Value, json};

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

/// Logins: a token bucket of 5 per hour, which refills nothing within a test.
const LOGIN: &str =
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

#[tokio::test]
async fn invalid_requests_get_clear_400s_never_500s() {
    let daemon = Daemon::start(&[]);
    let mut client = Client::connect(daemon.addr).await;
    for (body, code, field) in [
        ("{not json", "invalid_json", None),
        ("", "invalid_json", None),
        (
            r#"{"policy":"api","identifier":"u","cost":"two"}"#,
            "invalid_json",
            Some("cost"),
        ),
        (
            r#"{"policy":"api","identifier":"u","cost":184467440737095516160}"#,
            "invalid_json",
            Some("cost"),
        ),
        (
            r#"{"policy":"api","identifier":"u","cost":-3}"#,
            "invalid_json",
            Some("cost"),
        ),
        (
            r#"{"policy":"api","identifier":""}"#,
            "invalid_request",
            Some("identifier"),
        ),
        (
            r#"{"policy":"nope","identifier":"u"}"#,
            "unknown_policy",
            Some("policy"),
        ),
        (
            r#"{"policy":"api","identifier":"u","cost":21}"#,
            "invalid_request",
            Some("cost"),
        ),
        (
            r#"{"namespace":"n","identifier":"u","limit":18446744073709551615,"duration_ms":1}"#,
            "invalid_request",
            Some("limit"),
        ),
        (
            r#"{"namespace":"n","identifier":"u","limit":0,"duration_ms":1000}"#,
            "invalid_request",
            Some("limit"),
        ),
        (
            r#"{"namespace":"n","identifier":"u","limit":10,"duration_ms":0}"#,
            "invalid_request",
            Some("duration_ms"),
        ),
        (
            r#"{"namespace":"n","identifier":"u","limit":10,"duration_ms":18446744073709551615}"#,
            "invalid_request",
            Some("duration_ms"),
        ),
    ] {
        let (status, text) = client.send("POST", "/v1/ratelimit", body).await;
        assert_eq!(status, 400, "{body}: {text}");
        let value: Value = serde_json::from_str(&text).expect("a JSON error");
        assert_eq!(value["error"]["code"], code, "{body}: {text}");
        assert_eq!(value["error"]["field"].as_str(), field, "{body}: {text}");
        assert!(
            !value["error"]["message"]
                .as_str()
                .unwrap_or_default()
                .is_empty()
        );
    }
    // Limits users copy from pricing pages are admitted, not refused (each on its own
    // identifier: one identifier under several limits carries its consumption across them).
    for (limit, duration_ms) in [
        (1009, 60_000),
        (617, 1_000),
        (99_991, 3_600_000),
        (4_294_967_295_u64, 86_400_000),
    ] {
        let body = format!(
            r#"{{"namespace":"prices","identifier":"u{limit}","limit":{limit},"duration_ms":{duration_ms}}}"#
        );
        let (status, text) = client.send("POST", "/v1/ratelimit", &body).await;
        assert_eq!(status, 200, "{body}: {text}");
        let value: Value = serde_json::from_str(&text).expect("a JSON answer");
        assert_eq!(value["success"], true, "{body}: {text}");
        assert_eq!(value["remaining"], limit - 1, "{body}: {text}");
    }
    let (status, text) = client
        .send(
            "POST",
            "/v1/ratelimit/many",
            r#"{"requests":[{"policy":"api","identifier":"u","cost":"x"}]}"#,
        )
        .await;
    assert_eq!(status, 400);
    assert!(text.contains(r#""field":"requests[0].cost""#), "{text}");
    // Every refusal, whatever its status, is one JSON shape: a stable code, the field at
    // fault where there is one, and a message with the fix.
    let huge = format!(
        r#"{{"policy":"api","identifier":"{}"}}"#,
        "x".repeat(100_000)
    );
    let json_type = [("content-type", "application/json")];
    for (method, path, headers, body, status, code, field) in [
        (
            "GET",
            "/v2/nothing",
            &json_type[..],
            "",
            404,
            "not_found",
            None,
        ),
        (
            "GET",
            "/v1/ratelimit",
            &json_type[..],
            "",
            405,
            "method_not_allowed",
            None,
        ),
        (
            "DELETE",
            "/v1/ratelimit/many",
            &json_type[..],
            "",
            405,
            "method_not_allowed",
            None,
        ),
        (
            "POST",
            "/v1/ratelimit",
            &json_type[..],
            huge.as_str(),
            413,
            "body_too_large",
            None,
        ),
        (
            "POST",
            "/v1/ratelimit",
            &[("content-type", "text/plain")][..],
            r#"{"policy":"api","identifier":"u"}"#,
            415,
            "unsupported_media_type",
            None,
        ),
        (
            "POST",
            "/json",
            &[("content-type", "application/xml")][..],
            "<a/>",
            415,
            "unsupported_media_type",
            None,
        ),
        (
            "POST",
            "/v1/ratelimit",
            &json_type[..],
            r#"{"policy":"api"}"#,
            400,
            "invalid_json",
            Some("identifier"),
        ),
        (
            "POST",
            "/v1/ratelimit",
            &json_type[..],
            "[]",
            400,
            "invalid_json",
            None,
        ),
        (
            "POST",
            "/v1/ratelimit",
            &json_type[..],
            r#"[null,null,"u",null,null,null]"#,
            400,
            "invalid_json",
            None,
        ),
        (
            "POST",
            "/v1/ratelimit",
            &json_type[..],
            "42",
            400,
            "invalid_json",
            None,
        ),
        (
            "POST",
            "/v1/ratelimit/many",
            &json_type[..],
            r#"{"requests":[[]]}"#,
            400,
            "invalid_json",
            Some("requests[0]"),
        ),
        (
            "POST",
            "/v1/ratelimit/many",
            &json_type[..],
            r#"{"requests":[{"policy":"api"}]}"#,
            400,
            "invalid_json",
            Some("requests[0].identifier"),
        ),
    ] {
        let (got, text) = client.send_with(method, path, headers, body).await;
        let shown = &body[..body.len().min(60)];
        assert_eq!(got, status, "{method} {path} {shown}: {text}");
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path} {shown}: not JSON ({e}): {text:?}"));
        assert_eq!(
            value["error"]["code"], code,
            "{method} {path} {shown}: {text}"
        );
        assert_eq!(
            value["error"]["field"].as_str(),
            field,
            "{method} {path} {shown}: {text}"
        );
        let message = value["error"]["message"].as_str().unwrap_or_default();
        assert!(!message.is_empty() && !message.contains("Raw"), "{text}");
    }
    // What `curl -d` sends (a form type, or no type) is read as JSON.
    for headers in [
        &[][..],
        &[("content-type", "application/x-www-form-urlencoded")][..],
    ] {
        let (got, text) = client
            .send_with(
                "POST",
                "/v1/ratelimit",
                headers,
                r#"{"policy":"api","identifier":"curl"}"#,
            )
            .await;
        assert_eq!(got, 200, "{headers:?}: {text}");
    }
    // The service is still answering.
    assert_eq!(
        client
            .decide(json!({"policy": "api", "identifier": "after"}))
            .await["success"],
        true
    );
}

#[test]
fn check_config_explains_errors_with_line_numbers() {
    let bad = temp_file(
        "bad.toml",
        "[policies.api]\nlimits = [\n  { algorithm = \"token_bucket\", count = 10, period = \"1 second\" },\n]\n",
    );
    let out = Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .arg("check-config")
        .arg(&bad)
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "bad.toml: line 3, column 54: `period = \"1 second\"`: write a whole number with a unit"
        ),
        "{stderr}"
    );
    let example = Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .arg("example-config")
        .output()
        .expect("run");
    let good = temp_file("good.toml", &String::from_utf8_lossy(&example.stdout));
    let out = Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .arg("check-config")
        .arg(&good)
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("valid; 4 policies (api, exports, global, login), store: memory")
    );
    // One policy is "1 policy"; a file TOML cannot read points at what prints a whole file.
    let check = |name: &str, text: &str| {
        let file = temp_file(name, text);
        Command::new(env!("CARGO_BIN_EXE_limiterd"))
            .arg("check-config")
            .arg(&file)
            .output()
            .expect("run")
    };
    let one = check("one.toml", LOGIN);
    assert!(
        String::from_utf8_lossy(&one.stdout).contains("valid; 1 policy (login)"),
        "{}",
        String::from_utf8_lossy(&one.stdout)
    );
    let broken = check("broken.toml", "[policies.api]\nlimits = [\n");
    let stderr = String::from_utf8_lossy(&broken.stderr);
    assert!(
        stderr.contains("line ")
            && stderr.contains("`limiterd example-config` prints a complete file"),
        "{stderr}"
    );
    let help = Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .arg("--help")
        .output()
        .expect("run");
    assert!(String::from_utf8_lossy(&help.stdout).contains("limiterd example-config"));
}

#[test]
fn sigterm_stops_it_after_answering() {
    let mut daemon = Daemon::start(&[]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut client = Client::connect(daemon.addr).await;
        assert_eq!(
            client
                .decide(json!({"policy": "api", "identifier": "u"}))
                .await["success"],
            true
        );
    });
    daemon.signal("TERM");
    let exit = daemon.exits_within(Duration::from_secs(10));
    assert!(exit.success(), "{exit}");
    let rest: Vec<String> = daemon
        .stdout
        .as_mut()
        .expect("not recorded")
        .lines()
        .map_while(Result::ok)
        .collect();
    assert!(rest.iter().any(|l| l == "limiterd stopped"), "{rest:?}");
}

/// Redis unreachable and a fail-open policy: every answer admits, says `fail_open`, and
/// reports the policy's limit (its tightest), with nothing taken, single or in a batch, for
/// configured and ad-hoc limits.
#[tokio::test]
async fn fail_open_answers_report_the_policys_limit() {
    let dead = redis_server::free_port();
    let config = temp_file(
        &format!("fail-open-{dead}.toml"),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:{dead}\"\ntimeout_ms = 200\non_failure = \"open\"\n\n\
             [policies.api]\nlimits = [{{ algorithm = \"token_bucket\", count = 100, period = \"1m\" }}, \
             {{ algorithm = \"fixed_window\", count = 7, period = \"1s\", key = \"global\" }}]\n"
        ),
    );
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8 path")]);
    let mut client = Client::connect(daemon.addr).await;
    let one = client
        .decide(json!({"policy": "api", "identifier": "u"}))
        .await;
    assert_eq!(one["success"], true, "{one}");
    assert_eq!(one["source"], "fail_open", "{one}");
    assert_eq!(
        (&one["limit"], &one["remaining"]),
        (&json!(7), &json!(7)),
        "{one}"
    );
    let ad_hoc = client
        .decide(json!({"namespace": "n", "identifier": "u", "limit": 30, "duration_ms": 60_000}))
        .await;
    assert_eq!(
        (&ad_hoc["limit"], &ad_hoc["source"]),
        (&json!(30), &json!("fail_open")),
        "{ad_hoc}"
    );
    let (status, batch) = client
        .post(
            "/v1/ratelimit/many",
            &json!({"requests": [{"policy": "api", "identifier": "a"}, {"policy": "api", "identifier": "b"}]}),
        )
        .await;
    assert_eq!(status, 200, "{batch}");
    for result in batch["results"].as_array().expect("results") {
        assert_eq!(result["source"], "fail_open", "{batch}");
        assert_eq!(result["limit"], 7, "{batch}");
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
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_json_lines_on_stderr_and_report_the_breaker() {
    let refused = Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .args(["--log-level", "loud"])
        .output()
        .expect("run limiterd");
    assert!(!refused.status.success());
    let message = String::from_utf8_lossy(&refused.stderr);
    assert!(message.contains("--log-level"), "{message}");

    let mut server = redis_server::RedisServer::start();
    let mut child = Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .args([
            "--redis",
            &server.url(),
            "--listen",
            "127.0.0.1:0",
            "--log",
            "json",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start limiterd");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut first = String::new();
    stdout.read_line(&mut first).expect("the banner");
    let addr: std::net::SocketAddr = first
        .trim()
        .strip_prefix("limiterd listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"))
        .parse()
        .expect("an address");
    let (lines, logs) = std::sync::mpsc::channel();
    let stderr = std::io::BufReader::new(child.stderr.take().expect("piped"));
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let next_log = |what: &str| -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = logs
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no log line saying {what:?}"));
            let event: Value =
                serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?} is not JSON: {e}"));
            if event["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(what))
            {
                return event;
            }
        }
    };
    let serving = next_log("limiterd serving");
    assert_eq!(serving["level"], "INFO", "{serving}");
    assert_eq!(serving["fields"]["addr"], addr.to_string(), "{serving}");

    let mut client = Client::connect(addr).await;
    let body = json!({"policy": "api", "identifier": "user-1"});
    let (status, _) = client.post("/v1/ratelimit", &body).await;
    assert_eq!(status, 200);
    server.kill();
    // Five outages in a row open the breaker (the backend's default).
    for _ in 0..6 {
        let (status, answer) = Client::connect(addr)
            .await
            .post("/v1/ratelimit", &body)
            .await;
        assert_eq!(status, 200, "the fallback answers: {answer}");
    }
    let open = next_log("circuit breaker open");
    assert_eq!(open["level"], "WARN", "{open}");
    assert_eq!(open["fields"]["failures"], 5, "{open}");
    let _ = child.kill();
    let _ = child.wait();
}

const ALIGNED: &str = r#"
[policies.daily]
limits = [{ algorithm = "fixed_window", count = 3, period = "1d" }]
[policies.minutely]
limits = [{ algorithm = "fixed_window", count = 3, period = "1m" }]
[policies.sliding]
limits = [{ algorithm = "sliding_window", count = 3, period = "1h" }]
"#;

#[tokio::test]
async fn windows_are_aligned_to_the_unix_epoch_in_memory() {
    let config = temp_file("aligned-memory.toml", ALIGNED);
    windows_are_aligned_to_the_unix_epoch(&["--config", config.to_str().expect("UTF-8 path")])
        .await;
}

#[tokio::test]
async fn windows_are_aligned_to_the_unix_epoch_on_redis() {
    let server = redis_server::RedisServer::start();
    let config = temp_file(&format!("aligned-redis-{}.toml", server.port), ALIGNED);
    windows_are_aligned_to_the_unix_epoch(&[
        "--config",
        config.to_str().expect("UTF-8 path"),
        "--redis",
        &server.url(),
    ])
    .await;
}

/// A day's fixed window resets at the next 00:00 UTC and a minute's on the minute, whichever
/// store counts, and `reset_at_ms` is the same instant, to the millisecond, for every call in
/// the window. (A
/// process counting from its own start would reset a day after it started.)
async fn windows_are_aligned_to_the_unix_epoch(args: &[&str]) {
    let daemon = Daemon::start(args);
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
