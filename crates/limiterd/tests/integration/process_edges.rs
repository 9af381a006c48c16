//! limiterd as a process at its edges: bad requests answered with clear 400s, bad files
//! explained with their lines, SIGTERM, a store that fails open, and its logs. The binary is
//! started on a free loopback port and driven by a real HTTP client, as in `process.rs`.

use limiter_testkit::redis_server;

use std::io::BufRead;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::process::LOGIN;
use crate::support::{Client, Daemon, temp_file};
use serde_json::{Value, json};

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

/// Out of file descriptors, neither server spins on its listener or stays silent: each says it
/// cannot accept (once, paced: a line every ten seconds at most, where the HTTP loop warned
/// every 50 ms and tonic's gRPC loop retried at once, logging at trace level), and both serve
/// again once connections close.
#[tokio::test]
async fn out_of_descriptors_each_server_says_so_once_and_recovers() {
    let envoy = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/envoy/reference.yaml");
    let daemon =
        Daemon::start_recorded_with_files(&["--envoy", envoy, "--grpc-listen", "127.0.0.1:0"], 64);
    let output = daemon.wait_for_output("envoy rate-limit gRPC on ");
    let grpc = output
        .split("envoy rate-limit gRPC on ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .expect("the gRPC address")
        .to_owned();
    // Idle connections until the daemon has no descriptor left to accept with.
    let held: Vec<std::net::TcpStream> = (0..80)
        .map(|_| std::net::TcpStream::connect(daemon.addr).expect("the backlog takes it"))
        .collect();
    daemon.wait_for_output("server=\"http\"");
    let waiting = std::net::TcpStream::connect(&grpc).expect("the backlog takes it");
    let output = daemon.wait_for_output("server=\"grpc\"");
    let said: Vec<&str> = output
        .lines()
        .filter(|line| line.contains("cannot accept a connection"))
        .collect();
    assert_eq!(said.len(), 2, "one line a server, paced:\n{output}");
    assert!(
        said.iter().all(|line| line.contains("Too many open files")),
        "{output}"
    );
    drop(held);
    drop(waiting);
    let mut client = Client::connect(daemon.addr).await;
    let (status, _) = client.send("GET", "/healthz", "").await;
    assert_eq!(status, 200, "serving again");
    let _grpc_again = std::net::TcpStream::connect(&grpc).expect("listening still");
}
