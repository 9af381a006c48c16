//! unkey's v2 ratelimit API, so unkey's own SDKs (`@unkey/api`, `@unkey/ratelimit`) work
//! against limiterd unchanged: `POST /v2/ratelimit.limit` and `POST /v2/ratelimit.multiLimit`,
//! each behind a key ([`super::keys`]; the v2 API always requires one), each answer
//! `{meta: {requestId}, data}` and each refusal `{meta, error: {title, detail, status, type,
//! errors?}}` as the SDK's generated models read them.
//!
//! Counting is unkey's: a sliding window, keyed by namespace, identifier and duration (not by
//! the limit, so a caller that sends another limit keeps its consumption, rescaled), on the
//! engine's ad-hoc limits, in memory or on Redis with the store's failure policy. A
//! `multiLimit` is all or nothing, as `/v1/ratelimit/many`: a failed check takes nothing.
//! `reset` is when the caller's next unit is admitted (a denial; the SDK caches a denial until
//! then) or when the limit is full again (an admission), in Unix ms.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use limiter_core::Clock;
use limiter_stack::{Charge, Kind};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::api::read_body;
use super::keys::{Keys, Refused};
use super::request::{MAX_BATCH, MAX_DURATION_MS, MAX_IDENTIFIER, MAX_NAMESPACE};
use crate::engine::{Answer, DecideError, Item, Target};
use crate::ops::live::Live;

/// The shortest duration unkey accepts, in ms.
pub const MIN_DURATION_MS: u64 = 1_000;

struct Shared<C> {
    live: Arc<Live<C>>,
    keys: Keys,
}

/// The v2 routes over `live`, accepting `keys`.
pub fn router<C: Clock + Clone + Send + Sync + 'static>(live: Arc<Live<C>>, keys: Keys) -> Router {
    Router::new()
        .route("/v2/ratelimit.limit", post(limit::<C>))
        .route("/v2/ratelimit.multiLimit", post(multi_limit::<C>))
        .with_state(Arc::new(Shared { live, keys }))
}

/// A fresh request id: the process's start and a count, so no two answers share one.
fn request_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static START: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // Wall time names the process in its ids, nothing more.
    let start = START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    // Relaxed: ids only need to differ, and no decision reads this counter.
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("req_{start:x}{n:012x}")
}

/// One problem with the input, as unkey's `errors` list names it.
#[derive(Debug, Serialize)]
struct Problem {
    location: String,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    fix: Option<String>,
}

/// A refusal, written in unkey's shape when it becomes the response.
struct Refusal {
    status: StatusCode,
    detail: String,
    problems: Vec<Problem>,
}

fn refusal(status: StatusCode, detail: String, problems: Vec<Problem>) -> Refusal {
    Refusal {
        status,
        detail,
        problems,
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let Self {
            status,
            detail,
            problems,
        } = self;
        write_refusal(status, detail, problems)
    }
}

fn write_refusal(status: StatusCode, detail: String, problems: Vec<Problem>) -> Response {
    let (title, kind) = match status {
        StatusCode::BAD_REQUEST => ("Bad Request", "application/invalid_input"),
        StatusCode::UNAUTHORIZED => ("Unauthorized", "authentication/key_not_found"),
        StatusCode::FORBIDDEN => ("Forbidden", "authorization/insufficient_permissions"),
        _ => ("Service Unavailable", "application/service_unavailable"),
    };
    let mut error = json!({
        "title": title,
        "detail": detail,
        "status": status.as_u16(),
        "type": format!("https://unkey.com/docs/errors/unkey/{kind}"),
    });
    if status == StatusCode::BAD_REQUEST {
        error["errors"] = serde_json::to_value(problems).unwrap_or(Value::Array(Vec::new()));
    }
    answer(
        status,
        json!({ "meta": { "requestId": request_id() }, "error": error }),
    )
}

