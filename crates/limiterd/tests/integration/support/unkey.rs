//! unkey's v2 API as the process tests call it: a call with or without the root key, checked
//! for unkey's shape (JSON, a request id), and the bodies they send.

use serde_json::{Value, json};

use super::Client;

/// The root key the tests start limiterd with (`LIMITERD_ROOT_KEY`).
pub(crate) const KEY: &str = "unkey_test_root_key";

/// A v2 call with the root key.
pub(crate) async fn root(client: &mut Client, op: &str, body: &Value) -> (u16, Value) {
    call(client, op, Some(KEY), body).await
}

/// A v2 call with `key` as the bearer (none: no `authorization`), its status and JSON body.
pub(crate) async fn call(
    client: &mut Client,
    op: &str,
    key: Option<&str>,
    body: &Value,
) -> (u16, Value) {
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

/// A `limit` body.
pub(crate) fn limit(
    namespace: &str,
    identifier: &str,
    limit: u64,
    duration: u64,
    cost: Option<u64>,
) -> Value {
    let mut body = json!({"namespace": namespace, "identifier": identifier, "limit": limit, "duration": duration});
    if let Some(cost) = cost {
        body["cost"] = json!(cost);
    }
    body
}

/// A body naming one override.
pub(crate) fn name(namespace: &str, identifier: &str) -> Value {
    json!({"namespace": namespace, "identifier": identifier})
}
