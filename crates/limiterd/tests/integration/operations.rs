//! limiterd as an operator runs it, over real sockets: slow and stalled clients (read timeouts,
//! a shutdown with a deadline), configuration reloads (a file change and SIGHUP, in memory and
//! on Redis, a bad file refused while the old configuration serves), health (HTTP liveness
//! and readiness, envoy's `/healthcheck`, `grpc.health.v1` on the gRPC port, following Redis
//! down and up) and the debug views. Waits are for events (a reply, a process exit, a value
//! seen), each with a deadline; nothing sleeps to let time pass.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::calendars::{zone_with_a_midnight_ahead, zone_with_a_month_ahead};
use crate::support::windows::{HOUR_MS, in_one_window};
use crate::support::{Client, Counting, Daemon, grpc_channel, temp_file};
use limiter_testkit::redis_server::RedisServer;
use serde_json::{Value, json};

/// Evaluates `probe` (an expression giving an `Option`, awaited in place) until it is
/// `Some`, or fails naming `what` after `within`.
macro_rules! eventually {
    ($what:expr, $within:expr, $probe:expr) => {{
        let deadline = Instant::now() + $within;
        loop {
            if let Some(found) = $probe {
                break found;
            }
            assert!(Instant::now() < deadline, "never saw {}", $what);
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }};
}

/// Everything the server sends until it closes the connection (or `within` passes).
fn read_to_close(stream: &mut TcpStream, within: Duration) -> String {
    stream.set_read_timeout(Some(within)).expect("timeout");
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => reply.extend_from_slice(&buf[..n]),
            Err(e) => panic!(
                "the connection was still open after {within:?} ({e}); got {:?}",
                String::from_utf8_lossy(&reply)
            ),
        }
    }
    String::from_utf8_lossy(&reply).into_owned()
}

const POLICY: &str = r#"
[policies.api]
limits = [{ algorithm = "fixed_window", count = 10, period = "1h" }]
"#;

#[test]
fn a_stalled_body_is_answered_408_in_the_json_shape_and_a_stalled_header_is_cut() {
    let config = temp_file(
        "timeouts.toml",
        &format!("[server]\nheader_timeout_ms = 300\nbody_timeout_ms = 300\n{POLICY}"),
    );
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);

    // Headers and 4 bytes of a 100-byte body, then nothing.
    let mut stalled = TcpStream::connect(daemon.addr).expect("connect");
    stalled
        .write_all(
            b"POST /v1/ratelimit HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"po",
        )
        .expect("write");
    let reply = read_to_close(&mut stalled, Duration::from_secs(10));
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    let body = reply.split("\r\n\r\n").nth(1).expect("a body");
    let error: Value = serde_json::from_str(body).expect("JSON");
    assert_eq!(error["error"]["code"], "request_timeout", "{body}");
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("body_timeout_ms")),
        "{body}"
    );

    // Half a request line: closed without an answer once the header timeout passes.
    let mut half = TcpStream::connect(daemon.addr).expect("connect");
    half.write_all(b"POST /v1/ratel").expect("write");
    let reply = read_to_close(&mut half, Duration::from_secs(10));
    assert!(!reply.contains("200"), "{reply}");

    // A client that sends at its own pace within the timeouts is served.
    let mut slow = TcpStream::connect(daemon.addr).expect("connect");
    let body = r#"{"policy":"api","identifier":"u"}"#;
    let head = format!(
        "POST /v1/ratelimit HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    slow.write_all(head.as_bytes()).expect("write");
    slow.write_all(body.as_bytes()).expect("write");
    let reply = read_to_close(&mut slow, Duration::from_secs(10));
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
}

