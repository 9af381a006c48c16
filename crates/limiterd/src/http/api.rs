//! The HTTP JSON API: `POST /v1/ratelimit`, `POST /v1/ratelimit/many`, `POST /json` (envoy's
//! `ShouldRateLimit` as JSON, see [`crate::envoy::json`]); health (`GET /healthz` liveness,
//! `GET /readyz` readiness as JSON, `GET /healthcheck` as envoy's reference answers it);
//! `GET /metrics`; the status page `GET /` over `GET /debug/status`, and `GET /debug/config`
//! (the loaded configuration, see [`crate::ops::debug`]); `GET /openapi.json`, the API described
//! for client generators ([`OPENAPI`]).
//! Requests are parsed in [`crate::http::request`]; anything invalid is a 400 whose JSON names the
//! field and the fix, never a 500. Every refusal (400, 404, 405, 408, 413, 415, 503) is one
//! JSON shape: `{"error": {"code", "field"?, "message"}}`.
//!
//! ```text
//! POST /v1/ratelimit  {"policy": "api", "identifier": "user-1", "cost": 1}
//! POST /v1/ratelimit  {"namespace": "email", "identifier": "user-1", "limit": 10, "duration_ms": 60000}
//! POST /v1/ratelimit  {"policy": "tokens", "identifier": "team-1", "cost": 6000, "record": true}
//! 200 {"success": true, "limit": 20, "remaining": 19, "current": 1,
//!      "reset_at_ms": 1763800000050, "retry_after_ms": 0, "source": "memory"}
//! ```

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use limiter_core::Clock;
use serde::Serialize;

use super::body::{json_response, read_body};
use super::guard::Authorized;
use super::request::{ApiError, parse_many, parse_request};
use crate::engine::{Answer, DecideError};
use crate::envoy::json as envoy_json;
use crate::envoy::service::{Code, EnvoyError};
use crate::ops::live::Live;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        #[derive(Serialize)]
        struct Body<'a> {
            error: &'a ApiError,
        }
        json(self.status, &Body { error: &self })
    }
}

