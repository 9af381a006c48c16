//! unkey's v2 ratelimit API on a limiterd process, over a real socket, as unkey's SDKs call it
//! (`POST /v2/ratelimit.<op>`, a bearer key, JSON bodies): answers and refusals in unkey's
//! shapes, a key always required, counting by namespace, identifier and duration, and
//! `multiLimit` all or nothing, and overrides (exact and patterns, paged, kept across a
//! restart in their file); a fleet on Redis is `unkey_fleet.rs`. (The SDKs themselves drive
//! it in `cargo xtask unkey`.)

use crate::support;

use crate::support::unkey::{KEY, call, limit, name, root};
use crate::support::{Client, Daemon};
use serde_json::{Value, json};

fn start() -> Daemon {
    Daemon::start_with_env(&["--log-level", "warn"], &[("LIMITERD_ROOT_KEY", KEY)])
}

#[tokio::test]
async fn a_key_is_always_required_and_refusals_are_in_unkeys_shape() {
    let daemon = start();
    let mut client = Client::connect(daemon.addr).await;
    let body = limit("api", "ada", 5, 60_000, None);
    for key in [None, Some("not-the-key")] {
        let (status, value) = call(&mut client, "limit", key, &body).await;
        assert_eq!(status, 401, "{value}");
        let error = &value["error"];
        assert_eq!(error["status"], 401);
        assert!(
            error["title"].is_string() && error["type"].is_string(),
            "{value}"
        );
        assert!(error["detail"].as_str().unwrap().contains("key"), "{value}");
        assert!(value.get("data").is_none());
    }
    // Bad input is a 400 naming where, never a 5xx the SDK would retry.
    for (bad, location) in [
        (limit("api", "ada", 0, 60_000, None), "body.limit"),
        (limit("api", "ada", 5, 10, None), "body.duration"),
        (limit("", "ada", 5, 60_000, None), "body.namespace"),
        (limit("api", "", 5, 60_000, None), "body.identifier"),
        (
            json!({"namespace": "api", "identifier": "ada", "limit": -1, "duration": 60_000}),
            "body.limit",
        ),
        (
            json!({"namespace": "api", "identifier": "ada", "limit": 5}),
            "body.duration",
        ),
        // An array is never read as an object by position (serde alone would).
        (json!(["api", "ada", 5, 60_000, 1]), "body"),
        (json!("api"), "body"),
    ] {
        let (status, value) = root(&mut client, "limit", &bad).await;
        assert_eq!(status, 400, "{bad}: {value}");
        let errors = value["error"]["errors"].as_array().expect("errors");
        assert_eq!(errors[0]["location"], location, "{bad}: {value}");
    }
    let (status, value) = root(&mut client, "multiLimit", &json!([])).await;
    assert_eq!(status, 400, "{value}");
    for (batch, location) in [
        (
            json!([
                limit("api", "ada", 5, 60_000, None),
                ["api", "bo", 5, 60_000, 1]
            ]),
            "body[1]",
        ),
        (
            json!([{"namespace": "api", "identifier": "bo", "limit": 5}]),
            "body[0].duration",
        ),
    ] {
        let (status, value) = root(&mut client, "multiLimit", &batch).await;
        assert_eq!(status, 400, "{batch}: {value}");
        let error = &value["error"]["errors"][0];
        assert_eq!(error["location"], location, "{batch}: {value}");
        assert!(
            !error["message"].as_str().unwrap().contains("struct"),
            "{value}"
        );
    }
    // Nothing was counted by the refused batches.
    let (status, value) = root(&mut client, "limit", &limit("api", "ada", 5, 60_000, None)).await;
    assert_eq!(
        (status, &value["data"]["remaining"]),
        (200, &json!(4)),
        "{value}"
    );
    // A limit refused when its shape is resolved (more than a sliding window counts), not
    // when the body is read, still names the check it came in: the second.
    let too_many = limit("api", "cy", 50_000_000_000, 60_000, None);
    let batch = json!([limit("api", "ada", 5, 60_000, None), too_many]);
    let (status, value) = root(&mut client, "multiLimit", &batch).await;
    assert_eq!(status, 400, "{value}");
    let errors = value["error"]["errors"].as_array().expect("errors");
    assert_eq!(errors[0]["location"], "body[1].limit", "{value}");
    // And alone, the body.
    let (status, value) = root(&mut client, "limit", &too_many).await;
    assert_eq!(status, 400, "{value}");
    assert_eq!(
        value["error"]["errors"][0]["location"], "body.limit",
        "{value}"
    );
}