#[test]
fn sigterm_cuts_a_stalled_client_at_the_shutdown_deadline() {
    // The body timeout is far longer than the test: only the shutdown deadline can end it.
    let config = temp_file(
        "shutdown.toml",
        &format!("[server]\nbody_timeout_ms = 600000\nshutdown_timeout_ms = 300\n{POLICY}"),
    );
    let mut daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);
    let mut stalled = TcpStream::connect(daemon.addr).expect("connect");
    stalled
        .write_all(b"POST /v1/ratelimit HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{\"po")
        .expect("write");
    // The request has reached the handler once another connection is served after it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut client = Client::connect(daemon.addr).await;
        let (status, _) = client.send("GET", "/healthz", "").await;
        assert_eq!(status, 200);
    });
    let started = Instant::now();
    daemon.signal("TERM");
    let exit = daemon.exits_within(Duration::from_secs(30));
    assert!(exit.success(), "{exit}");
    // Cut at its deadline (300 ms), not held for the body's 10 minutes.
    assert!(started.elapsed() < Duration::from_secs(30));
    let reply = read_to_close(&mut stalled, Duration::from_secs(5));
    assert!(!reply.contains("200 OK"), "{reply}");
}

#[test]
fn sigterm_does_not_wait_for_idle_keep_alive_connections() {
    let config = temp_file(
        "idle.toml",
        &format!("[server]\nshutdown_timeout_ms = 600000\n{POLICY}"),
    );
    let mut daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // A keep-alive connection that answered once and stays open, idle.
    let _idle = runtime.block_on(async {
        let mut client = Client::connect(daemon.addr).await;
        let (status, _) = client.send("GET", "/healthz", "").await;
        assert_eq!(status, 200);
        client
    });
    daemon.signal("TERM");
    // The deadline is 10 minutes: only closing idle connections at once lets it exit now.
    let exit = daemon.exits_within(Duration::from_secs(30));
    assert!(exit.success(), "{exit}");
}

/// The first limit of `policy` as `/debug/config` shows it.
async fn shown_count(client: &mut Client, policy: &str) -> Option<u64> {
    let (status, text) = client.send("GET", "/debug/config", "").await;
    assert_eq!(status, 200, "{text}");
    let config: Value = serde_json::from_str(&text).expect("JSON");
    config["policies"][policy]["limits"][0]["count"].as_u64()
}

async fn metric(client: &mut Client, line_start: &str) -> Option<String> {
    let (_, text) = client.send("GET", "/metrics", "").await;
    text.lines()
        .find(|l| l.starts_with(line_start))
        .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
}

/// Waits until `limiterd_config_reloads_total{result="refused"}` reads `count`.
async fn refusals_reach(client: &mut Client, count: u64) {
    let line = "limiterd_config_reloads_total{result=\"refused\"}";
    let want = Some(count.to_string());
    eventually!(
        format!("{count} refused reloads"),
        Duration::from_secs(20),
        (metric(client, line).await == want).then_some(())
    );
}

// `POLICY` is a window of an hour: a run that failed across the top of an hour runs again.
#[tokio::test]
async fn a_changed_file_reloads_keeping_counters_in_memory() {
    in_one_window(HOUR_MS, || reload_keeps_counters(false)).await;
}

#[tokio::test]
async fn a_changed_file_reloads_keeping_counters_on_redis() {
    in_one_window(HOUR_MS, || reload_keeps_counters(true)).await;
}

