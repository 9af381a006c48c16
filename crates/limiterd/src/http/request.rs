//! The HTTP API's request bodies: [`parse_request`] and [`parse_many`] turn JSON into engine
//! [`Item`]s, and anything invalid becomes an [`ApiError`]: a 400 whose JSON names the field
//! and the fix, never a 500. No server here, so the fuzz targets build without one.

use std::borrow::Cow;

use http::StatusCode;
use limiter_input::JsonErrorKind;
use limiter_stack::Kind;
use serde::{Deserialize, Serialize};

use crate::engine::{Charge, Item, PolicyId, Target};

/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// The most requests in one batch.
pub const MAX_BATCH: usize = 100;
/// The longest identifier, in bytes.
pub const MAX_IDENTIFIER: usize = 256;
/// The longest namespace, in bytes.
pub const MAX_NAMESPACE: usize = 64;
/// The longest ad-hoc duration: a year.
pub const MAX_DURATION_MS: u64 = 365 * 24 * 3_600_000;

/// A request the API refuses: the status, a stable code, the field, and what to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ApiError {
    #[serde(skip)]
    pub(crate) status: StatusCode,
    /// A stable, machine-readable code.
    pub code: &'static str,
    /// The field at fault (`requests[2].cost`), when one is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<String>,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl ApiError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_request",
            field: Some(field.into()),
            message: message.into(),
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    fn at(mut self, prefix: &str) -> Self {
        if !prefix.is_empty() {
            self.field = Some(match self.field {
                Some(f) => format!("{prefix}.{f}"),
                None => prefix.to_owned(),
            });
        }
        self
    }
}

/// One request's fields as sent, borrowed from the body where no escape needs decoding.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRequest<'a> {
    #[serde(borrow)]
    pub(super) policy: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) namespace: Option<Cow<'a, str>>,
    #[serde(borrow)]
    pub(super) identifier: Cow<'a, str>,
    pub(super) limit: Option<u64>,
    pub(super) duration_ms: Option<u64>,
    pub(super) cost: Option<u64>,
    /// `cost` is usage that already happened: recorded whatever the limits hold.
    pub(super) record: Option<bool>,
    /// The request's instant, in ms since the Unix epoch.
    pub(super) time: Option<u64>,
    /// An ad-hoc limit's algorithm (`token_bucket` by default).
    #[serde(borrow)]
    pub(super) algorithm: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMany<'a> {
    #[serde(borrow)]
    requests: Vec<RawRequest<'a>>,
}

/// What came where an object belonged, from the strict reader's message (`invalid type:
/// array, expected a JSON object`).
fn what_came(text: &str) -> &'static str {
    let came = text
        .strip_prefix("invalid type: ")
        .or_else(|| text.strip_prefix("invalid value: "))
        .unwrap_or("");
    let is = |kind: &str| came.starts_with(kind);
    if is("array") {
        "an array"
    } else if is("string") {
        "a string"
    } else if is("number") {
        "a number"
    } else if is("boolean") {
        "a boolean"
    } else if is("null") {
        "null"
    } else {
        "something else"
    }
}

/// `body` read as `T` by the strict reader (`limiter-input`: an object wherever a struct is
/// read, never an array by position), or a 400 naming the field at fault and the fix.
pub(crate) fn from_json<'de, T: Deserialize<'de>>(body: &'de [u8]) -> Result<T, ApiError> {
    const EXAMPLE: &str =
        "send a JSON object such as {\"policy\": \"api\", \"identifier\": \"user-1\"}";
    limiter_input::from_slice(body).map_err(|e| {
        // The field at fault; a missing one inside the object it is missing from.
        let field = e.place();
        let message = if e.kind == JsonErrorKind::Trailing {
            format!("{}: send one JSON object", e.message)
        } else if let Some(name) = e.missing_field() {
            format!("`{name}` is missing: {EXAMPLE}")
        } else if e.message.contains("expected a JSON object") {
            // Not an object where one belongs: say what came.
            format!(
                "expected a JSON object, got {}: {EXAMPLE}",
                what_came(&e.message)
            )
        } else {
            format!("{}: {EXAMPLE}", e.message)
        };
        ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_json",
            field,
            message,
        }
    })
}

