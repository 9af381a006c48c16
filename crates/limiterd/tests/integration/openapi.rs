//! The OpenAPI document limiterd serves at `/openapi.json` (kept in `crates/limiterd/api/`)
//! against real responses: every endpoint is called over a real socket, in each of its
//! documented outcomes, and each answer is checked against the schema the document gives for
//! that path, method, status and content type. The checker below knows the JSON Schema
//! keywords the document uses and refuses any other, so a keyword it cannot check never passes
//! silently.

use crate::support::{Client, Daemon, temp_file};
use limiter_testkit::redis_server::RedisServer;
use serde_json::{Value, json};

/// Checks `value` against `schema` (resolving `$ref` in `doc`); the path of each mismatch.
fn check(doc: &Value, schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(schema) = schema.as_object() else {
        errors.push(format!("{at}: the schema is not an object"));
        return;
    };
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let path = reference.trim_start_matches("#/");
        let target = path.split('/').fold(doc, |v, part| &v[part]);
        assert!(!target.is_null(), "{reference} does not resolve");
        return check(doc, target, value, at, errors);
    }
    for keyword in schema.keys() {
        assert!(
            [
                "type",
                "required",
                "properties",
                "additionalProperties",
                "enum",
                "items",
                "minimum",
                "maxItems",
                "description"
            ]
            .contains(&keyword.as_str()),
            "{at}: the checker does not know the keyword `{keyword}`"
        );
    }
    if let Some(kind) = schema.get("type") {
        let kinds: Vec<&str> = match kind {
            Value::String(k) => vec![k.as_str()],
            Value::Array(ks) => ks.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        let fits = |k: &str| match k {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "boolean" => value.is_boolean(),
            "integer" => value.is_u64() || value.is_i64(),
            "number" => value.is_number(),
            "null" => value.is_null(),
            other => panic!("unknown type {other}"),
        };
        if !kinds.iter().any(|k| fits(k)) {
            errors.push(format!("{at}: {value} is not {kinds:?}"));
            return;
        }
    }
    if let Some(options) = schema.get("enum").and_then(Value::as_array)
        && !options.contains(value)
    {
        errors.push(format!("{at}: {value} is not one of {options:?}"));
    }
    if let (Some(least), Some(n)) = (
        schema.get("minimum").and_then(Value::as_i64),
        value.as_i64(),
    ) && n < least
    {
        errors.push(format!("{at}: {n} is below {least}"));
    }
    if let Some(items) = value.as_array() {
        if let Some(most) = schema.get("maxItems").and_then(Value::as_u64)
            && items.len() as u64 > most
        {
            errors.push(format!("{at}: more than {most} items"));
        }
        if let Some(item) = schema.get("items") {
            for (i, v) in items.iter().enumerate() {
                check(doc, item, v, &format!("{at}[{i}]"), errors);
            }
        }
    }
    if let Some(object) = value.as_object() {
        for field in schema
            .get("required")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let field = field.as_str().unwrap_or_default();
            if !object.contains_key(field) {
                errors.push(format!("{at}: `{field}` is missing"));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (key, v) in object {
            let at = format!("{at}.{key}");
            match (
                properties.and_then(|p| p.get(key)),
                schema.get("additionalProperties"),
            ) {
                (Some(property), _) => check(doc, property, v, &at, errors),
                (None, Some(Value::Bool(false))) => {
                    errors.push(format!("{at}: not in the document"));
                }
                (None, Some(extra)) if extra.is_object() => check(doc, extra, v, &at, errors),
                (None, _) => {}
            }
        }
    }
}

/// The schema for `method path` answering `status` with `content_type`, from the document.
fn response_schema<'a>(
    doc: &'a Value,
    method: &str,
    path: &str,
    status: u16,
    content_type: &str,
) -> &'a Value {
    let operation = &doc["paths"][path][method.to_lowercase()];
    assert!(!operation.is_null(), "{method} {path} is not documented");
    let mut response = &operation["responses"][status.to_string()];
    assert!(
        !response.is_null(),
        "{method} {path} answered {status}, which is not documented"
    );
    if let Some(reference) = response.get("$ref").and_then(Value::as_str) {
        response = reference
            .trim_start_matches("#/")
            .split('/')
            .fold(doc, |v, part| &v[part]);
    }
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    let schema = &response["content"][essence]["schema"];
    assert!(
        !schema.is_null(),
        "{method} {path} {status} answered {essence}, which is not documented"
    );
    schema
}