#[tokio::test]
async fn limits_count_by_namespace_identifier_and_duration() {
    let daemon = start();
    let mut client = Client::connect(daemon.addr).await;
    let mut ids = std::collections::HashSet::new();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (status, value) =
            root(&mut client, "limit", &limit("api", "ada", 2, 60_000, None)).await;
        assert_eq!(status, 200, "{value}");
        assert!(
            ids.insert(value["meta"]["requestId"].to_string()),
            "a fresh id each time"
        );
        let data = &value["data"];
        assert!(
            data.get("overrideId").is_none(),
            "left out, never null: {value}"
        );
        assert_eq!(data["limit"], 2);
        seen.push((
            data["success"].as_bool().unwrap(),
            data["remaining"].as_u64().unwrap(),
        ));
        // As unkey answers, admitted or denied: the end of the current 60 s window, counted
        // from the Unix epoch.
        let reset = data["reset"].as_u64().unwrap();
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert_eq!(reset % 60_000, 0, "{value}");
        assert!(
            reset + 60_000 > now_ms && reset <= now_ms + 60_000,
            "the current window's end: {value}"
        );
    }
    assert_eq!(seen, [(true, 1), (true, 0), (false, 0)]);
    // Cost 0 only reports (0 more units always fit, as unkey answers); another duration is
    // another counter; another namespace too.
    let (_, value) = root(
        &mut client,
        "limit",
        &limit("api", "ada", 2, 60_000, Some(0)),
    )
    .await;
    assert_eq!(
        (
            value["data"]["success"].as_bool(),
            value["data"]["remaining"].as_u64()
        ),
        (Some(true), Some(0))
    );
    for other in [
        limit("api", "ada", 2, 30_000, None),
        limit("web", "ada", 2, 60_000, None),
    ] {
        let (_, value) = root(&mut client, "limit", &other).await;
        assert_eq!(value["data"]["success"], true, "{other}");
    }
    // Another limit on the same window keeps what was used (2 of 2 is 4 of 4).
    let (_, value) = root(&mut client, "limit", &limit("api", "ada", 4, 60_000, None)).await;
    assert_eq!(value["data"]["success"], false, "{value}");
    // The native API cannot reach these counters by naming their namespace.
    let v1 =
        json!({"namespace": "60000ms:api", "identifier": "ada", "limit": 2, "duration_ms": 60_000});
    let (status, value) = client.post("/v1/ratelimit", &v1).await;
    assert_eq!(
        (status, value["success"].as_bool()),
        (200, Some(true)),
        "{value}"
    );
}

#[tokio::test]
async fn multi_limit_is_all_or_nothing() {
    let daemon = start();
    let mut client = Client::connect(daemon.addr).await;
    let (_, value) = root(&mut client, "limit", &limit("api", "bob", 1, 60_000, None)).await;
    assert_eq!(value["data"]["success"], true);
    let both = json!([
        limit("api", "ada", 3, 60_000, Some(2)),
        limit("api", "bob", 1, 60_000, None)
    ]);
    let (status, value) = root(&mut client, "multiLimit", &both).await;
    assert_eq!(status, 200, "{value}");
    let data = &value["data"];
    assert_eq!(data["passed"], false, "{value}");
    let limits = data["limits"].as_array().unwrap();
    assert_eq!(
        (
            limits[0]["namespace"].as_str(),
            limits[0]["identifier"].as_str()
        ),
        (Some("api"), Some("ada"))
    );
    assert_eq!(
        (limits[0]["passed"].as_bool(), limits[1]["passed"].as_bool()),
        (Some(true), Some(false))
    );
    // ada's two units were not taken: all three are there.
    let (_, value) = root(
        &mut client,
        "limit",
        &limit("api", "ada", 3, 60_000, Some(3)),
    )
    .await;
    assert_eq!(value["data"]["success"], true, "{value}");
    let (_, value) = root(
        &mut client,
        "multiLimit",
        &json!([limit("api", "cy", 3, 60_000, None)]),
    )
    .await;
    assert_eq!(value["data"]["passed"], true, "{value}");
}