fn json(status: StatusCode, value: &impl Serialize) -> Response {
    match serde_json::to_vec(value) {
        Ok(body) => json_response(status, body),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// One answer as the API writes it.
#[derive(Debug, Serialize)]
pub(super) struct Outcome {
    success: bool,
    limit: u64,
    remaining: u64,
    current: u64,
    reset_at_ms: u64,
    retry_after_ms: u64,
    source: &'static str,
    /// On a policy with a concurrency limit, the admitted call's permit, to release.
    #[serde(skip_serializing_if = "Option::is_none")]
    permit: Option<String>,
}

impl Outcome {
    /// The answer's JSON, written as serde writes it (the fields in order, no spaces), without
    /// serde: this is every decision's answer. The fixed part is written on the stack, each
    /// name a copy of known length and each number two digits at a time (`itoa`), then moved
    /// into the body with the strings in one allocation: writing field by field into a `Vec`
    /// cost about 800 instructions an answer (callgrind), a capacity check and a call per
    /// piece and a division per digit.
    pub(super) fn to_json(&self) -> Vec<u8> {
        let mut fixed = Fixed::default();
        fixed.put(if self.success {
            b"{\"success\":true"
        } else {
            b"{\"success\":false"
        });
        fixed.field(b",\"limit\":", self.limit);
        fixed.field(b",\"remaining\":", self.remaining);
        fixed.field(b",\"current\":", self.current);
        fixed.field(b",\"reset_at_ms\":", self.reset_at_ms);
        fixed.field(b",\"retry_after_ms\":", self.retry_after_ms);
        const SOURCE: &[u8] = b",\"source\":\"";
        const PERMIT: &[u8] = b"\",\"permit\":\"";
        const END: &[u8] = b"\"}";
        let permit = self.permit.as_deref().map(str::as_bytes);
        let permit_len = permit.map_or(0, |p| PERMIT.len() + p.len());
        // Exactly as long as the answer: a body whose length is its capacity becomes `Bytes`
        // without the second allocation a spare capacity costs.
        let len = fixed.len + SOURCE.len() + self.source.len() + permit_len + END.len();
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(fixed.written());
        // The origin's name is one of a few plain words, a permit's id hex digits: nothing to
        // escape.
        out.extend_from_slice(SOURCE);
        out.extend_from_slice(self.source.as_bytes());
        if let Some(permit) = permit {
            out.extend_from_slice(PERMIT);
            out.extend_from_slice(permit);
        }
        out.extend_from_slice(END);
        out
    }
}

/// The longest fixed part: `{"success":false`, the five names and five 20-digit numbers.
const FIXED_MAX: usize = 16 + 66 + 5 * 20;

/// The answer's fixed part, written on the stack.
struct Fixed {
    bytes: [u8; FIXED_MAX],
    len: usize,
}

impl Default for Fixed {
    fn default() -> Self {
        Self {
            bytes: [0; FIXED_MAX],
            len: 0,
        }
    }
}

impl Fixed {
    /// Appends `piece` (every caller's fits: [`FIXED_MAX`] counts them all at their longest).
    #[inline(always)]
    fn put(&mut self, piece: &[u8]) {
        let end = self.len + piece.len();
        if let Some(slot) = self.bytes.get_mut(self.len..end) {
            slot.copy_from_slice(piece);
            self.len = end;
        }
    }

    /// Appends `name` and `value` in decimal.
    #[inline(always)]
    fn field(&mut self, name: &[u8], value: u64) {
        self.put(name);
        self.put(itoa::Buffer::new().format(value).as_bytes());
    }

    fn written(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

fn outcome(answer: &Answer) -> Outcome {
    let d = &answer.decision;
    Outcome {
        success: d.is_allowed(),
        limit: d.limit(),
        remaining: d.remaining(),
        // Units in use now (the limit when a key is in debt: it never reads above the limit).
        current: d.limit().saturating_sub(d.remaining()),
        reset_at_ms: answer.reset_at_ms(),
        retry_after_ms: d.retry_after_nanos().div_ceil(1_000_000),
        source: crate::engine::source_name(answer.origin),
        permit: None,
    }
}

fn unix_ms() -> u64 {
    // Display only: `reset_at_ms` for clients; decisions never read the wall clock.
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

pub(super) fn decide_error(e: DecideError) -> ApiError {
    match e {
        DecideError::Invalid { field, message, .. } => ApiError::invalid(field, message),
        DecideError::TooManyShapes => ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "too_many_limits",
            field: Some("limit".into()),
            message: e.to_string(),
        },
        DecideError::Full(_) => ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "store_full",
            field: None,
            message: e.to_string(),
        },
        DecideError::Unavailable(_) => ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "store_unavailable",
            field: None,
            message: e.to_string(),
        },
    }
}

/// A refusal as a response; a timed-out body also closes the connection (the rest of the body
/// may still come, and would be read as the next request).
pub(super) fn refusal(error: ApiError) -> Response {
    let close = error.status == StatusCode::REQUEST_TIMEOUT;
    let mut response = error.into_response();
    if close {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// The routes, for messages.
const ROUTES: &str = "POST /v1/ratelimit, POST /v1/ratelimit/many, POST /v1/ratelimit/release, \
     POST /v2/ratelimit.limit, \
     POST /v2/ratelimit.multiLimit, POST /json, GET /healthz, \
     GET /readyz, GET /healthcheck, GET /metrics, GET /debug/config, GET /debug/status, GET /, \
     GET /openapi.json";

/// The API's routes over `live`.
pub fn router<C: Clock + Clone + Send + Sync + 'static>(live: Arc<Live<C>>) -> Router {
    // Behind keys when the configuration protects the native API: every handler here takes
    // `Authorized` first.
    let native = Router::new()
        .route("/v1/ratelimit", post(one::<C>))
        .route("/v1/ratelimit/many", post(many::<C>))
        .route("/v1/ratelimit/release", post(super::release::release::<C>))
        .route("/json", post(envoy::<C>))
        .route("/metrics", get(metrics::<C>))
        .route("/debug/config", get(debug_config::<C>))
        .route("/debug/status", get(debug_status::<C>))
        .route("/", get(status_page));
    Router::new()
        .merge(native)
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz::<C>))
        .route("/healthcheck", get(healthcheck::<C>))
        .route("/openapi.json", get(openapi))
        .fallback(|| async {
            ApiError {
                status: StatusCode::NOT_FOUND,
                code: "not_found",
                field: None,
                message: format!("no such endpoint: {ROUTES}"),
            }
        })
        .method_not_allowed_fallback(|method: axum::http::Method| async move {
            ApiError {
                status: StatusCode::METHOD_NOT_ALLOWED,
                code: "method_not_allowed",
                field: None,
                message: format!("{method} is not served here: {ROUTES}"),
            }
        })
        .with_state(Arc::clone(&live))
        .merge(super::unkey::router(live))
}

async fn one<C: Clock + Clone + Send + Sync + 'static>(
    _: Authorized,
    State(live): State<Arc<Live<C>>>,
    request: axum::extract::Request,
) -> Response {
    // The head borrowed, not copied (axum's `HeaderMap` extractor clones it).
    let (head, body) = request.into_parts();
    let headers = &head.headers;
    let started = Instant::now();
    let state = live.current();
    let engine = &state.engine;
    let parsed = read_body(headers, body, state.config.server.body_timeout)
        .await
        .and_then(|b| parse_request(&b, &|name| engine.policy_id(name)));
    let response = match parsed {
        Err(e) => {
            state.metrics.invalid();
            refusal(e)
        }
        Ok(asked) => match engine.decide_one(&asked.items, asked.time_ms).await {
            Ok((answer, permit)) => json_response(
                StatusCode::OK,
                Outcome {
                    permit,
                    ..outcome(&answer)
                }
                .to_json(),
            ),
            Err(e) => decide_error(e).into_response(),
        },
    };
    state.metrics.observe(started.elapsed());
    response
}