/// Sends one request and checks the answer against the document; the answer's status and
/// body.
async fn call(
    doc: &Value,
    client: &mut Client,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let reply = client.request(method, path, headers, body).await;
    let status = reply.status.as_u16();
    let content_type = reply
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let schema = response_schema(doc, method, path, status, &content_type);
    let value = if content_type.starts_with("application/json") {
        serde_json::from_str(&reply.body)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {}", reply.body))
    } else {
        Value::String(reply.body.clone())
    };
    let mut errors = Vec::new();
    check(doc, schema, &value, "$", &mut errors);
    assert!(
        errors.is_empty(),
        "{method} {path} {status} does not match the document: {errors:#?}\n{}",
        reply.body
    );
    (status, reply.body)
}

fn the_document() -> Value {
    serde_json::from_str(limiterd::http::OPENAPI).expect("the document is JSON")
}

#[tokio::test]
async fn every_endpoint_answers_as_the_document_says() {
    let doc = the_document();
    let descriptors = temp_file(
        "openapi.yaml",
        "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: { unit: hour, requests_per_unit: 1 }\n",
    );
    let daemon = Daemon::start_with_env(
        &[
            "--envoy",
            descriptors.to_str().expect("UTF-8"),
            "--grpc-listen",
            "127.0.0.1:0",
        ],
        &[("LIMITERD_ROOT_KEY", "openapi-key")],
    );
    let mut client = Client::connect(daemon.addr).await;
    let json_type = [("content-type", "application/json")];
    let post = |body: Value| body.to_string();

    // The served document is the one in the repository.
    let (status, served) = call(&doc, &mut client, "GET", "/openapi.json", &[], "").await;
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_str::<Value>(&served).expect("JSON"), doc);

    for (method, path, body, want) in [
        (
            "POST",
            "/v1/ratelimit",
            post(json!({"policy": "api", "identifier": "u"})),
            200,
        ),
        (
            "POST",
            "/v1/ratelimit",
            post(
                json!({"namespace": "n", "identifier": "u", "limit": 2, "duration_ms": 60_000, "cost": 0}),
            ),
            200,
        ),
        (
            "POST",
            "/v1/ratelimit",
            post(json!({"policy": "nope", "identifier": "u"})),
            400,
        ),
        ("POST", "/v1/ratelimit", post(json!({"policy": "api"})), 400),
        (
            "POST",
            "/v1/ratelimit",
            post(json!({"policy": "api", "identifier": "r", "cost": 500, "record": true})),
            200,
        ),
        (
            "POST",
            "/v1/ratelimit",
            post(json!({"policy": "api", "identifier": "t", "time": 1_000})),
            400,
        ),
        (
            "POST",
            "/v1/ratelimit",
            post(json!({"policy": "api", "identifier": "t", "time": u64::MAX / 2_000_000})),
            400,
        ),
        ("POST", "/v1/ratelimit", "x".repeat(70_000), 413),
        // The built-in `exports` policy limits concurrency: its answer carries a permit.
        (
            "POST",
            "/v1/ratelimit",
            post(json!({"policy": "exports", "identifier": "e"})),
            200,
        ),
        (
            "POST",
            "/v1/ratelimit/release",
            post(json!({"policy": "exports", "identifier": "e", "permit": "0123456789abcdef1"})),
            200,
        ),
        (
            "POST",
            "/v1/ratelimit/release",
            post(json!({"policy": "nope", "identifier": "e", "permit": "x"})),
            400,
        ),
        (
            "POST",
            "/v1/ratelimit/release",
            post(json!({"policy": "api", "identifier": "e", "permit": "x"})),
            400,
        ),
        (
            "POST",
            "/v1/ratelimit/many",
            post(
                json!({"requests": [{"policy": "login", "identifier": "u", "cost": 3}, {"policy": "login", "identifier": "u", "cost": 3}]}),
            ),
            200,
        ),
        (
            "POST",
            "/v1/ratelimit/many",
            post(json!({"requests": [{"policy": "api"}]})),
            400,
        ),
        (
            "POST",
            "/json",
            post(
                json!({"domain": "web", "descriptors": [{"entries": [{"key": "ip", "value": "1"}]}]}),
            ),
            200,
        ),
        (
            "POST",
            "/json",
            post(
                json!({"domain": "web", "descriptors": [{"entries": [{"key": "ip", "value": "1"}]}]}),
            ),
            429,
        ),
        ("POST", "/json", post(json!({"descriptors": []})), 400),
        ("GET", "/healthz", String::new(), 200),
        ("GET", "/readyz", String::new(), 200),
        ("GET", "/healthcheck", String::new(), 200),
        ("GET", "/metrics", String::new(), 200),
        ("GET", "/debug/config", String::new(), 200),
        ("GET", "/debug/status", String::new(), 200),
        ("GET", "/", String::new(), 200),
    ] {
        let (status, text) = call(&doc, &mut client, method, path, &json_type, &body).await;
        assert_eq!(status, want, "{method} {path}: {text}");
    }

    // unkey's v2 API: with the key, without it, and bad input, each as documented.
    let keyed = [
        ("content-type", "application/json"),
        ("authorization", "Bearer openapi-key"),
    ];
    let v2 = |limit: u64| json!({"namespace": "n", "identifier": "u", "limit": limit, "duration": 60_000});
    for (path, headers, body, want) in [
        ("/v2/ratelimit.limit", &keyed[..], post(v2(1)), 200),
        ("/v2/ratelimit.limit", &keyed[..], post(v2(1)), 200),
        ("/v2/ratelimit.limit", &keyed[..], post(v2(0)), 400),
        ("/v2/ratelimit.limit", &json_type[..], post(v2(1)), 401),
        (
            "/v2/ratelimit.multiLimit",
            &keyed[..],
            post(json!([v2(5), v2(1)])),
            200,
        ),
        ("/v2/ratelimit.multiLimit", &keyed[..], post(json!([])), 400),
        (
            "/v2/ratelimit.multiLimit",
            &json_type[..],
            post(json!([v2(1)])),
            401,
        ),
        (
            "/v2/ratelimit.setOverride",
            &keyed[..],
            post(json!({"namespace": "n", "identifier": "u*", "limit": 3, "duration": 60_000})),
            200,
        ),
        (
            "/v2/ratelimit.getOverride",
            &keyed[..],
            post(json!({"namespace": "n", "identifier": "u*"})),
            200,
        ),
        (
            "/v2/ratelimit.getOverride",
            &keyed[..],
            post(json!({"namespace": "n", "identifier": "v"})),
            404,
        ),
        (
            "/v2/ratelimit.listOverrides",
            &keyed[..],
            post(json!({"namespace": "n"})),
            200,
        ),
        ("/v2/ratelimit.limit", &keyed[..], post(v2(1)), 200),
        (
            "/v2/ratelimit.deleteOverride",
            &keyed[..],
            post(json!({"namespace": "n", "identifier": "u*"})),
            200,
        ),
        (
            "/v2/ratelimit.setOverride",
            &keyed[..],
            post(json!({"namespace": "n", "identifier": "u", "limit": 0, "duration": 60_000})),
            400,
        ),
    ] {
        let (status, text) = call(&doc, &mut client, "POST", path, headers, &body).await;
        assert_eq!(status, want, "POST {path}: {text}");
    }

    // 415 in the error shape too; a wrong method (405) or path (404) has no operation in the
    // document, so its answer is checked against the error schema directly.
    let (status, _) = call(
        &doc,
        &mut client,
        "POST",
        "/v1/ratelimit",
        &[("content-type", "text/plain")],
        "{}",
    )
    .await;
    assert_eq!(status, 415);
    for (method, path, want) in [("GET", "/v1/ratelimit", 405), ("GET", "/nope", 404)] {
        let reply = client.request(method, path, &[], "").await;
        assert_eq!(reply.status.as_u16(), want);
        let value: Value = serde_json::from_str(&reply.body).expect("JSON");
        let mut errors = Vec::new();
        check(
            &doc,
            &doc["components"]["schemas"]["Error"],
            &value,
            "$",
            &mut errors,
        );
        assert!(errors.is_empty(), "{method} {path}: {errors:?}");
    }
}