/// What a body asks for: the items, and the instant the caller gave (`time`, ms since the
/// Unix epoch), if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked<T> {
    /// The item (or items, for a batch).
    pub items: T,
    /// The `time` the caller gave.
    pub time_ms: Option<u64>,
}

/// Parses one `POST /v1/ratelimit` body; `policy` finds a configured policy's index. The
/// usual body (a flat object of known fields, plain strings and whole numbers) is read by a
/// reader of its own (`http/fast.rs`); anything else by serde, which names what is wrong.
pub fn parse_request(
    body: &[u8],
    policy: &dyn Fn(&str) -> Option<PolicyId>,
) -> Result<Asked<Item>, ApiError> {
    let raw: RawRequest = match super::fast::read(body) {
        Some(raw) => raw,
        None => from_json(body)?,
    };
    let time_ms = raw.time;
    Ok(Asked {
        items: check(raw, policy)?,
        time_ms,
    })
}

/// Parses one `POST /v1/ratelimit/many` body. A batch is decided at one instant: the requests
/// that give a `time` give the same one.
pub fn parse_many(
    body: &[u8],
    policy: &dyn Fn(&str) -> Option<PolicyId>,
) -> Result<Asked<Vec<Item>>, ApiError> {
    let raw: RawMany = from_json(body)?;
    if raw.requests.is_empty() || raw.requests.len() > MAX_BATCH {
        return Err(ApiError::invalid(
            "requests",
            format!("send 1 to {MAX_BATCH} requests, not {}", raw.requests.len()),
        ));
    }
    let mut time_ms = None;
    for (i, r) in raw.requests.iter().enumerate() {
        match (time_ms, r.time) {
            (Some(first), Some(t)) if first != t => {
                return Err(ApiError::invalid(
                    format!("requests[{i}].time"),
                    format!(
                        "`time` {t} differs from the batch's {first}: a batch is decided at one \
                         instant, so give every request the same `time`, or none"
                    ),
                ));
            }
            (None, Some(t)) => time_ms = Some(t),
            _ => {}
        }
    }
    let items = raw
        .requests
        .into_iter()
        .enumerate()
        .map(|(i, r)| check(r, policy).map_err(|e| e.at(&format!("requests[{i}]"))))
        .collect::<Result<_, _>>()?;
    Ok(Asked { items, time_ms })
}

/// Where an ad-hoc limit is counted: a token bucket (the native API's default) by namespace and
/// identifier; any other algorithm, as unkey counts, by namespace, identifier and duration, so
/// `/v1` with `"algorithm": "sliding_window"` and unkey's `/v2` share one budget.
/// Put together piece by piece: `format!` costs about 600 instructions a request.
pub(crate) fn ad_hoc_namespace(kind: Kind, duration_ms: u64, namespace: &str) -> String {
    match kind {
        Kind::TokenBucket => namespace.to_owned(),
        _ => {
            let mut digits = itoa::Buffer::new();
            let duration = digits.format(duration_ms);
            let mut out = String::with_capacity(duration.len() + 3 + namespace.len());
            out.push_str(duration);
            out.push_str("ms:");
            out.push_str(namespace);
            out
        }
    }
}