/// [`decide_error`] for a batch: an invalid field is named by its request
/// (`requests[1].cost`), as the batch's parser names the fields it refuses.
fn batch_error(e: DecideError) -> ApiError {
    match e {
        DecideError::Invalid {
            field,
            message,
            item: Some(i),
        } => ApiError::invalid(format!("requests[{i}].{field}"), message),
        other => decide_error(other),
    }
}

async fn many<C: Clock + Clone + Send + Sync + 'static>(
    _: Authorized,
    State(live): State<Arc<Live<C>>>,
    request: axum::extract::Request,
) -> Response {
    // The head borrowed, not copied (axum's `HeaderMap` extractor clones it).
    let (head, body) = request.into_parts();
    let headers = &head.headers;
    #[derive(Serialize)]
    struct Batch {
        success: bool,
        results: Vec<Outcome>,
    }
    let started = Instant::now();
    let state = live.current();
    let engine = &state.engine;
    let parsed = read_body(headers, body, state.config.server.body_timeout)
        .await
        .and_then(|b| parse_many(&b, &|name| engine.policy_id(name)));
    let response = match parsed {
        Err(e) => {
            state.metrics.invalid();
            refusal(e)
        }
        Ok(asked) => match engine.decide_at(&asked.items, asked.time_ms).await {
            Ok((success, answers)) => {
                let results = answers.iter().map(outcome).collect();
                json(StatusCode::OK, &Batch { success, results })
            }
            Err(e) => batch_error(e).into_response(),
        },
    };
    state.metrics.observe(started.elapsed());
    response
}

async fn envoy<C: Clock + Clone + Send + Sync + 'static>(
    _: Authorized,
    State(live): State<Arc<Live<C>>>,
    request: axum::extract::Request,
) -> Response {
    // The head borrowed, not copied (axum's `HeaderMap` extractor clones it).
    let (head, body) = request.into_parts();
    let headers = &head.headers;
    let started = Instant::now();
    let state = live.current();
    let body = match read_body(headers, body, state.config.server.body_timeout).await {
        Ok(body) => body,
        Err(e) => {
            state.metrics.invalid();
            return refusal(e);
        }
    };
    let result = match envoy_json::parse(&body) {
        Ok(request) => state.envoy.decide(&state.engine, &request).await,
        Err(e) => Err(e),
    };
    let response = match result {
        Ok(answer) => {
            let status = match answer.overall {
                Code::Ok => StatusCode::OK,
                Code::OverLimit => StatusCode::TOO_MANY_REQUESTS,
            };
            json(status, &envoy_json::render(&answer))
        }
        Err(EnvoyError::Invalid(message) | EnvoyError::Empty(message)) => {
            state.metrics.invalid();
            ApiError {
                status: StatusCode::BAD_REQUEST,
                code: "invalid_request",
                field: None,
                message,
            }
            .into_response()
        }
        Err(EnvoyError::Unavailable(message)) => ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: "store_unavailable",
            field: None,
            message,
        }
        .into_response(),
    };
    state.metrics.observe(started.elapsed());
    response
}