#[tokio::test]
async fn store_failures_and_readiness_answer_as_the_document_says() {
    let doc = the_document();
    let mut server = RedisServer::start();
    let config = temp_file(
        &format!("openapi-redis-{}.toml", server.port),
        &format!(
            "[store]\nkind = \"redis\"\nurl = \"{}\"\ntimeout_ms = 200\non_failure = \"closed\"\n[policies.api]\nlimits = [{{ algorithm = \"fixed_window\", count = 5, period = \"1h\" }}]\n[policies.leased]\nlimits = [{{ algorithm = \"token_bucket\", count = 1000, period = \"1h\" }}]\nlease_slack = \"10%\"\n",
            server.url()
        ),
    );
    let daemon = Daemon::start(&["--config", config.to_str().expect("UTF-8")]);
    let mut client = Client::connect(daemon.addr).await;
    let json_type = [("content-type", "application/json")];
    // Answers made against a lease are in the document too, as are records on Redis.
    let mut sources = std::collections::BTreeSet::new();
    for body in [
        json!({"policy": "leased", "identifier": "l"}),
        json!({"policy": "leased", "identifier": "l"}),
        json!({"policy": "leased", "identifier": "l"}),
        json!({"policy": "leased", "identifier": "l", "cost": 2, "record": true}),
        json!({"policy": "api", "identifier": "r", "cost": 9, "record": true}),
    ] {
        let (status, text) = call(
            &doc,
            &mut client,
            "POST",
            "/v1/ratelimit",
            &json_type,
            &body.to_string(),
        )
        .await;
        assert_eq!(status, 200, "{text}");
        let answer: Value = serde_json::from_str(&text).expect("JSON");
        sources.insert(answer["source"].as_str().unwrap_or_default().to_owned());
    }
    assert!(
        sources.contains("lease") && sources.contains("redis"),
        "{sources:?}"
    );
    let body = json!({"policy": "api", "identifier": "u"}).to_string();
    let (status, _) = call(
        &doc,
        &mut client,
        "POST",
        "/v1/ratelimit",
        &json_type,
        &body,
    )
    .await;
    assert_eq!(status, 200);
    server.kill();
    let (status, text) = call(
        &doc,
        &mut client,
        "POST",
        "/v1/ratelimit",
        &json_type,
        &body,
    )
    .await;
    assert_eq!(status, 503, "{text}");
    // Readiness follows the probe (once a second): 503 in the documented shape.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (status, _) = call(&doc, &mut client, "GET", "/readyz", &[], "").await;
        if status == 503 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never not ready");
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let (status, _) = call(&doc, &mut client, "GET", "/healthcheck", &[], "").await;
    assert_eq!(status, 500);
}

