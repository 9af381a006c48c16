//! unkey's v2 ratelimit API on a limiterd process, over a real socket, as unkey's SDKs call it
//! (`POST /v2/ratelimit.<op>`, a bearer key, JSON bodies): answers and refusals in unkey's
//! shapes, a key always required, counting by namespace, identifier and duration, and
//! `multiLimit` all or nothing. (The SDKs themselves drive it in `cargo xtask unkey`.)

#[allow(dead_code)]
mod support;

use serde_json::{Value, json};
use support::{Client, Daemon};

const KEY: &str = "unkey_test_root_key";

async fn call(client: &mut Client, op: &str, key: Option<&str>, body: &Value) -> (u16, Value) {
    let bearer = key.map(|k| format!("Bearer {k}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer));
    }
    let reply = client
        .request(
            "POST",
            &format!("/v2/ratelimit.{op}"),
            &headers,
            &body.to_string(),
        )
        .await;
    assert_eq!(
        reply.header("content-type"),
        Some("application/json"),
        "{}",
        reply.body
    );
    let value: Value = serde_json::from_str(&reply.body).expect("JSON");
    let id = value["meta"]["requestId"].as_str().expect("a request id");
    assert!(id.starts_with("req_"), "{id}");
    (reply.status.as_u16(), value)
}

fn limit(namespace: &str, identifier: &str, limit: u64, duration: u64, cost: Option<u64>) -> Value {
    let mut body = json!({"namespace": namespace, "identifier": identifier, "limit": limit, "duration": duration});
    if let Some(cost) = cost {
        body["cost"] = json!(cost);
    }
    body
}

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
        (limit("api", "ada", 5, 60_000, Some(6)), "body.cost"),
        (
            json!({"namespace": "api", "identifier": "ada", "limit": -1, "duration": 60_000}),
            "body.limit",
        ),
        (
            json!({"namespace": "api", "identifier": "ada", "limit": 5}),
            "body",
        ),
    ] {
        let (status, value) = call(&mut client, "limit", Some(KEY), &bad).await;
        assert_eq!(status, 400, "{bad}: {value}");
        let errors = value["error"]["errors"].as_array().expect("errors");
        assert_eq!(errors[0]["location"], location, "{bad}: {value}");
    }
    let (status, value) = call(&mut client, "multiLimit", Some(KEY), &json!([])).await;
    assert_eq!(status, 400, "{value}");
}

#[tokio::test]
async fn limits_count_by_namespace_identifier_and_duration() {
    let daemon = start();
    let mut client = Client::connect(daemon.addr).await;
    let mut ids = std::collections::HashSet::new();
    let mut seen = Vec::new();
    for _ in 0..3 {
        let (status, value) = call(
            &mut client,
            "limit",
            Some(KEY),
            &limit("api", "ada", 2, 60_000, None),
        )
        .await;
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
        assert!(
            data["reset"].as_u64().unwrap() > 1_700_000_000_000,
            "Unix ms: {value}"
        );
    }
    assert_eq!(seen, [(true, 1), (true, 0), (false, 0)]);
    // Cost 0 only reports (0 more units always fit, as unkey answers); another duration is
    // another counter; another namespace too.
    let (_, value) = call(
        &mut client,
        "limit",
        Some(KEY),
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
        let (_, value) = call(&mut client, "limit", Some(KEY), &other).await;
        assert_eq!(value["data"]["success"], true, "{other}");
    }
    // Another limit on the same window keeps what was used (2 of 2 is 4 of 4).
    let (_, value) = call(
        &mut client,
        "limit",
        Some(KEY),
        &limit("api", "ada", 4, 60_000, None),
    )
    .await;
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
    let (_, value) = call(
        &mut client,
        "limit",
        Some(KEY),
        &limit("api", "bob", 1, 60_000, None),
    )
    .await;
    assert_eq!(value["data"]["success"], true);
    let both = json!([
        limit("api", "ada", 3, 60_000, Some(2)),
        limit("api", "bob", 1, 60_000, None)
    ]);
    let (status, value) = call(&mut client, "multiLimit", Some(KEY), &both).await;
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
    let (_, value) = call(
        &mut client,
        "limit",
        Some(KEY),
        &limit("api", "ada", 3, 60_000, Some(3)),
    )
    .await;
    assert_eq!(value["data"]["success"], true, "{value}");
    let (_, value) = call(
        &mut client,
        "multiLimit",
        Some(KEY),
        &json!([limit("api", "cy", 3, 60_000, None)]),
    )
    .await;
    assert_eq!(value["data"]["passed"], true, "{value}");
}