fn check(raw: RawRequest<'_>, policy: &dyn Fn(&str) -> Option<PolicyId>) -> Result<Item, ApiError> {
    if raw.identifier.is_empty() || raw.identifier.len() > MAX_IDENTIFIER {
        return Err(ApiError::invalid(
            "identifier",
            format!("`identifier` must be 1 to {MAX_IDENTIFIER} bytes"),
        ));
    }
    let cost = raw.cost.unwrap_or(1);
    let record = raw.record.unwrap_or(false);
    let target = match (raw.policy.as_deref(), raw.limit, raw.duration_ms) {
        (Some(_), Some(_), _) | (Some(_), _, Some(_)) => {
            return Err(ApiError::invalid(
                "policy",
                "give either `policy` or `limit` and `duration_ms`, not both",
            ));
        }
        (Some(name), None, None) => policy_target(&raw, name, policy)?,
        (None, Some(limit), Some(duration_ms)) => {
            ad_hoc_target(&raw, limit, duration_ms, cost, record)?
        }
        (None, Some(_), None) => {
            return Err(ApiError::invalid(
                "duration_ms",
                "`limit` needs a `duration_ms`",
            ));
        }
        (None, None, Some(_)) => {
            return Err(ApiError::invalid("limit", "`duration_ms` needs a `limit`"));
        }
        (None, None, None) => {
            return Err(ApiError::invalid(
                "policy",
                "say which limit: give `policy`, or `limit` and `duration_ms`",
            ));
        }
    };
    Ok(Item {
        target,
        identifier: std::sync::Arc::from(&*raw.identifier),
        cost,
        shadow: false,
        charge: if record { Charge::Record } else { Charge::Take },
    })
}

/// A configured policy's target: no ad-hoc field beside it, and a name the configuration has.
fn policy_target(
    raw: &RawRequest<'_>,
    name: &str,
    policy: &dyn Fn(&str) -> Option<PolicyId>,
) -> Result<Target, ApiError> {
    if raw.algorithm.is_some() {
        return Err(ApiError::invalid(
            "algorithm",
            "`algorithm` goes with `limit` and `duration_ms`; a policy has its own",
        ));
    }
    if raw.namespace.is_some() {
        return Err(ApiError::invalid(
            "namespace",
            "`namespace` goes with `limit` and `duration_ms`; a policy has its own",
        ));
    }
    let index = policy(name).ok_or_else(|| ApiError {
        status: StatusCode::BAD_REQUEST,
        code: "unknown_policy",
        field: Some("policy".into()),
        message: format!(
            "no policy is named {:?}: use one from the configuration, or give `limit` and `duration_ms`",
            name.chars().take(64).collect::<String>()
        ),
    })?;
    Ok(Target::Policy(index))
}