#[tokio::test]
async fn a_cost_above_the_limit_is_a_denial_that_takes_nothing() {
    let daemon = start();
    let mut client = Client::connect(daemon.addr).await;
    let (status, value) = root(
        &mut client,
        "limit",
        &limit("api", "ada", 5, 60_000, Some(6)),
    )
    .await;
    assert_eq!(
        (status, value["data"]["success"].as_bool()),
        (200, Some(false)),
        "{value}"
    );
    let (_, value) = root(
        &mut client,
        "limit",
        &limit("api", "ada", 5, 60_000, Some(5)),
    )
    .await;
    assert_eq!(value["data"]["success"], true, "nothing was taken: {value}");
    let both = json!([
        limit("api", "bob", 5, 60_000, None),
        limit("api", "cy", 1, 60_000, Some(2))
    ]);
    let (_, value) = root(&mut client, "multiLimit", &both).await;
    assert_eq!(value["data"]["passed"], false, "{value}");
    let (_, value) = root(
        &mut client,
        "limit",
        &limit("api", "bob", 5, 60_000, Some(5)),
    )
    .await;
    assert_eq!(
        value["data"]["success"], true,
        "bob's unit was not taken: {value}"
    );
}

#[tokio::test]
async fn overrides_apply_exact_before_patterns_and_survive_a_restart() {
    let file = support::temp_file("overrides.json", "{}");
    let path = file.to_str().expect("UTF-8").to_owned();
    let start_kept = || {
        Daemon::start_with_env(
            &["--log-level", "warn", "--overrides", &path],
            &[("LIMITERD_ROOT_KEY", KEY)],
        )
    };
    let daemon = start_kept();
    let mut client = Client::connect(daemon.addr).await;
    let set = |identifier: &str, limit: u64| json!({"namespace": "api", "identifier": identifier, "limit": limit, "duration": 60_000});
    let (status, value) = root(&mut client, "setOverride", &set("user_*", 3)).await;
    assert_eq!(status, 200, "{value}");
    let pattern_id = value["data"]["overrideId"].as_str().unwrap().to_owned();
    let (_, value) = root(&mut client, "setOverride", &set("user_vip", 5)).await;
    let exact_id = value["data"]["overrideId"].as_str().unwrap().to_owned();
    let (_, again) = root(&mut client, "setOverride", &set("user_*", 2)).await;
    assert_eq!(
        again["data"]["overrideId"],
        pattern_id.as_str(),
        "setting again keeps the id"
    );

    // The caller asks for 100 a minute; the overrides decide, each identifier on its own counter.
    for (identifier, want_limit, want_id) in [
        ("user_1", 2, &pattern_id),
        ("user_2", 2, &pattern_id),
        ("user_vip", 5, &exact_id),
    ] {
        let (_, value) = root(
            &mut client,
            "limit",
            &limit("api", identifier, 100, 60_000, None),
        )
        .await;
        let data = &value["data"];
        assert_eq!(
            (data["limit"].as_u64(), data["overrideId"].as_str()),
            (Some(want_limit), Some(want_id.as_str())),
            "{identifier}: {value}"
        );
        assert_eq!(data["success"], true);
    }
    let (_, value) = root(
        &mut client,
        "limit",
        &limit("api", "ada", 100, 60_000, None),
    )
    .await;
    assert!(
        value["data"].get("overrideId").is_none(),
        "no override applies to ada: {value}"
    );

    // get, list in pages, delete; a missing one is a 404.
    let (_, value) = root(&mut client, "getOverride", &name("api", "user_*")).await;
    assert_eq!(
        (
            value["data"]["limit"].as_u64(),
            value["data"]["duration"].as_u64()
        ),
        (Some(2), Some(60_000)),
        "{value}"
    );
    let (_, page) = root(
        &mut client,
        "listOverrides",
        &json!({"namespace": "api", "limit": 1}),
    )
    .await;
    assert_eq!(
        (
            page["data"].as_array().unwrap().len(),
            page["pagination"]["hasMore"].as_bool()
        ),
        (1, Some(true)),
        "{page}"
    );
    let cursor = page["pagination"]["cursor"].as_str().unwrap().to_owned();
    let (_, rest) = root(
        &mut client,
        "listOverrides",
        &json!({"namespace": "api", "cursor": cursor}),
    )
    .await;
    assert_eq!(rest["data"].as_array().unwrap().len(), 1, "{rest}");
    assert!(
        rest["pagination"].get("cursor").is_none() && rest["pagination"]["hasMore"] == false,
        "{rest}"
    );
    let (status, value) = root(&mut client, "deleteOverride", &name("api", "user_vip")).await;
    assert_eq!((status, &value["data"]), (200, &json!({})));
    let (status, value) = root(&mut client, "getOverride", &name("api", "user_vip")).await;
    assert_eq!(
        (status, value["error"]["status"].as_u64()),
        (404, Some(404)),
        "{value}"
    );
    let (status, _) = root(&mut client, "deleteOverride", &name("api", "user_vip")).await;
    assert_eq!(status, 404);
    for (op, body) in [
        ("setOverride", set("x", 1)),
        ("getOverride", name("api", "x")),
        ("listOverrides", json!({"namespace": "api"})),
    ] {
        let (status, _) = call(&mut client, op, None, &body).await;
        assert_eq!(status, 401, "{op} without a key");
    }
    // Each operation reads an object, never an array by position.
    for (op, body) in [
        ("setOverride", json!(["api", "user_x", 1, 1_000])),
        ("getOverride", json!(["api", "user_vip"])),
        ("deleteOverride", json!(["api", "user_*"])),
        ("listOverrides", json!(["api", null, null])),
    ] {
        let (status, value) = root(&mut client, op, &body).await;
        assert_eq!(status, 400, "{op}: {value}");
        assert_eq!(
            value["error"]["errors"][0]["location"], "body",
            "{op}: {value}"
        );
    }
    let (status, _) = root(&mut client, "getOverride", &name("api", "user_*")).await;
    assert_eq!(status, 200, "the refused delete kept the override");

    // A restart keeps them (the file), and /debug/config shows them.
    drop(client);
    drop(daemon);
    let daemon = start_kept();
    let mut client = Client::connect(daemon.addr).await;
    let (_, value) = root(&mut client, "getOverride", &name("api", "user_*")).await;
    assert_eq!(value["data"]["overrideId"], pattern_id.as_str(), "{value}");
    let (_, value) = root(&mut client, "getOverride", &name("api", "user_vip")).await;
    assert_eq!(
        value["error"]["status"], 404,
        "the deleted one stays deleted"
    );
    let (status, text) = client.send("GET", "/debug/config", "").await;
    assert_eq!(status, 200);
    let view: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(view["overrides"]["file"], path.as_str());
    assert_eq!(
        view["overrides"]["namespaces"]["api"][0]["identifier"], "user_*",
        "{view}"
    );
}

