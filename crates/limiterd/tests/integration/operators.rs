//! limiterd on the Redis operators run, against processes the test starts: an ACL user whose
//! password (in the URL, a file or a variable) no surface ever shows (the banner, the logs,
//! `/debug/config`, `/debug/status`, `/readyz`, `/metrics`, the status page, `check-config`
//! and its errors); a wrong password named as authentication and never ready; TLS with a CA
//! file, and a wrong CA refused at start by name; a cluster with a dead master reporting its
//! masters and failing slots while healthy identifiers stay on Redis; `--redis-timeout-ms`
//! setting each call's timeout, and refused without a Redis store; the least-privilege ACL
//! user of docs/operations.md serving every kind of policy, leases, ad-hoc limits and unkey's
//! overrides.

use limiter_testkit::redis_server::tls::TestCerts;
use limiter_testkit::redis_server::{ClusterOptions, RedisCluster, RedisServer};

use crate::support::unkey::{KEY, limit, name, root};
use crate::support::{Client, Daemon, temp_file};
use serde_json::{Value, json};

const PASSWORD: &str = "Op3rat0r-Secret-77";
const USER: &str = "limiter on >Op3rat0r-Secret-77 ~limiterd:* resetchannels -@all +ping +fcall \
     +function|load +evalsha +eval +get +set +time +pttl +pexpire +hset +hdel +hgetall +incr \
     +zadd +zcard +zcount +zrange +zrem +zremrangebyscore +zscore +cluster|slots +cluster|info +asking +wait";
const POLICY: &str =
    "[policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 100, period = \"1h\" }]\n";

/// Everything a daemon serves an operator, one string per surface.
async fn surfaces(daemon: &Daemon) -> Vec<(String, String)> {
    let mut client = Client::connect(daemon.addr).await;
    let mut seen = Vec::new();
    for path in [
        "/readyz",
        "/debug/config",
        "/debug/status",
        "/metrics",
        "/",
        "/healthcheck",
    ] {
        let (_, body) = client.send("GET", path, "").await;
        seen.push((path.to_owned(), body));
    }
    seen
}

