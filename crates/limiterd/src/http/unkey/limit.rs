//! `ratelimit.limit` and `ratelimit.multiLimit`: unkey's counting, on the engine.
//!
//! A sliding window keyed by namespace, identifier and duration (not by the limit, so a caller
//! that sends another limit keeps its consumption, rescaled), on the engine's ad-hoc limits,
//! in memory or on Redis with the store's failure policy. The override that applies to the
//! identifier ([`crate::ops::overrides`]) replaces the limit and duration sent, and the answer
//! names it (`overrideId`, left out when none applied). A `multiLimit` is all or nothing, as
//! `/v1/ratelimit/many`: a failed check takes nothing. A cost above its limit can never pass:
//! it is answered as a denial, and its batch only reports. `reset` is, as unkey answers it,
//! the end of the current window (windows of `duration` counted from the Unix epoch), in Unix
//! ms, admitted or denied (`@unkey/ratelimit` caches a denial until then).

use limiter_stack::{Charge, Kind};
use serde::Deserialize;

use super::*;
use crate::app::AppState;
use crate::engine::{Answer, DecideError, Item, Target};
use crate::http::request::{MAX_BATCH, ad_hoc_namespace};
use crate::ops::overrides::Overrides;

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

/// A checked limit: the engine item, the namespace the answer repeats, the override applied,
/// and whether its cost can never pass.
struct Checked {
    item: Item,
    namespace: String,
    override_id: Option<String>,
    never: bool,
}

fn check(raw: RawLimit, at: &str, overrides: &Overrides) -> Result<Checked, Refusal> {
    check_names(at, &raw.namespace, &raw.identifier)?;
    if raw.limit == 0 {
        return Err(invalid(
            format!("{at}.limit"),
            "`limit` must be at least 1".into(),
            "send a positive limit",
        ));
    }
    check_duration(at, raw.duration)?;
    let found = overrides.find(&raw.namespace, &raw.identifier);
    let (limit, duration) = found
        .as_ref()
        .map_or((raw.limit, raw.duration), |o| (o.limit, o.duration_ms));
    let cost = raw.cost.unwrap_or(1);
    let never = cost > limit;
    // Keyed by namespace, identifier and duration (never by the limit), as `/v1` counts a
    // sliding window.
    let namespace = ad_hoc_namespace(Kind::SlidingWindow, duration, &raw.namespace);
    Ok(Checked {
        item: Item {
            target: Target::AdHoc {
                kind: Kind::SlidingWindow,
                limit,
                duration_ms: duration,
                namespace,
            },
            identifier: raw.identifier.into(),
            cost: if never { 0 } else { cost },
            shadow: false,
            charge: Charge::Take,
        },
        namespace: raw.namespace,
        override_id: found.map(|o| o.id),
        never,
    })
}

/// `reset` of an answer decided at `at_unix_ns` on windows of `duration_ms`: the end of the
/// current window, as unkey answers it.
fn reset_ms(at_unix_ns: u64, duration_ms: u64) -> u64 {
    let now_ms = at_unix_ns / 1_000_000;
    let duration = duration_ms.max(1);
    (now_ms / duration)
        .saturating_add(1)
        .saturating_mul(duration)
}