/// A configuration with two keys from `[auth]`: one that decides, one that reads overrides.
fn keyed_config(protect: bool) -> std::path::PathBuf {
    let text = format!(
        "[policies.api]\nlimits = [{{ algorithm = \"token_bucket\", count = 10, period = \"1m\" }}]\n\
         [auth]\nprotect_native = {protect}\nkeys = [\n\
           {{ name = \"decider\", sha256 = \"%DECIDER%\", permissions = [\"decide\"] }},\n\
           {{ name = \"reader\", sha256 = \"%READER%\", permissions = [\"read_overrides\"] }},\n]\n"
    );
    let text = text
        .replace(
            "%DECIDER%",
            "89455d58f808c17e99cbbe843e386d3b5ffdc15ab3d6c5b38b0048e03b82fa67",
        )
        .replace(
            "%READER%",
            "ec4408df15da46b328f6f3246fa723d0aa6cb0f0a0dd9c4626080ab1b02aa3b2",
        );
    support::temp_file(&format!("auth-{protect}.toml"), &text)
}

#[tokio::test]
async fn keys_from_the_file_carry_their_permissions_and_can_guard_the_native_api() {
    let config = keyed_config(true);
    let daemon = Daemon::start(&["--log-level", "warn", "--config", config.to_str().unwrap()]);
    let mut client = Client::connect(daemon.addr).await;
    // v2: each key does what its permissions say.
    let body = limit("api", "ada", 5, 60_000, None);
    let (status, _) = call(&mut client, "limit", Some("decider-key"), &body).await;
    assert_eq!(status, 200);
    let (status, value) = call(&mut client, "limit", Some("reader-key"), &body).await;
    assert_eq!(status, 403, "{value}");
    assert!(
        value["error"]["detail"]
            .as_str()
            .unwrap()
            .contains("decide"),
        "{value}"
    );
    let set = json!({"namespace": "api", "identifier": "x", "limit": 1, "duration": 60_000});
    let (status, _) = call(&mut client, "setOverride", Some("reader-key"), &set).await;
    assert_eq!(status, 403, "reading is not writing");
    let (status, _) = call(
        &mut client,
        "listOverrides",
        Some("reader-key"),
        &json!({"namespace": "api"}),
    )
    .await;
    assert_eq!(status, 200);
    // The native API: a decision needs `decide`, the views `read_overrides`; health is open.
    // Every native route is refused without a key (each handler checks it for itself).
    let v1 = json!({"policy": "api", "identifier": "ada"}).to_string();
    let native = [
        ("/v1/ratelimit", "POST"),
        ("/v1/ratelimit/many", "POST"),
        ("/v1/ratelimit/release", "POST"),
        ("/json", "POST"),
        ("/metrics", "GET"),
        ("/debug/config", "GET"),
        ("/debug/status", "GET"),
        ("/", "GET"),
    ];
    let unkeyed = native.map(|(path, method)| (None, path, method, 401));
    let wrong_permission = native.map(|(path, method)| {
        let decides = method == "POST";
        (
            Some(if decides { "reader-key" } else { "decider-key" }),
            path,
            method,
            403,
        )
    });
    for (key, path, method, want) in unkeyed.into_iter().chain(wrong_permission).chain([
        (Some("wrong"), "/v1/ratelimit", "POST", 401),
        (Some("decider-key"), "/v1/ratelimit", "POST", 200),
        (Some("reader-key"), "/debug/config", "GET", 200),
        (Some("reader-key"), "/", "GET", 200),
        (None, "/healthz", "GET", 200),
        (None, "/readyz", "GET", 200),
    ]) {
        let bearer = key.map(|k| format!("Bearer {k}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(b) = &bearer {
            headers.push(("authorization", b));
        }
        let body = if method == "POST" { v1.as_str() } else { "" };
        let reply = client.request(method, path, &headers, body).await;
        assert_eq!(
            reply.status.as_u16(),
            want,
            "{method} {path} with {key:?}: {}",
            reply.body
        );
        if want == 401 || want == 403 {
            let value: Value = serde_json::from_str(&reply.body).unwrap();
            let code = if want == 401 {
                "unauthorized"
            } else {
                "forbidden"
            };
            assert_eq!(value["error"]["code"], code, "{}", reply.body);
        }
    }
    drop(client);
    drop(daemon);
    // Unprotected (the default on loopback), the native API needs no key; v2 still does.
    let open = keyed_config(false);
    let daemon = Daemon::start(&["--log-level", "warn", "--config", open.to_str().unwrap()]);
    let mut client = Client::connect(daemon.addr).await;
    let (status, _) = client.send("POST", "/v1/ratelimit", &v1).await;
    assert_eq!(status, 200);
    let (status, _) = call(&mut client, "limit", None, &body).await;
    assert_eq!(status, 401);
}

#[test]
fn check_config_lists_the_overrides_kept_beside_the_file() {
    // A directory of its own: the other tests' daemons read the file beside their configuration.
    let dir = std::env::temp_dir().join(format!("limiterd-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("limiterd.toml");
    let policies = "[policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 10, period = \"1m\" }]\n";
    std::fs::write(&config, policies).unwrap();
    let overrides = config.with_file_name("limiterd-overrides.json");
    let entry = |id: &str| json!({"id": id, "identifier": id, "limit": 1, "duration_ms": 60_000});
    let table = json!({"api": {"a": entry("a"), "b*": entry("b*")}, "web": {"c": entry("c")}});
    std::fs::write(&overrides, table.to_string()).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .args(["check-config", config.to_str().unwrap()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("3 overrides in 2 namespaces (api, web)"),
        "{stdout}"
    );
}

#[tokio::test]
async fn keys_reload_with_the_file() {
    let with = |digest: &str| {
        format!(
            "[policies.api]\nlimits = [{{ algorithm = \"token_bucket\", count = 10, period = \"1m\" }}]\n\
             [auth]\nkeys = [{{ name = \"k\", sha256 = \"{digest}\", permissions = [\"decide\"] }}]\n"
        )
    };
    let config = support::temp_file(
        "reload-keys.toml",
        &with("762c08fc17a1cc5f00d248f8b50f2f2f4d17ff2934ac31e64deacb3f5bb3f2ec"),
    );
    let daemon = Daemon::start(&["--log-level", "warn", "--config", config.to_str().unwrap()]);
    let mut client = Client::connect(daemon.addr).await;
    let body = limit("api", "ada", 5, 60_000, None);
    assert_eq!(
        call(&mut client, "limit", Some("old-key"), &body).await.0,
        200
    );
    std::fs::write(
        &config,
        with("479a61d5370a0351ad498a8f324e0f9ad50bfafbe4c044ea49cbe3981e8cb573"),
    )
    .unwrap();
    daemon.signal("HUP");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while call(&mut client, "limit", Some("new-key"), &body).await.0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the new key was never accepted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert_eq!(
        call(&mut client, "limit", Some("old-key"), &body).await.0,
        401,
        "the old key is gone"
    );
}

#[tokio::test]
async fn a_namespace_holds_at_most_the_configured_overrides() {
    let config = support::temp_file(
        "max-overrides.toml",
        "[policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 10, period = \"1m\" }]\n[overrides]\nmax_per_namespace = 1\n",
    );
    // Its own overrides file (not the one beside the configuration other tests write).
    let kept = support::temp_file("max-overrides.json", "{}");
    let daemon = Daemon::start_with_env(
        &[
            "--log-level",
            "warn",
            "--config",
            config.to_str().unwrap(),
            "--overrides",
            kept.to_str().unwrap(),
        ],
        &[("LIMITERD_ROOT_KEY", KEY)],
    );
    let mut client = Client::connect(daemon.addr).await;
    let set = |namespace: &str, identifier: &str| json!({"namespace": namespace, "identifier": identifier, "limit": 1, "duration": 60_000});
    assert_eq!(
        root(&mut client, "setOverride", &set("api", "a")).await.0,
        200
    );
    assert_eq!(
        root(&mut client, "setOverride", &set("api", "a")).await.0,
        200,
        "changing one"
    );
    let (status, value) = root(&mut client, "setOverride", &set("api", "b")).await;
    assert_eq!(status, 400, "{value}");
    assert!(
        value["error"]["detail"]
            .as_str()
            .unwrap()
            .contains("max_per_namespace"),
        "{value}"
    );
    assert_eq!(
        root(&mut client, "setOverride", &set("web", "b")).await.0,
        200,
        "per namespace"
    );
}

#[tokio::test]
async fn v1_counting_as_unkey_does_shares_the_v2_budget() {
    let daemon = start();
    let mut client = Client::connect(daemon.addr).await;
    let v2 = limit("api", "ada", 3, 60_000, None);
    assert_eq!(
        root(&mut client, "limit", &v2).await.1["data"]["remaining"],
        2
    );
    let v1 = |algorithm: &str| json!({"namespace": "api", "identifier": "ada", "limit": 3, "duration_ms": 60_000, "algorithm": algorithm});
    let shared = client.decide(v1("sliding_window")).await;
    assert_eq!(
        (shared["success"].as_bool(), shared["remaining"].as_u64()),
        (Some(true), Some(1)),
        "{shared}"
    );
    assert_eq!(
        root(&mut client, "limit", &v2).await.1["data"]["remaining"],
        0
    );
    let (_, over) = root(&mut client, "limit", &v2).await;
    assert_eq!(over["data"]["success"], false, "{over}");
    assert_eq!(client.decide(v1("sliding_window")).await["success"], false);
    // The native default, a token bucket, is a budget of its own.
    assert_eq!(client.decide(v1("token_bucket")).await["remaining"], 2);
    let (status, refused) = client.post("/v1/ratelimit", &v1("leaky_bucket")).await;
    assert_eq!(
        (status, refused["error"]["field"].as_str()),
        (400, Some("algorithm")),
        "{refused}"
    );
}

/// v2 decisions feed the same metrics as v1: the latency histogram, and a refused request as
/// invalid.
#[tokio::test]
async fn v2_requests_are_counted_in_the_metrics() {
    let daemon = start();
    let mut client = Client::connect(daemon.addr).await;
    let metric = |text: &str, name: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    let (_, before) = client.send("GET", "/metrics", "").await;
    for _ in 0..3 {
        let (status, _) = root(&mut client, "limit", &limit("api", "ada", 5, 60_000, None)).await;
        assert_eq!(status, 200);
    }
    let (status, _) = root(&mut client, "multiLimit", &json!([])).await;
    assert_eq!(status, 400);
    let (_, after) = client.send("GET", "/metrics", "").await;
    let count = "limiterd_request_duration_seconds_count";
    assert_eq!(metric(&after, count) - metric(&before, count), 4, "{after}");
    let invalid = "limiterd_invalid_requests_total";
    assert_eq!(
        metric(&after, invalid) - metric(&before, invalid),
        1,
        "{after}"
    );
}