async fn metrics<C: Clock + Clone + Send + Sync + 'static>(
    _: Authorized,
    State(live): State<Arc<Live<C>>>,
) -> Response {
    let state = live.current();
    state
        .metrics
        .set_permits_held(&state.engine.permits_held().await);
    state.metrics.set_store(&live.health.readiness().reading());
    let text = state.metrics.render(state.engine.keys_held());
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

/// Readiness as JSON: 200 when ready, 503 when the store is unreachable or a shutdown began.
async fn readyz<C: Clock + Clone + Send + Sync + 'static>(
    State(live): State<Arc<Live<C>>>,
) -> Response {
    let readiness = live.health.readiness();
    let status = if readiness.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    json(status, &readiness)
}

/// Envoy's reference health check: `OK` when ready, a 500 otherwise, as the reference answers.
async fn healthcheck<C: Clock + Clone + Send + Sync + 'static>(
    State(live): State<Arc<Live<C>>>,
) -> Response {
    if live.health.readiness().ready {
        (StatusCode::OK, "OK").into_response()
    } else {
        (StatusCode::INTERNAL_SERVER_ERROR, "NOT_SERVING").into_response()
    }
}

async fn debug_config<C: Clock + Clone + Send + Sync + 'static>(
    _: Authorized,
    State(live): State<Arc<Live<C>>>,
) -> Response {
    let state = live.current();
    let mut view = crate::ops::debug::config(&state.config, state.envoy.domains());
    view["overrides"] = crate::ops::debug::overrides(&live.overrides);
    json(StatusCode::OK, &view)
}

async fn debug_status<C: Clock + Clone + Send + Sync + 'static>(
    _: Authorized,
    State(live): State<Arc<Live<C>>>,
) -> Response {
    let state = live.current();
    let mut status = crate::ops::debug::status(&state, &live.health.readiness(), unix_ms());
    status["overrides"] = crate::ops::debug::override_list(&live.overrides);
    let mut response = json(StatusCode::OK, &status);
    response.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    response
}

/// The OpenAPI document (`crates/limiterd/api/openapi.json`), which a test checks real
/// responses against.
pub const OPENAPI: &str = include_str!("../../api/openapi.json");

async fn openapi() -> Response {
    json_response(StatusCode::OK, OPENAPI)
}

/// The status page: static HTML whose script reads `/debug/status` every second.
async fn status_page(_: Authorized) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        crate::ops::debug::STATUS_PAGE,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::Outcome;

    proptest! {
        /// The answer written by hand is byte for byte what serde writes.
        #[test]
        fn an_answer_is_written_as_serde_writes_it(
            success in any::<bool>(),
            numbers in prop::array::uniform5(prop_oneof![any::<u64>(), 0..1_000u64]),
            source in prop::sample::select(vec!["memory", "redis", "deny_cache", "fallback", "fail_open", "lease"]),
            permit in prop::option::of("[0-9a-f]{17,32}"),
        ) {
            let outcome = Outcome {
                success,
                limit: numbers[0],
                remaining: numbers[1],
                current: numbers[2],
                reset_at_ms: numbers[3],
                retry_after_ms: numbers[4],
                source,
                permit,
            };
            let json = outcome.to_json();
            // Allocated exactly: `Bytes` takes a body with no spare capacity as it is.
            prop_assert_eq!(json.len(), json.capacity());
            prop_assert_eq!(json, serde_json::to_vec(&outcome).unwrap());
        }
    }
}