#[test]
fn the_checker_finds_what_does_not_match() {
    let doc = the_document();
    let outcome = &doc["components"]["schemas"]["Outcome"];
    let good = json!({"success": true, "limit": 5, "remaining": 4, "current": 1, "reset_at_ms": 1, "retry_after_ms": 0, "source": "memory"});
    let mut errors = Vec::new();
    check(&doc, outcome, &good, "$", &mut errors);
    assert!(errors.is_empty(), "{errors:?}");
    for (bad, says) in [
        (json!({"success": true}), "`limit` is missing"),
        (
            json!({"success": "yes", "limit": 5, "remaining": 4, "current": 1, "reset_at_ms": 1, "retry_after_ms": 0, "source": "memory"}),
            "is not [\"boolean\"]",
        ),
        (
            json!({"success": true, "limit": 5, "remaining": 4, "current": 1, "reset_at_ms": 1, "retry_after_ms": 0, "source": "disk"}),
            "is not one of",
        ),
        (
            json!({"success": true, "limit": -1, "remaining": 4, "current": 1, "reset_at_ms": 1, "retry_after_ms": 0, "source": "memory"}),
            "below 0",
        ),
        (
            json!({"success": true, "limit": 5, "remaining": 4, "current": 1, "reset_at_ms": 1, "retry_after_ms": 0, "source": "memory", "extra": 1}),
            "not in the document",
        ),
    ] {
        let mut errors = Vec::new();
        check(&doc, outcome, &bad, "$", &mut errors);
        assert!(errors.iter().any(|e| e.contains(says)), "{bad}: {errors:?}");
    }
}