/// 5 of 10 used; the file doubles the limit: 10 left (not 20), and another policy keeps its
/// counter untouched. A file that does not parse, and one that changes the listen address,
/// are refused, counted, and the running configuration keeps serving; fixing the file applies.
/// In memory, or on a Redis of its own.
async fn reload_keeps_counters(on_redis: bool) {
    let counting = Counting::new(on_redis);
    let other = "[policies.other]\nlimits = [{ algorithm = \"token_bucket\", count = 4, period = \"1h\" }]\n";
    let text = |count: u64| {
        format!(
            "[server]\nreload_check_ms = 50\n{}{other}",
            POLICY.replace("count = 10", &format!("count = {count}"))
        )
    };
    let path = temp_file(&counting.file_name("reload", "toml"), &text(10));
    let mut all = vec!["--config", path.to_str().expect("UTF-8")];
    all.extend(counting.args());
    let daemon = Daemon::start(&all);
    let mut client = Client::connect(daemon.addr).await;
    let take = |policy: &str, cost: u64| json!({"policy": policy, "identifier": "u", "cost": cost});
    assert_eq!(client.decide(take("api", 5)).await["remaining"], 5);
    assert_eq!(client.decide(take("other", 3)).await["remaining"], 1);

    std::fs::write(&path, text(20)).expect("write");
    let wait = Duration::from_secs(20);
    eventually!("the doubled limit", wait, {
        async { (shown_count(&mut client, "api").await == Some(20)).then_some(()) }.await
    });
    let api = client.decide(take("api", 0)).await;
    assert_eq!(
        (api["limit"].clone(), api["remaining"].clone()),
        (json!(20), json!(10)),
        "{api}"
    );
    assert_eq!(client.decide(take("other", 0)).await["remaining"], 1);
    assert_eq!(
        metric(
            &mut client,
            "limiterd_config_reloads_total{result=\"applied\"}"
        )
        .await,
        Some("1".into())
    );

    // A broken file: refused, counted, and 20 still serves.
    std::fs::write(&path, "[policies.api\n").expect("write");
    refusals_reach(&mut client, 1).await;
    assert_eq!(shown_count(&mut client, "api").await, Some(20));
    assert_eq!(client.decide(take("api", 1)).await["remaining"], 9);

    // A change that needs a restart: refused too.
    std::fs::write(
        &path,
        text(30).replace("[server]\n", "[server]\nheader_timeout_ms = 999\n"),
    )
    .expect("write");
    refusals_reach(&mut client, 2).await;
    assert_eq!(shown_count(&mut client, "api").await, Some(20));

    // Fixed: applied, and back at 10 the key is still 11 of 20 used (6 of 10, rounded up).
    std::fs::write(&path, text(10)).expect("write");
    eventually!("the limit back at 10", wait, {
        async { (shown_count(&mut client, "api").await == Some(10)).then_some(()) }.await
    });
    let api = client.decide(take("api", 0)).await;
    assert_eq!(api["remaining"], 4, "{api}");
}

/// A calendar quota whose count, then calendar, then count again change by reloads keeps its
/// consumption on Redis as in memory: the same fraction of the count, rounded up, in the new
/// calendar's window.
#[tokio::test]
async fn a_reloaded_calendar_quota_keeps_its_consumption_on_redis_as_in_memory() {
    let server = RedisServer::start();
    let url = server.url();
    let text = |count: u64, period: &str, zone: &str| {
        format!(
            "[server]\nreload_check_ms = 50\n[policies.plan]\nlimits = [{{ algorithm = \
             \"fixed_window\", count = {count}, period = \"{period}\", calendar = \"{zone}\" }}]\n"
        )
    };
    // Zones whose month and day do not end while the test counts.
    let (month, _) = zone_with_a_month_ahead();
    let (day, _) = zone_with_a_midnight_ahead();
    let steps = [(6, "1mo", month), (12, "1d", day), (3, "1d", day)];
    let mut seen = Vec::new();
    for (store, args) in [("memory", vec![]), ("redis", vec!["--redis", url.as_str()])] {
        let path = temp_file(
            &format!("quota-reload-{store}-{}.toml", server.port),
            &text(3, "1mo", month),
        );
        let mut all = vec!["--config", path.to_str().expect("UTF-8")];
        all.extend_from_slice(&args);
        let daemon = Daemon::start(&all);
        let mut client = Client::connect(daemon.addr).await;
        let ask = |cost: u64| json!({"policy": "plan", "identifier": "acme", "cost": cost});
        assert_eq!(client.decide(ask(1)).await["remaining"], 2, "{store}");
        let mut answers = Vec::new();
        for (applied, (count, period, zone)) in steps.into_iter().enumerate() {
            std::fs::write(&path, text(count, period, zone)).expect("write");
            let line = "limiterd_config_reloads_total{result=\"applied\"}";
            let want = Some((applied + 1).to_string());
            eventually!(
                format!("reload {applied} on {store}"),
                Duration::from_secs(20),
                { async { (metric(&mut client, line).await == want).then_some(()) }.await }
            );
            let answer = client.decide(ask(0)).await;
            answers.push((answer["limit"].clone(), answer["remaining"].clone()));
            if applied == 0 {
                // 2 of 6 used; one more makes 3 of 6.
                assert_eq!(client.decide(ask(1)).await["remaining"], 3, "{store}");
            }
        }
        seen.push(answers);
    }
    // 1 of 3 is 2 of 6; 3 of 6 is 6 of 12 in the day; 6 of 12 is 2 of 3.
    let expected = [(6, 4), (12, 6), (3, 1)].map(|(l, r)| (json!(l), json!(r)));
    assert_eq!(seen[0], expected, "in memory");
    assert_eq!(seen[1], expected, "on Redis");
}