fn check_config(path: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .args(["check-config", path])
        .output()
        .expect("runs");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn assert_never_shown(secret: &str, seen: &[(String, String)]) {
    for (surface, text) in seen {
        assert!(
            !text.contains(secret),
            "{surface} shows the password:\n{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_surface_shows_the_password_wherever_it_comes_from() {
    let server = RedisServer::start_with_users(&[USER]);
    let port = server.port;
    let secret_file = temp_file(&format!("redis-password-{port}"), &format!("{PASSWORD}\n"));
    let in_url = format!("url = \"redis://limiter:{PASSWORD}@127.0.0.1:{port}\"\n");
    let by_user = |extra: &str| {
        format!("url = \"redis://127.0.0.1:{port}\"\nusername = \"limiter\"\n{extra}")
    };
    let stores = [
        ("url", in_url.clone()),
        (
            "file",
            by_user(&format!("password_file = {:?}\n", secret_file)),
        ),
        (
            "env",
            by_user("password_env = \"LIMITERD_TEST_REDIS_PASSWORD\"\n"),
        ),
        ("inline", by_user(&format!("password = \"{PASSWORD}\"\n"))),
    ];
    for (name, store) in stores {
        let file = temp_file(
            &format!("secret-{name}-{port}.toml"),
            &format!("[store]\nkind = \"redis\"\n{store}{POLICY}"),
        );
        let path = file.to_str().expect("UTF-8");
        let env = [("LIMITERD_TEST_REDIS_PASSWORD", PASSWORD)];
        let daemon = Daemon::start_recorded(&["--config", path, "--log-level", "debug"], &env);
        let mut client = Client::connect(daemon.addr).await;
        let d = client
            .decide(json!({"policy": "api", "identifier": "u"}))
            .await;
        assert_eq!(d["source"], "redis", "{name}: {d}");
        let (status, ready) = client.send("GET", "/readyz", "").await;
        assert_eq!(status, 200, "{name}: {ready}");
        let mut seen = surfaces(&daemon).await;
        seen.push((
            "output".to_owned(),
            daemon.wait_for_output("limiterd serving"),
        ));
        let checked = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
            .args(["check-config", path])
            .envs(env)
            .output()
            .expect("runs");
        seen.push((
            "check-config".to_owned(),
            String::from_utf8_lossy(&checked.stdout).into_owned(),
        ));
        assert_never_shown(PASSWORD, &seen);
        let config: Value =
            serde_json::from_str(&seen.iter().find(|(s, _)| s == "/debug/config").unwrap().1)
                .unwrap();
        assert!(
            config["store"]["url"]
                .as_str()
                .unwrap()
                .starts_with("redis://"),
            "{config}"
        );
    }
    // The flag too (though a password on a command line shows in the process list).
    let url = format!("redis://limiter:{PASSWORD}@127.0.0.1:{port}");
    let daemon = Daemon::start_recorded(&["--redis", &url], &[]);
    let mut seen = surfaces(&daemon).await;
    seen.push((
        "output".to_owned(),
        daemon.wait_for_output("limiterd serving"),
    ));
    assert_never_shown(PASSWORD, &seen);
    // A URL that is wrong in another part: the error names the part, not the password.
    let bad = temp_file(
        &format!("secret-bad-{port}.toml"),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"redis://limiter:{PASSWORD}@127.0.0.1:notaport\"\n{POLICY}"
        ),
    );
    let said = check_config(bad.to_str().unwrap());
    assert!(said.contains("port `notaport`"), "{said}");
    assert!(!said.contains(PASSWORD), "{said}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_timeout_flag_sets_each_call_s_timeout_and_needs_a_redis_store() {
    let server = RedisServer::start();
    let daemon = Daemon::start(&["--redis", &server.url(), "--redis-timeout-ms", "40"]);
    let mut client = Client::connect(daemon.addr).await;
    let (status, config) = client.send("GET", "/debug/config", "").await;
    assert_eq!(status, 200);
    let config: Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["store"]["timeout_ms"], 40, "{config}");
    let decided = client
        .decide(json!({"policy": "api", "identifier": "u"}))
        .await;
    assert_eq!(decided["source"], "redis", "{decided}");
    // On the in-memory store the flag means nothing: refused at start, saying what to add.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .args(["--listen", "127.0.0.1:0", "--redis-timeout-ms", "40"])
        .output()
        .expect("runs");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        said.contains("--redis-timeout-ms 40: the store is in memory; add --redis"),
        "{said}"
    );
}

/// Every kind of policy limiterd keeps on Redis, for the least-privilege user (its calendar
/// quota in a zone whose month does not end while the test counts it).
fn every_kind() -> String {
    let (zone, _) = crate::support::calendars::zone_with_a_month_ahead();
    format!(
        "[policies.api]\n\
         limits = [{{ algorithm = \"token_bucket\", count = 100, period = \"1h\" }}]\n\
         [policies.exports]\n\
         limits = [{{ algorithm = \"concurrency\", count = 1, ttl = \"30s\" }}]\n\
         [policies.monthly]\n\
         limits = [{{ algorithm = \"fixed_window\", count = 2, period = \"1mo\", calendar = \"{zone}\" }}]\n"
    )
}

/// A Redis with docs/operations.md's least-privilege user, and limiterd on it as that user
/// (failing closed) serving `policies`, with `env` set.
fn as_least_privileged_user(
    name: &str,
    policies: &str,
    env: &[(&str, &str)],
) -> (RedisServer, Daemon) {
    let server = RedisServer::start_with_users(&[USER]);
    let port = server.port;
    let file = temp_file(
        &format!("least-privilege-{name}-{port}.toml"),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"redis://limiter:{PASSWORD}@127.0.0.1:{port}\"\non_failure = \"closed\"\n{policies}"
        ),
    );
    let daemon = Daemon::start_with_env(&["--config", file.to_str().expect("UTF-8")], env);
    (server, daemon)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_least_privilege_user_serves_every_kind_of_policy() {
    // The rule docs/operations.md gives, with this test's password: permits (sorted sets) and
    // calendar quotas included, every key under `limiterd:`.
    let (_server, daemon) = as_least_privileged_user("every-kind", &every_kind(), &[]);
    let mut client = Client::connect(daemon.addr).await;
    let api = client
        .decide(json!({"policy": "api", "identifier": "u"}))
        .await;
    assert_eq!(
        (api["success"].clone(), api["source"].clone()),
        (json!(true), json!("redis")),
        "{api}"
    );

    let ask = json!({"policy": "exports", "identifier": "acme"});
    let first = client.decide(ask.clone()).await;
    assert_eq!(
        first["success"], true,
        "a permit on Redis as the ACL user: {first}"
    );
    let permit = first["permit"].as_str().expect("a permit").to_owned();
    let busy = client.decide(ask.clone()).await;
    assert_eq!(busy["success"], false, "the one permit is held: {busy}");
    let (status, released) = client
        .post(
            "/v1/ratelimit/release",
            &json!({"policy": "exports", "identifier": "acme", "permit": permit}),
        )
        .await;
    assert_eq!((status, released), (200, json!({"released": true})));
    assert_eq!(client.decide(ask).await["success"], true);

    let month = json!({"policy": "monthly", "identifier": "acme"});
    for expected in [true, true, false] {
        let d = client.decide(month.clone()).await;
        assert_eq!(
            d["success"], expected,
            "a calendar quota as the ACL user: {d}"
        );
    }
    let (status, ready) = client.send("GET", "/readyz", "").await;
    assert_eq!(status, 200, "{ready}");
}

/// The rest of what limiterd keeps on Redis, for the same least-privilege user: a leased
/// policy (its ledgers), an ad-hoc limit, and unkey's overrides (records: set, read, applied,
/// listed, deleted) with unkey's namespaced limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_least_privilege_user_keeps_leases_ad_hoc_limits_and_overrides() {
    let policies = format!("{POLICY}lease_slack = \"10%\"\n");
    let (_server, daemon) =
        as_least_privileged_user("the-rest", &policies, &[("LIMITERD_ROOT_KEY", KEY)]);
    let mut client = Client::connect(daemon.addr).await;
    let mut sources = Vec::new();
    for _ in 0..5 {
        let leased = client
            .decide(json!({"policy": "api", "identifier": "u"}))
            .await;
        assert_eq!(
            leased["success"], true,
            "a leased policy as the ACL user: {leased}"
        );
        sources.push(leased["source"].as_str().unwrap_or_default().to_owned());
    }
    assert!(
        sources.iter().any(|s| s == "lease"),
        "decided on a lease: {sources:?}"
    );
    let ad_hoc = json!({"namespace": "acl", "identifier": "v", "limit": 5, "duration_ms": 60_000});
    let answer = client.decide(ad_hoc).await;
    assert_eq!(
        (answer["success"].clone(), answer["limit"].clone()),
        (json!(true), json!(5)),
        "an ad-hoc limit as the ACL user: {answer}"
    );
    let set = json!({"namespace": "acl", "identifier": "vip_*", "limit": 1, "duration": 60_000});
    let (status, value) = root(&mut client, "setOverride", &set).await;
    assert_eq!(status, 200, "an override kept as the ACL user: {value}");
    let (status, value) = root(&mut client, "getOverride", &name("acl", "vip_*")).await;
    assert_eq!(
        (status, value["data"]["limit"].clone()),
        (200, json!(1)),
        "{value}"
    );
    let (status, value) = root(&mut client, "listOverrides", &json!({"namespace": "acl"})).await;
    assert_eq!(status, 200, "{value}");
    assert_eq!(value["data"].as_array().map(Vec::len), Some(1), "{value}");
    let (status, value) = root(
        &mut client,
        "limit",
        &limit("acl", "vip_1", 100, 60_000, None),
    )
    .await;
    assert_eq!(
        (status, value["data"]["limit"].clone()),
        (200, json!(1)),
        "{value}"
    );
    let (status, value) = root(&mut client, "deleteOverride", &name("acl", "vip_*")).await;
    assert_eq!(status, 200, "{value}");
    let (status, ready) = client.send("GET", "/readyz", "").await;
    assert_eq!(status, 200, "{ready}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_named_as_authentication_and_never_ready() {
    let server = RedisServer::start_with_users(&[USER]);
    let wrong = "Not-The-Password-123";
    let file = temp_file(
        &format!("wrong-password-{}.toml", server.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"redis://limiter:{wrong}@127.0.0.1:{}\"\n{POLICY}",
            server.port
        ),
    );
    let daemon = Daemon::start_recorded(&["--config", file.to_str().unwrap()], &[]);
    let mut client = Client::connect(daemon.addr).await;
    // Not ready from the first request: the first probe ran before serving.
    let (status, ready) = client.send("GET", "/readyz", "").await;
    assert_eq!(status, 503, "{ready}");
    let ready: Value = serde_json::from_str(&ready).unwrap();
    let error = ready["store_error"].as_str().unwrap();
    assert!(
        error.contains("authentication failed as user `limiter`"),
        "{ready}"
    );
    let output = daemon.wait_for_output("the store cannot be used");
    assert!(output.contains("authentication failed"), "{output}");
    assert!(!output.contains("did not answer within"), "{output}");
    let mut seen = surfaces(&daemon).await;
    seen.push(("output".to_owned(), output));
    assert_never_shown(wrong, &seen);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_ca_file_serves_and_a_wrong_ca_is_refused_by_name() {
    let certs = TestCerts::fresh(&format!("limiterd-{}", std::process::id()));
    let server = RedisServer::start_tls(&certs, true, Vec::new());
    let store = |ca: &std::path::Path| {
        format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\n{POLICY}[store.tls]\nca_file = {ca:?}\ncert_file = {:?}\nkey_file = {:?}\n",
            server.tls_url("localhost"),
            certs.client_cert,
            certs.client_key
        )
    };
    let good = temp_file(&format!("tls-{}.toml", server.port), &store(&certs.ca));
    let said = check_config(good.to_str().unwrap());
    assert!(
        said.contains(&format!(
            "redis (rediss://localhost:{})",
            server.tls_port.unwrap()
        )),
        "{said}"
    );
    let daemon = Daemon::start_recorded(&["--config", good.to_str().unwrap()], &[]);
    let mut client = Client::connect(daemon.addr).await;
    let (status, ready) = client.send("GET", "/readyz", "").await;
    assert_eq!(status, 200, "{ready}");
    let d = client
        .decide(json!({"policy": "api", "identifier": "u"}))
        .await;
    assert_eq!(d["source"], "redis", "{d}");

    let wrong = temp_file(
        &format!("tls-wrong-{}.toml", server.port),
        &store(&certs.other_ca),
    );
    let daemon = Daemon::start_recorded(&["--config", wrong.to_str().unwrap()], &[]);
    let output = daemon.wait_for_output("the store cannot be used");
    assert!(
        output.contains("not signed by a CA this client trusts"),
        "{output}"
    );
    let mut client = Client::connect(daemon.addr).await;
    let (status, ready) = client.send("GET", "/readyz", "").await;
    assert_eq!(status, 503, "{ready}");
    assert!(ready.contains("TLS to Redis failed"), "{ready}");
    // A CA file that is not PEM is refused when the file is read, naming the table.
    let garbage = temp_file(&format!("not-pem-{}.pem", server.port), "not a certificate");
    let bad = temp_file(&format!("tls-bad-{}.toml", server.port), &store(&garbage));
    let said = check_config(bad.to_str().unwrap());
    assert!(
        said.contains("`[store.tls]`") && said.contains("CA file"),
        "{said}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_master_fails_only_its_slots_and_readyz_says_which() {
    let mut cluster = RedisCluster::start_with(&ClusterOptions {
        full_coverage: false,
        ..ClusterOptions::default()
    });
    let seeds: Vec<String> = cluster.urls().iter().map(|u| format!("{u:?}")).collect();
    let file = temp_file(
        &format!("dead-master-{}.toml", cluster.nodes[0].port),
        &format!(
            "[store]\nkind = \"redis\"\ncluster = [{}]\non_failure = \"fallback\"\n{POLICY}",
            seeds.join(", ")
        ),
    );
    let daemon = Daemon::start(&["--config", file.to_str().unwrap()]);
    let mut client = Client::connect(daemon.addr).await;
    let on = |master: usize| -> Vec<String> {
        (0..)
            .map(|i| format!("user-{i}"))
            .filter(|id| cluster.master_of(&format!("{{{id}}}")) == master)
            .take(20)
            .collect()
    };
    let (healthy, doomed): (Vec<String>, Vec<String>) =
        ([0, 1].iter().flat_map(|&m| on(m)).collect(), on(2));
    cluster.nodes[2].kill();
    for id in &healthy {
        let d = client
            .decide(json!({"policy": "api", "identifier": id}))
            .await;
        assert_eq!(d["source"], "redis", "a healthy master's identifier: {d}");
    }
    for id in &doomed[..3] {
        let d = client
            .decide(json!({"policy": "api", "identifier": id}))
            .await;
        assert_ne!(d["source"], "redis", "{d}");
    }
    // The probe runs every second: wait for one that saw the master dead.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let ready = loop {
        let (status, text) = client.send("GET", "/readyz", "").await;
        let ready: Value = serde_json::from_str(&text).unwrap();
        if ready["store"]["masters_answering"] == 2 {
            assert_eq!(status, 200, "{ready}");
            break ready;
        }
        assert!(std::time::Instant::now() < deadline, "{ready}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(ready["store"]["deployment"], "cluster", "{ready}");
    assert_eq!(ready["store"]["masters"], 3, "{ready}");
    assert_eq!(
        ready["store"]["slots_failing"],
        json!(["10923-16383"]),
        "{ready}"
    );
    let error = ready["store_error"].as_str().unwrap();
    assert!(
        error.contains("slots 10923-16383 follow the failure policy"),
        "{ready}"
    );
    let (_, status) = client.send("GET", "/debug/status", "").await;
    assert!(status.contains("\"masters_answering\":2"), "{status}");
    // The same, as the gauges an operator alerts on.
    let (_, metrics) = client.send("GET", "/metrics", "").await;
    let dead = format!(
        "limiterd_store_master_up{{master=\"127.0.0.1:{}\",slots=\"10923-16383\"}} 0",
        cluster.nodes[2].port
    );
    let alive = format!(
        "limiterd_store_master_up{{master=\"127.0.0.1:{}\",slots=\"0-5460\"}} 1",
        cluster.nodes[0].port
    );
    for line in [
        "limiterd_ready 1",
        "limiterd_store_reachable 1",
        "limiterd_store_masters 3",
        "limiterd_store_masters_answering 2",
        &dead,
        &alive,
    ] {
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }
}
