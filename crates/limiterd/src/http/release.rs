//! `POST /v1/ratelimit/release`: `{"policy", "identifier", "permit"}` releases a permit that
//! `POST /v1/ratelimit` handed out on a policy with a concurrency limit, answering
//! `{"released": true}`, or `false` when it had expired or was released already (a release is
//! idempotent: retrying one is safe).

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use limiter_core::Clock;
use serde::Deserialize;

use super::api::{decide_error, refusal};
use super::body::{json_response, read_body};
use super::request::{ApiError, from_json};
use crate::ops::live::Live;

/// The longest permit id accepted (ids limiterd hands out are 17 to 32 hex digits).
const MAX_PERMIT: usize = 64;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRelease {
    policy: String,
    identifier: String,
    permit: String,
}

pub(super) async fn release<C: Clock + Clone + Send + Sync + 'static>(
    _: super::guard::Authorized,
    State(live): State<Arc<Live<C>>>,
    request: axum::extract::Request,
) -> Response {
    let (head, body) = request.into_parts();
    let started = Instant::now();
    let state = live.current();
    let parsed = read_body(&head.headers, body, state.config.server.body_timeout)
        .await
        .and_then(|b| checked(&b));
    let response = match parsed {
        Err(e) => {
            state.metrics.invalid();
            refusal(e)
        }
        Ok(raw) if state.engine.policy_id(&raw.policy).is_none() => {
            state.metrics.invalid();
            refusal(ApiError {
                status: StatusCode::BAD_REQUEST,
                code: "unknown_policy",
                field: Some("policy".into()),
                message: format!(
                    "no policy is named {:?}: use the policy the permit was taken on",
                    raw.policy.chars().take(64).collect::<String>()
                ),
            })
        }
        Ok(raw) => match state
            .engine
            .release(&raw.policy, &raw.identifier, &raw.permit)
            .await
        {
            Ok(released) => json_response(
                StatusCode::OK,
                if released {
                    &b"{\"released\":true}"[..]
                } else {
                    &b"{\"released\":false}"[..]
                },
            ),
            Err(e) => decide_error(e).into_response(),
        },
    };
    state.metrics.observe(started.elapsed());
    response
}

fn checked(body: &[u8]) -> Result<RawRelease, ApiError> {
    let raw: RawRelease = from_json(body)?;
    if raw.identifier.is_empty() || raw.identifier.len() > super::request::MAX_IDENTIFIER {
        return Err(ApiError::invalid(
            "identifier",
            format!(
                "`identifier` must be 1 to {} bytes",
                super::request::MAX_IDENTIFIER
            ),
        ));
    }
    if raw.permit.is_empty() || raw.permit.len() > MAX_PERMIT {
        return Err(ApiError::invalid(
            "permit",
            format!(
                "`permit` must be the id `POST /v1/ratelimit` answered (1 to {MAX_PERMIT} bytes)"
            ),
        ));
    }
    Ok(raw)
}