#[tokio::test]
async fn sighup_reloads_envoy_descriptor_files() {
    // A window of an hour: a run that failed across the top of an hour runs again.
    in_one_window(HOUR_MS, sighup_reloads_envoy_descriptors).await;
}

/// 2 of 4 used; the file, changed and signalled, doubles the limit: 4 of 8 used.
async fn sighup_reloads_envoy_descriptors() {
    let yaml = |n: u32| {
        format!(
            "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: {{ unit: hour, requests_per_unit: {n} }}\n"
        )
    };
    let descriptors = temp_file("sighup.yaml", &yaml(4));
    let config = temp_file(
        "sighup.toml",
        &format!(
            "[server]\nreload_check_ms = 0\n[envoy]\nlisten = \"127.0.0.1:0\"\nfiles = [{:?}]\n",
            descriptors.to_str().expect("UTF-8")
        ),
    );
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);
    let mut client = Client::connect(daemon.addr).await;
    let request =
        json!({"domain": "web", "descriptors": [{"entries": [{"key": "ip", "value": "1.2.3.4"}]}]});
    for _ in 0..2 {
        let (status, answer) = client.post("/json", &request).await;
        assert_eq!(status, 200, "{answer}");
    }
    std::fs::write(&descriptors, yaml(8)).expect("write");
    // Not checked for changes (reload_check_ms = 0): only the signal reloads.
    daemon.signal("HUP");
    let limit = eventually!("the new descriptor limit", Duration::from_secs(20), {
        async {
            let (_, text) = client.send("GET", "/debug/config", "").await;
            let config: Value = serde_json::from_str(&text).ok()?;
            let limit = config["envoy"]["domains"][0]["limits"][0].clone();
            (limit["requests_per_unit"] == 8).then_some(limit)
        }
        .await
    });
    assert_eq!(limit["key"], "web.ip");
    // 2 of 4 used is 4 of 8: 3 left after this one.
    let (status, answer) = client.post("/json", &request).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["statuses"][0]["limitRemaining"], 3, "{answer}");
}

use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

fn grpc_status(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.to_owned(),
    }
}

