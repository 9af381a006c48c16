//! unkey's v2 ratelimit API, so unkey's own SDKs (`@unkey/api`, `@unkey/ratelimit`) work
//! against limiterd unchanged: `POST /v2/ratelimit.<op>`, each behind a key ([`crate::config::keys`];
//! the v2 API always requires one, with the permission the operation needs), each answer
//! `{meta: {requestId}, data}` and each refusal `{meta, error: {title, detail, status, type,
//! errors?}}` as the SDK's generated models read them.
//!
//! Its parts: `limit.rs` (`limit` and `multiLimit`, decided on the engine with the override
//! that applies) and `overrides.rs` (`setOverride`, `getOverride`, `deleteOverride`,
//! `listOverrides`, on [`crate::ops::overrides`]).

use crate::app::AppState;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use limiter_core::Clock;
use limiter_input::JsonErrorKind;
use serde::Serialize;
use serde_json::{Value, json};

use super::body::read_body;
use super::request::{MAX_DURATION_MS, MAX_IDENTIFIER, MAX_NAMESPACE};
use crate::config::keys::{Keys, Permissions, Refused};
use crate::ops::live::Live;

mod limit;
mod overrides;

/// The shortest duration unkey accepts, in ms.
pub const MIN_DURATION_MS: u64 = 1_000;

struct Shared<C> {
    live: Arc<Live<C>>,
}

/// The v2 routes over `live`, accepting the keys its serving state holds.
pub fn router<C: Clock + Clone + Send + Sync + 'static>(live: Arc<Live<C>>) -> Router {
    Router::new()
        .route("/v2/ratelimit.limit", post(limit::limit::<C>))
        .route("/v2/ratelimit.multiLimit", post(limit::multi_limit::<C>))
        .route("/v2/ratelimit.setOverride", post(overrides::set::<C>))
        .route("/v2/ratelimit.getOverride", post(overrides::get::<C>))
        .route("/v2/ratelimit.deleteOverride", post(overrides::delete::<C>))
        .route("/v2/ratelimit.listOverrides", post(overrides::list::<C>))
        .with_state(Arc::new(Shared { live }))
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
        StatusCode::NOT_FOUND => ("Not Found", "data/ratelimit_override_not_found"),
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
    super::body::json_response(status, body)
}

fn invalid(location: String, message: String, fix: &str) -> Refusal {
    let problem = Problem {
        location,
        message: message.clone(),
        fix: Some(fix.to_owned()),
    };
    refusal(StatusCode::BAD_REQUEST, message, vec![problem])
}

/// What an operation needs of a key: the permission, and its name for the refusal.
type Needs = (fn(&Permissions) -> bool, &'static str);

const DECIDE: Needs = (|p| p.decide, "decide");
const READ_OVERRIDES: Needs = (|p| p.read_overrides, "read_overrides");
const WRITE_OVERRIDES: Needs = (|p| p.write_overrides, "write_overrides");

/// The caller's key, if it has the permission `needs`.
fn authorized(keys: &Keys, headers: &HeaderMap, needs: Needs) -> Result<(), Refusal> {
    let presented = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    let (has, name) = needs;
    match keys.check(presented) {
        Ok(key) if has(&key.permissions) => Ok(()),
        Ok(key) => Err(refusal(
            StatusCode::FORBIDDEN,
            format!(
                "the key `{}` lacks the `{name}` permission this operation needs: use a key that has it",
                key.name
            ),
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

/// `bytes` read as `T` by the strict reader (`limiter-input`: an object wherever the SDK's
/// types have one, never an array by position), or a 400 naming where the body is wrong.
fn parse<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, Refusal> {
    limiter_input::from_slice(bytes).map_err(|e| {
        // A missing field is named inside the object it is missing from.
        let location = match e.place() {
            Some(path) if path.starts_with('[') => format!("body{path}"),
            Some(path) => format!("body.{path}"),
            None => "body".to_owned(),
        };
        let fix = match e.kind {
            JsonErrorKind::Syntax => "send the body as JSON",
            JsonErrorKind::Trailing => "send one JSON value",
            _ => "send the body the SDK's types describe",
        };
        invalid(location, e.message, fix)
    })
}

/// The body of an authorized call, by the keys and timeout of `state` (the one snapshot of the
/// live state the request reads); any body that cannot be read is a 400 (the SDK retries a
/// 5xx for seconds, and a bad body would fail again).
async fn read<C: Clock + Clone + Send + Sync + 'static>(
    state: &AppState<C>,
    headers: &HeaderMap,
    body: Body,
    needs: Needs,
) -> Result<axum::body::Bytes, Refusal> {
    authorized(&state.keys, headers, needs)?;
    let timeout = state.config.server.body_timeout;
    read_body(headers, body, timeout).await.map_err(|e| {
        let problem = Problem {
            location: "body".into(),
            message: e.message.clone(),
            fix: None,
        };
        refusal(StatusCode::BAD_REQUEST, e.message, vec![problem])
    })
}

/// The body of an authorized call, read as `T`.
async fn read_json<T: serde::de::DeserializeOwned, C: Clock + Clone + Send + Sync + 'static>(
    state: &AppState<C>,
    headers: &HeaderMap,
    body: Body,
    needs: Needs,
) -> Result<T, Refusal> {
    let bytes = read(state, headers, body, needs).await?;
    parse(&bytes)
}

/// A namespace and an identifier (or pattern) as every operation checks them.
fn check_names(at: &str, namespace: &str, identifier: &str) -> Result<(), Refusal> {
    if namespace.is_empty() || namespace.len() > MAX_NAMESPACE {
        return Err(invalid(
            format!("{at}.namespace"),
            format!("`namespace` must be 1 to {MAX_NAMESPACE} bytes"),
            "name the namespace your limits are counted in, such as \"api\"",
        ));
    }
    if identifier.is_empty() || identifier.len() > MAX_IDENTIFIER {
        return Err(invalid(
            format!("{at}.identifier"),
            format!("`identifier` must be 1 to {MAX_IDENTIFIER} bytes"),
            "send who is limited: a user id, an IP address",
        ));
    }
    Ok(())
}

/// A window as every operation checks it.
fn check_duration(at: &str, duration: u64) -> Result<(), Refusal> {
    if (MIN_DURATION_MS..=MAX_DURATION_MS).contains(&duration) {
        return Ok(());
    }
    Err(invalid(
        format!("{at}.duration"),
        format!("`duration` {duration} ms is outside {MIN_DURATION_MS} to {MAX_DURATION_MS} ms"),
        "send the window in milliseconds, at least 1000",
    ))
}

/// When a decision request started, for its latency.
fn started() -> std::time::Instant {
    std::time::Instant::now()
}

/// Counts a v2 decision's answer as a v1 one is counted: its latency in the histogram, and a
/// refused request (a 400) as invalid.
fn counted<C: Clock + Clone + Send + Sync + 'static>(
    state: &AppState<C>,
    started: std::time::Instant,
    response: Response,
) -> Response {
    if response.status() == StatusCode::BAD_REQUEST {
        state.metrics.invalid();
    }
    state.metrics.observe(started.elapsed());
    response
}

/// A `{meta, data}` answer.
fn ok(data: Value) -> Response {
    answer(
        StatusCode::OK,
        json!({ "meta": { "requestId": request_id() }, "data": data }),
    )
}
