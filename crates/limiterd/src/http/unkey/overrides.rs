//! `ratelimit.setOverride`, `getOverride`, `deleteOverride` and `listOverrides`, on the
//! service's overrides ([`crate::ops::overrides`]): setting needs the `write_overrides`
//! permission, reading `read_overrides`; a missing override is a 404; a namespace past its
//! bound is refused with a 400 naming the setting to raise.

use serde::Deserialize;

use super::*;
use crate::ops::overrides::{Override, OverrideError};

/// The most overrides one `listOverrides` page holds (and its default).
pub(super) const MAX_PAGE: usize = 100;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSet {
    namespace: String,
    identifier: String,
    limit: u64,
    duration: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawName {
    namespace: String,
    identifier: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawList {
    namespace: String,
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    limit: Option<u64>,
}

fn override_error(e: OverrideError) -> Refusal {
    match e {
        OverrideError::NotFound { .. } => refusal(StatusCode::NOT_FOUND, e.to_string(), Vec::new()),
        OverrideError::Full { .. } => invalid(
            "body.identifier".into(),
            e.to_string(),
            "delete an override of this namespace first",
        ),
        OverrideError::Save { .. } => {
            refusal(StatusCode::SERVICE_UNAVAILABLE, e.to_string(), Vec::new())
        }
    }
}

fn shown(o: &Override) -> Value {
    json!({
        "overrideId": o.id,
        "duration": o.duration_ms,
        "identifier": o.identifier,
        "limit": o.limit,
    })
}

/// `POST /v2/ratelimit.setOverride`.
pub(super) async fn set<C: Clock + Clone + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let state = shared.live.current();
    let result = async {
        let raw: RawSet = read_json(&state, &headers, body, WRITE_OVERRIDES).await?;
        check_names("body", &raw.namespace, &raw.identifier)?;
        if raw.limit == 0 {
            let fix = "send a positive limit (delete the override to use the caller's own)";
            return Err(invalid(
                "body.limit".into(),
                "`limit` must be at least 1".into(),
                fix,
            ));
        }
        check_duration("body", raw.duration)?;
        let max = state.config.overrides.max_per_namespace;
        let overrides = &shared.live.overrides;
        let id = overrides
            .set(
                &raw.namespace,
                &raw.identifier,
                (raw.limit, raw.duration),
                max,
            )
            .await
            .map_err(override_error)?;
        Ok::<_, Refusal>(ok(json!({ "overrideId": id })))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v2/ratelimit.getOverride`.
pub(super) async fn get<C: Clock + Clone + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let state = shared.live.current();
    let result = async {
        let raw: RawName = read_json(&state, &headers, body, READ_OVERRIDES).await?;
        check_names("body", &raw.namespace, &raw.identifier)?;
        let overrides = &shared.live.overrides;
        overrides.catch_up().await;
        let found = overrides.get(&raw.namespace, &raw.identifier);
        Ok::<_, Refusal>(ok(shown(&found.map_err(override_error)?)))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v2/ratelimit.deleteOverride`.
pub(super) async fn delete<C: Clock + Clone + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let state = shared.live.current();
    let result = async {
        let raw: RawName = read_json(&state, &headers, body, WRITE_OVERRIDES).await?;
        check_names("body", &raw.namespace, &raw.identifier)?;
        let overrides = &shared.live.overrides;
        overrides
            .delete(&raw.namespace, &raw.identifier)
            .await
            .map_err(override_error)?;
        Ok::<_, Refusal>(ok(json!({})))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v2/ratelimit.listOverrides`: a page, and `pagination` (the last page without a
/// cursor).
pub(super) async fn list<C: Clock + Clone + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let state = shared.live.current();
    let result = async {
        let raw: RawList = read_json(&state, &headers, body, READ_OVERRIDES).await?;
        check_names("body", &raw.namespace, "-")?;
        let size = match raw.limit {
            None => MAX_PAGE,
            Some(n @ 1..=100) => usize::try_from(n).unwrap_or(MAX_PAGE),
            Some(n) => {
                let message = format!("`limit` {n} is outside 1 to {MAX_PAGE}");
                let fix = "ask for at most 100 overrides a page, and follow the cursor";
                return Err(invalid("body.limit".into(), message, fix));
            }
        };
        let overrides = &shared.live.overrides;
        overrides.catch_up().await;
        let (page, next) = overrides.list(&raw.namespace, raw.cursor.as_deref(), size);
        let mut pagination = json!({ "hasMore": next.is_some() });
        if let Some(cursor) = next {
            pagination["cursor"] = json!(cursor);
        }
        let data: Vec<Value> = page.iter().map(shown).collect();
        Ok(answer(
            StatusCode::OK,
            json!({ "meta": { "requestId": request_id() }, "data": data, "pagination": pagination }),
        ))
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}