fn answer(status: StatusCode, body: Value) -> Response {
    let body = serde_json::to_vec(&body).unwrap_or_default();
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn invalid(location: String, message: String, fix: &str) -> Refusal {
    let problem = Problem {
        location,
        message: message.clone(),
        fix: Some(fix.to_owned()),
    };
    refusal(StatusCode::BAD_REQUEST, message, vec![problem])
}

/// The caller's key, if it may decide.
fn authorized(keys: &Keys, headers: &HeaderMap) -> Result<(), Refusal> {
    let presented = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    match keys.check(presented) {
        Ok(key) if key.permissions.decide => Ok(()),
        Ok(key) => Err(refusal(
            StatusCode::FORBIDDEN,
            format!("the key `{}` may not ask for decisions: give it the `decide` permission", key.name),
            Vec::new(),
        )),
        Err(Refused::Missing) => Err(refusal(
            StatusCode::UNAUTHORIZED,
            "send your key as `Authorization: Bearer <key>` (the SDK's `rootKey`)".into(),
            Vec::new(),
        )),
        Err(Refused::Unknown) => Err(refusal(
            StatusCode::UNAUTHORIZED,
            "this key is not one limiterd accepts: use a key from its configuration or `LIMITERD_ROOT_KEY`".into(),
            Vec::new(),
        )),
    }
}

/// One limit as the SDK sends it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    namespace: String,
    identifier: String,
    limit: u64,
    duration: u64,
    #[serde(default)]
    cost: Option<u64>,
}

/// A checked limit: the engine item and the namespace the answer repeats.
struct Checked {
    item: Item,
    namespace: String,
}

fn check(raw: RawLimit, at: &str) -> Result<Checked, Refusal> {
    let field = |name: &str| format!("{at}.{name}");
    if raw.namespace.is_empty() || raw.namespace.len() > MAX_NAMESPACE {
        return Err(invalid(
            field("namespace"),
            format!("`namespace` must be 1 to {MAX_NAMESPACE} bytes"),
            "name the namespace your limits are counted in, such as \"api\"",
        ));
    }
    if raw.identifier.is_empty() || raw.identifier.len() > MAX_IDENTIFIER {
        return Err(invalid(
            field("identifier"),
            format!("`identifier` must be 1 to {MAX_IDENTIFIER} bytes"),
            "send who is limited: a user id, an IP address",
        ));
    }
    if raw.limit == 0 {
        return Err(invalid(
            field("limit"),
            "`limit` must be at least 1".into(),
            "send a positive limit",
        ));
    }
    if raw.duration < MIN_DURATION_MS || raw.duration > MAX_DURATION_MS {
        return Err(invalid(
            field("duration"),
            format!(
                "`duration` {} ms is outside {MIN_DURATION_MS} to {MAX_DURATION_MS} ms",
                raw.duration
            ),
            "send the window in milliseconds, at least 1000",
        ));
    }
    let cost = raw.cost.unwrap_or(1);
    if cost > raw.limit {
        return Err(invalid(
            field("cost"),
            format!(
                "`cost` {cost} is above `limit` {}, so it could never succeed",
                raw.limit
            ),
            "send a cost no greater than the limit (0 only reports)",
        ));
    }
    // Keyed by namespace, identifier and duration (never by the limit).
    let engine_namespace = format!("{}ms:{}", raw.duration, raw.namespace);
    Ok(Checked {
        item: Item {
            target: Target::AdHoc {
                kind: Kind::SlidingWindow,
                limit: raw.limit,
                duration_ms: raw.duration,
                namespace: engine_namespace,
            },
            identifier: raw.identifier,
            cost,
            shadow: false,
            charge: Charge::Take,
        },
        namespace: raw.namespace,
    })
}

/// `reset` of an answer: when the next unit is admitted (denied) or the limit is full again.
fn reset_ms(answer: &Answer) -> u64 {
    let d = &answer.decision;
    if d.is_allowed() {
        answer.reset_at_ms()
    } else {
        answer
            .at_unix_ns
            .saturating_add(d.retry_after_nanos())
            .div_ceil(1_000_000)
    }
}