/// Why the store could not decide; `batch`: the body is an array, whose items an invalid
/// field is named by (`body[1].cost`).
fn decide_refusal(e: DecideError, batch: bool) -> Refusal {
    match e {
        DecideError::Invalid {
            field,
            message,
            item,
        } => invalid(
            match (batch, item) {
                (true, Some(i)) => format!("body[{i}].{field}"),
                _ => format!("body.{field}"),
            },
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

impl Checked {
    /// The window's duration the check counts on (its override's, if one applied).
    fn duration_ms(&self) -> u64 {
        match self.item.target {
            Target::AdHoc { duration_ms, .. } => duration_ms,
            Target::Policy(_) => 1,
        }
    }
}

/// One check's answer: `(passed, fields)`.
fn answered(c: &Checked, a: &Answer) -> (bool, Value) {
    let passed = a.decision.is_allowed() && !c.never;
    let mut fields = json!({
        "limit": a.decision.limit(),
        "remaining": if c.never { 0 } else { a.decision.remaining() },
        "reset": reset_ms(a.at_unix_ns, c.duration_ms()),
    });
    if let Some(id) = &c.override_id {
        fields["overrideId"] = json!(id);
    }
    (passed, fields)
}

/// `POST /v2/ratelimit.limit`, counted in the metrics as `/v1` is.
pub(super) async fn limit<C: Clock + Clone + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let state = shared.live.current();
    let started = started();
    let response = limit_one(&shared, &state, &headers, body).await;
    counted(&state, started, response)
}

async fn limit_one<C: Clock + Clone + Send + Sync + 'static>(
    shared: &Shared<C>,
    state: &AppState<C>,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let checked = match read_json::<RawLimit, C>(state, headers, body, DECIDE)
        .await
        .and_then(|raw| check(raw, "body", &shared.live.overrides))
    {
        Ok(checked) => checked,
        Err(refused) => return refused.into_response(),
    };
    match state
        .engine
        .decide(std::slice::from_ref(&checked.item))
        .await
    {
        Ok((_, answers)) => match answers.first() {
            Some(a) => {
                let (passed, mut data) = answered(&checked, a);
                data["success"] = json!(passed);
                ok(data)
            }
            None => {
                let missing = DecideError::Unavailable("no answer".into());
                decide_refusal(missing, false).into_response()
            }
        },
        Err(e) => decide_refusal(e, false).into_response(),
    }
}

/// `POST /v2/ratelimit.multiLimit`, counted in the metrics as `/v1/ratelimit/many` is.
pub(super) async fn multi_limit<C: Clock + Clone + Send + Sync + 'static>(
    State(shared): State<Arc<Shared<C>>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let state = shared.live.current();
    let started = started();
    let response = limit_many(&shared, &state, &headers, body).await;
    counted(&state, started, response)
}

async fn limit_many<C: Clock + Clone + Send + Sync + 'static>(
    shared: &Shared<C>,
    state: &AppState<C>,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let raw = match read_json::<Vec<RawLimit>, C>(state, headers, body, DECIDE).await {
        Ok(raw) => raw,
        Err(refused) => return refused.into_response(),
    };
    if raw.is_empty() || raw.len() > MAX_BATCH {
        let message = format!("send 1 to {MAX_BATCH} limits, not {}", raw.len());
        let fix = "split the checks into batches of at most 100";
        return invalid("body".into(), message, fix).into_response();
    }
    let mut checked = Vec::with_capacity(raw.len());
    for (i, r) in raw.into_iter().enumerate() {
        match check(r, &format!("body[{i}]"), &shared.live.overrides) {
            Ok(c) => checked.push(c),
            Err(refused) => return refused.into_response(),
        }
    }
    // A check that can never pass fails the batch: every check then only reports.
    let hopeless = checked.iter().any(|c| c.never);
    let items: Vec<Item> = checked
        .iter()
        .map(|c| Item {
            cost: if hopeless { 0 } else { c.item.cost },
            ..c.item.clone()
        })
        .collect();
    match state.engine.decide(&items).await {
        Ok((admitted, answers)) => {
            let limits: Vec<Value> = checked
                .iter()
                .zip(&answers)
                .map(|(c, a)| {
                    let (passed, mut fields) = answered(c, a);
                    fields["namespace"] = json!(c.namespace);
                    fields["identifier"] = json!(&*c.item.identifier);
                    fields["passed"] = json!(passed);
                    fields
                })
                .collect();
            ok(json!({ "passed": admitted && !hopeless, "limits": limits }))
        }
        Err(e) => decide_refusal(e, true).into_response(),
    }
}