/// Waits until `grpc.health.v1` reports `want` for `service`.
async fn grpc_health_reaches(
    health: &tonic_health::pb::health_client::HealthClient<tonic::transport::Channel>,
    service: &str,
    want: ServingStatus,
) {
    eventually!(
        format!("{want:?} for {service:?}"),
        Duration::from_secs(20),
        {
            let mut health = health.clone();
            async {
                let status = health
                    .check(grpc_status(service))
                    .await
                    .ok()?
                    .into_inner()
                    .status;
                (status == want as i32).then_some(())
            }
            .await
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_follows_redis_down_and_up_over_http_and_grpc() {
    use tonic_health::pb::health_client::HealthClient;

    let mut server = RedisServer::start();
    let descriptors = temp_file(
        &format!("health-{}.yaml", server.port),
        "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: { unit: hour, requests_per_unit: 4 }\n",
    );
    let mut daemon = Daemon::start(&[
        "--redis",
        &server.url(),
        "--envoy",
        descriptors.to_str().expect("UTF-8"),
        "--grpc-listen",
        "127.0.0.1:0",
    ]);
    let grpc_addr = daemon.line_after("envoy rate-limit gRPC on ");
    let grpc_addr = grpc_addr.split(';').next().expect("an address").to_owned();
    let mut health = HealthClient::new(grpc_channel(&grpc_addr).await);
    let mut client = Client::connect(daemon.addr).await;
    let wait = Duration::from_secs(20);

    let (status, body) = client.send("GET", "/healthz", "").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, body) = client.send("GET", "/healthcheck", "").await;
    assert_eq!((status, body.as_str()), (200, "OK"));
    let (status, body) = client.send("GET", "/readyz", "").await;
    let ready: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(status, 200, "{body}");
    assert_eq!(ready["store_reachable"], true);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        grpc_health_reaches(&health, service, ServingStatus::Serving).await;
    }

    server.kill();
    let body = eventually!("not ready", wait, {
        async {
            let (status, body) = client.send("GET", "/readyz", "").await;
            (status == 503).then_some(body)
        }
        .await
    });
    let ready: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(
        (ready["ready"].clone(), ready["store_reachable"].clone()),
        (json!(false), json!(false)),
        "{body}"
    );
    assert!(
        ready["store_error"].as_str().is_some_and(|e| !e.is_empty()),
        "{body}"
    );
    let (status, _) = client.send("GET", "/healthcheck", "").await;
    assert_eq!(status, 500);
    // Liveness is not readiness: the process is alive.
    assert_eq!(client.send("GET", "/healthz", "").await.0, 200);
    grpc_health_reaches(&health, "", ServingStatus::NotServing).await;

    server.restart();
    eventually!("ready again", wait, {
        async { (client.send("GET", "/readyz", "").await.0 == 200).then_some(()) }.await
    });
    grpc_health_reaches(&health, "", ServingStatus::Serving).await;

    // On SIGTERM the gRPC health says NOT_SERVING before the servers stop (or the port
    // closes). The signal lands when the process next runs, so SERVING may still be answered
    // just after it is sent; once NOT_SERVING (or a closed port) is seen, SERVING never is.
    daemon.signal("TERM");
    let serving = |answer: &Result<tonic::Response<HealthCheckResponse>, tonic::Status>| matches!(answer, Ok(a) if a.get_ref().status == ServingStatus::Serving as i32);
    eventually!("NOT_SERVING after SIGTERM", wait, {
        let answer = health.check(grpc_status("")).await;
        (!serving(&answer)).then_some(())
    });
    assert!(!serving(&health.check(grpc_status("")).await));
    let exit = daemon.exits_within(Duration::from_secs(30));
    assert!(exit.success(), "{exit}");
}

#[tokio::test]
async fn the_status_view_counts_traffic_and_names_the_top_denied() {
    let daemon = Daemon::start(&[]);
    let mut client = Client::connect(daemon.addr).await;
    for _ in 0..8 {
        client
            .decide(json!({"policy": "login", "identifier": "mallory"}))
            .await;
    }
    client
        .decide(json!({"policy": "login", "identifier": "alice"}))
        .await;
    let (status, text) = client.send("GET", "/debug/status", "").await;
    assert_eq!(status, 200, "{text}");
    let view: Value = serde_json::from_str(&text).expect("JSON");
    let login = view["policies"]
        .as_array()
        .expect("a list")
        .iter()
        .find(|p| p["name"] == "login")
        .expect("login listed")
        .clone();
    assert_eq!(login["totals"]["allowed"], 6, "{login}");
    assert_eq!(login["totals"]["denied"], 3, "{login}");
    let top = &view["top_denied"][0];
    assert_eq!(
        (top["identifier"].clone(), top["denied"].clone()),
        (json!("mallory"), json!(3)),
        "{view}"
    );
    assert_eq!(view["readiness"]["ready"], true);

    let (status, page) = client.send("GET", "/", "").await;
    assert_eq!(status, 200);
    assert!(page.contains("<title>limiterd status</title>") && page.contains("/debug/status"));
}