fn decide_refusal(e: DecideError) -> Refusal {
    match e {
        DecideError::Invalid { field, message } => invalid(
            format!("body.{field}"),
            message,
            "send a limit the store can count",
        ),
        DecideError::TooManyShapes => invalid(
            "body.limit".into(),
            e.to_string(),
            "use fewer distinct limit and duration pairs",
        ),
        DecideError::Full(_) | DecideError::Unavailable(_) => {
            refusal(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), Vec::new())
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Refusal> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        let location = if path == "." {
            "body".to_owned()
        } else {
            format!("body.{path}")
        };
        invalid(
            location,
            e.inner().to_string(),
            "send the body the SDK's types describe",
        )
    })?;
    deserializer
        .end()
        .map_err(|e| invalid("body".into(), e.to_string(), "send one JSON value"))?;
    Ok(value)
}

/// The body of an authorized call; any body that cannot be read is a 400 (the SDK retries a
/// 5xx for seconds, and a bad body would fail again).
async fn read<C>(
    shared: &Shared<C>,
    headers: &HeaderMap,
    body: Body,
    timeout: Duration,
) -> Result<axum::body::Bytes, Refusal> {
    authorized(&shared.keys, headers)?;
    read_body(headers, body, timeout).await.map_err(|e| {
        let problem = Problem {
            location: "body".into(),
            message: e.message.clone(),
            fix: None,
        };
        refusal(StatusCode::BAD_REQUEST, e.message, vec![problem])
    })
}

async fn limit<C: Clock + Clone + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let state = shared.live.current();
    let bytes = match read(&shared, &headers, body, state.config.server.body_timeout).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused.into_response(),
    };
    let checked = match parse::<RawLimit>(&bytes).and_then(|raw| check(raw, "body")) {
        Ok(checked) => checked,
        Err(refused) => return refused.into_response(),
    };
    match state
        .engine
        .decide(std::slice::from_ref(&checked.item))
        .await
    {
        Ok((_, answers)) => {
            let Some(a) = answers.first() else {
                let detail = "the store gave no answer".into();
                return write_refusal(StatusCode::SERVICE_UNAVAILABLE, detail, Vec::new());
            };
            answer(
                StatusCode::OK,
                json!({
                    "meta": { "requestId": request_id() },
                    "data": {
                        "limit": a.decision.limit(),
                        "remaining": a.decision.remaining(),
                        "reset": reset_ms(a),
                        "success": a.decision.is_allowed(),
                    }
                }),
            )
        }
        Err(e) => decide_refusal(e).into_response(),
    }
}

async fn multi_limit<C: Clock + Clone + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let state = shared.live.current();
    let bytes = match read(&shared, &headers, body, state.config.server.body_timeout).await {
        Ok(bytes) => bytes,
        Err(refused) => return refused.into_response(),
    };
    let raw = match parse::<Vec<RawLimit>>(&bytes) {
        Ok(raw) => raw,
        Err(refused) => return refused.into_response(),
    };
    if raw.is_empty() || raw.len() > MAX_BATCH {
        return invalid(
            "body".into(),
            format!("send 1 to {MAX_BATCH} limits, not {}", raw.len()),
            "split the checks into batches of at most 100",
        )
        .into_response();
    }
    let mut checked = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        match check(r, &format!("body[{i}]")) {
            Ok(c) => checked.push(c),
            Err(refused) => return refused.into_response(),
        }
    }
    let items: Vec<Item> = checked.iter().map(|c| c.item.clone()).collect();
    match state.engine.decide(&items).await {
        Ok((passed, answers)) => {
            let limits: Vec<Value> = checked
                .iter()
                .zip(&answers)
                .map(|(c, a)| {
                    json!({
                        "namespace": c.namespace,
                        "identifier": c.item.identifier,
                        "limit": a.decision.limit(),
                        "remaining": a.decision.remaining(),
                        "reset": reset_ms(a),
                        "passed": a.decision.is_allowed(),
                    })
                })
                .collect();
            answer(
                StatusCode::OK,
                json!({
                    "meta": { "requestId": request_id() },
                    "data": { "passed": passed, "limits": limits }
                }),
            )
        }
        Err(e) => decide_refusal(e).into_response(),
    }
}
