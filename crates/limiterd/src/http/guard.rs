//! [`Authorized`]: the native API's keys, as the extractor every native route's handler takes
//! first. When the configuration protects the native API, decisions (`/v1`, `/json`) need a key
//! with `decide` and the views (`/metrics`, `/debug`, the status page) one with
//! `read_overrides`; a refusal is a 401 (no key, or one limiterd does not accept) or a 403 (a
//! key without the permission), in the API's error shape, and the handler never runs.
//!
//! An extractor rather than a route layer: a layer boxed every request's future twice and cost
//! about 3,000 instructions a decision (callgrind), a fifth of what a decision adds to
//! `/healthz`. `tests/integration/unkey.rs` sends every native route without a key, so a route whose
//! handler forgets it fails there.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use limiter_core::Clock;

use super::request::ApiError;
use crate::ops::live::Live;

/// A request the native API's keys let through (or the API is not protected).
pub(super) struct Authorized;

impl<C: Clock + Clone + Send + Sync + 'static> FromRequestParts<Arc<Live<C>>> for Authorized {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut Parts,
        live: &Arc<Live<C>>,
    ) -> Result<Self, Self::Rejection> {
        let state = live.current();
        if !state.config.protects_native(!state.keys.is_empty()) {
            return Ok(Self);
        }
        let path = parts.uri.path();
        let decides = path.starts_with("/v1/") || path == "/json";
        let presented = parts
            .headers
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        let refused = |status, code, message: String| {
            ApiError {
                status,
                code,
                field: None,
                message,
            }
            .into_response()
        };
        match state.keys.check(presented) {
            Ok(key)
                if (decides && key.permissions.decide)
                    || (!decides && key.permissions.read_overrides) =>
            {
                Ok(Self)
            }
            Ok(key) => Err(refused(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!(
                    "the key `{}` lacks the `{}` permission: use a key that has it",
                    key.name,
                    if decides { "decide" } else { "read_overrides" }
                ),
            )),
            Err(_) => Err(refused(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "this listener is behind keys: send `Authorization: Bearer <key>` with a key from `[auth]` or `LIMITERD_ROOT_KEY`".into(),
            )),
        }
    }
}