/// An ad-hoc limit's target, `limit` per `duration_ms` in the request's namespace, each
/// field checked; a `cost` above the limit is refused unless it is recorded.
fn ad_hoc_target(
    raw: &RawRequest<'_>,
    limit: u64,
    duration_ms: u64,
    cost: u64,
    record: bool,
) -> Result<Target, ApiError> {
    let namespace = raw.namespace.as_deref().ok_or_else(|| {
        ApiError::invalid(
            "namespace",
            "an ad-hoc limit needs a `namespace` to keep callers apart",
        )
    })?;
    if namespace.is_empty() || namespace.len() > MAX_NAMESPACE {
        return Err(ApiError::invalid(
            "namespace",
            format!("`namespace` must be 1 to {MAX_NAMESPACE} bytes"),
        ));
    }
    if limit == 0 {
        return Err(ApiError::invalid("limit", "`limit` must be at least 1"));
    }
    if duration_ms == 0 || duration_ms > MAX_DURATION_MS {
        return Err(ApiError::invalid(
            "duration_ms",
            format!("`duration_ms` must be 1 to {MAX_DURATION_MS} (a year)"),
        ));
    }
    if cost > limit && !record {
        return Err(ApiError::invalid(
            "cost",
            format!(
                "`cost` {cost} is above `limit` {limit}, so it could never be admitted; \
                 to record usage that already happened, add `\"record\": true`"
            ),
        ));
    }
    let kind = match raw.algorithm.as_deref() {
        None => Kind::TokenBucket,
        Some(name) => name
            .parse()
            .map_err(|e| ApiError::invalid("algorithm", format!("`algorithm` {name:?}: {e}")))?,
    };
    Ok(Target::AdHoc {
        kind,
        limit,
        duration_ms,
        namespace: ad_hoc_namespace(kind, duration_ms, namespace),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policies(name: &str) -> Option<PolicyId> {
        (name == "api").then_some(PolicyId::from_index(0))
    }

    /// A token bucket counts by namespace alone; any other algorithm by its duration too, so
    /// a namespace's windows of different lengths never share a count.
    #[test]
    fn an_ad_hoc_namespace_names_its_duration_unless_a_token_bucket() {
        assert_eq!(ad_hoc_namespace(Kind::TokenBucket, 60_000, "api"), "api");
        assert_eq!(
            ad_hoc_namespace(Kind::SlidingWindow, 60_000, "api"),
            "60000ms:api"
        );
        assert_eq!(ad_hoc_namespace(Kind::FixedWindow, 0, ""), "0ms:");
    }

    fn refused(body: &str) -> ApiError {
        parse_request(body.as_bytes(), &policies).expect_err(body)
    }

    #[test]
    fn parses_policy_and_ad_hoc_requests() {
        let item = parse_request(br#"{"policy":"api","identifier":"u1"}"#, &policies)
            .expect("valid")
            .items;
        assert_eq!(item.target, Target::Policy(PolicyId::from_index(0)));
        assert_eq!(item.cost, 1);
        let item = parse_request(
            br#"{"namespace":"mail","identifier":"u1","limit":10,"duration_ms":60000,"cost":0}"#,
            &policies,
        )
        .expect("valid")
        .items;
        assert_eq!(
            item.target,
            Target::AdHoc {
                kind: Kind::TokenBucket,
                limit: 10,
                duration_ms: 60_000,
                namespace: "mail".into()
            }
        );
        assert_eq!(item.cost, 0);
    }

    #[test]
    fn every_refusal_names_the_field() {
        for (body, code, field) in [
            ("", "invalid_json", None),
            ("{", "invalid_json", None),
            ("[]", "invalid_json", None),
            (r#"{"policy":"api"}"#, "invalid_json", Some("identifier")),
            (
                r#"{"policy":"api","identifier":"u"} {}"#,
                "invalid_json",
                None,
            ),
            (
                r#"{"policy":"api","identifier":7}"#,
                "invalid_json",
                Some("identifier"),
            ),
            (
                r#"{"policy":"api","identifier":"u","cost":"1"}"#,
                "invalid_json",
                Some("cost"),
            ),
            (
                r#"{"policy":"api","identifier":"u","cost":-1}"#,
                "invalid_json",
                Some("cost"),
            ),
            (
                r#"{"policy":"api","identifier":"u","cost":1.5}"#,
                "invalid_json",
                Some("cost"),
            ),
            (
                r#"{"policy":"api","identifier":"u","cost":99999999999999999999999}"#,
                "invalid_json",
                Some("cost"),
            ),
            (
                r#"{"policy":"api","identifier":"u","colour":1}"#,
                "invalid_json",
                Some("colour"),
            ),
            (
                r#"{"policy":"api","identifier":""}"#,
                "invalid_request",
                Some("identifier"),
            ),
            (
                r#"{"policy":"nope","identifier":"u"}"#,
                "unknown_policy",
                Some("policy"),
            ),
            (r#"{"identifier":"u"}"#, "invalid_request", Some("policy")),
            (
                r#"{"policy":"api","identifier":"u","limit":5}"#,
                "invalid_request",
                Some("policy"),
            ),
            (
                r#"{"policy":"api","identifier":"u","namespace":"n"}"#,
                "invalid_request",
                Some("namespace"),
            ),
            (
                r#"{"identifier":"u","limit":5,"duration_ms":1000}"#,
                "invalid_request",
                Some("namespace"),
            ),
            (
                r#"{"namespace":"n","identifier":"u","limit":0,"duration_ms":1000}"#,
                "invalid_request",
                Some("limit"),
            ),
            (
                r#"{"namespace":"n","identifier":"u","limit":5,"duration_ms":0}"#,
                "invalid_request",
                Some("duration_ms"),
            ),
            (
                r#"{"namespace":"n","identifier":"u","limit":5}"#,
                "invalid_request",
                Some("duration_ms"),
            ),
            (
                r#"{"namespace":"n","identifier":"u","limit":5,"duration_ms":1000,"cost":6}"#,
                "invalid_request",
                Some("cost"),
            ),
        ] {
            let e = refused(body);
            assert_eq!(
                (e.code, e.field.as_deref()),
                (code, field),
                "{body}: {}",
                e.message
            );
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(!e.message.is_empty());
        }
        let long = format!(
            r#"{{"policy":"api","identifier":"{}"}}"#,
            "x".repeat(MAX_IDENTIFIER + 1)
        );
        assert_eq!(refused(&long).field.as_deref(), Some("identifier"));
    }

    #[test]
    fn batch_errors_name_the_request() {
        let e = parse_many(
            br#"{"requests":[{"policy":"api","identifier":"u"},{"policy":"api","identifier":""}]}"#,
            &policies,
        )
        .expect_err("refused");
        assert_eq!(e.field.as_deref(), Some("requests[1].identifier"));
        let e = parse_many(
            br#"{"requests":[{"policy":"api","identifier":"u","cost":"x"}]}"#,
            &policies,
        )
        .expect_err("refused");
        assert_eq!(e.field.as_deref(), Some("requests[0].cost"));
        let e = parse_many(br#"{"requests":[]}"#, &policies).expect_err("refused");
        assert_eq!(e.field.as_deref(), Some("requests"));
    }

    #[test]
    fn only_an_object_is_read_where_one_belongs_and_refusals_say_what_came() {
        // Arrays as long as the request has fields: serde alone reads them by position.
        let positional = r#"["api",null,"u",null,null,null,null,null,null]"#;
        for (body, field, says) in [
            (positional, None, "expected a JSON object, got an array"),
            ("null", None, "expected a JSON object, got null"),
            (r#""api""#, None, "expected a JSON object, got a string"),
            ("42", None, "expected a JSON object, got a number"),
            ("true", None, "expected a JSON object, got a boolean"),
            (
                "not json",
                None,
                "not JSON: expected ident at line 1 column 2",
            ),
            ("nul", None, "not JSON: "),
            ("fals", None, "not JSON: "),
            ("-x", None, "not JSON: "),
            (
                r#"{"policy":"api","identifier":"u","cost":-1}"#,
                Some("cost"),
                "invalid value: number `-1`, expected a whole number from 0 to 18446744073709551615",
            ),
        ] {
            let e = refused(body);
            assert_eq!(
                (e.code, e.field.as_deref()),
                ("invalid_json", field),
                "{body}"
            );
            assert!(e.message.starts_with(says), "{body}: {}", e.message);
            assert!(
                !e.message.contains("struct") && !e.message.contains("u64"),
                "{body}: {}",
                e.message
            );
        }
        let many = format!(r#"{{"requests":[{{"policy":"api","identifier":"u"}},{positional}]}}"#);
        let e = parse_many(many.as_bytes(), &policies).expect_err("refused");
        assert_eq!(e.field.as_deref(), Some("requests[1]"));
        assert!(
            e.message
                .starts_with("expected a JSON object, got an array"),
            "{}",
            e.message
        );
        let e = parse_many(format!("[{positional}]").as_bytes(), &policies).expect_err("refused");
        assert_eq!(e.field, None);
        assert!(
            e.message
                .starts_with("expected a JSON object, got an array"),
            "{}",
            e.message
        );
    }
}
