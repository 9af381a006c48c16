//! The responses the middleware writes itself: 429 over a limit, 503 when a backend fails
//! closed, 400 or 500 when a required key is missing, 500 when a request can never be decided.
//! Bodies are plain text, `application/problem+json` (RFC 9457), or the user's own; a gRPC
//! request (`content-type: application/grpc…`) gets a trailers-only gRPC status instead
//! (`RESOURCE_EXHAUSTED` for a denial), which tonic clients read as a `Status`.

use std::fmt;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{HeaderMap, Response, StatusCode};
use http_body_util::Full;

/// Why the middleware answered instead of the service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectionKind {
    /// Over a limit: 429 (gRPC `RESOURCE_EXHAUSTED`).
    OverLimit,
    /// The backend failed and its policy is to refuse: 503 (gRPC `UNAVAILABLE`).
    Unavailable,
    /// A required key could not be taken from the request: the key error's status (gRPC
    /// `INVALID_ARGUMENT` for 400, `INTERNAL` for 500).
    MissingKey,
    /// The request can never be decided: 500 (gRPC `INTERNAL`).
    Error,
}

/// A response the middleware writes: what a custom body function is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// Why.
    pub kind: RejectionKind,
    /// The HTTP status.
    pub status: StatusCode,
    /// For a denial: the earliest a retry of the same cost can be admitted.
    pub retry_after: Option<Duration>,
    /// For a denial: the name of the layer that bound it.
    pub policy: Option<String>,
    /// A sentence for the client.
    pub detail: String,
}

type CustomBody = Arc<dyn Fn(&Rejection) -> Response<Full<Bytes>> + Send + Sync>;

/// How the middleware writes the bodies of its own responses.
#[derive(Clone, Default)]
pub enum RejectionBody {
    /// `text/plain; charset=utf-8`: the detail, one line.
    #[default]
    PlainText,
    /// `application/problem+json` (RFC 9457) with `type`, `title`, `status`, `detail`, and
    /// `policy` and `retry_after` (seconds, rounded up) for a denial.
    ProblemJson,
    /// The user's own response, status included (`rejection.status` is the one the
    /// middleware would send: a missing API key could be answered 401 instead of 400). The
    /// middleware still adds `Retry-After` and the rate limit headers to a denial.
    Custom(CustomBody),
}

impl fmt::Debug for RejectionBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PlainText => f.write_str("PlainText"),
            Self::ProblemJson => f.write_str("ProblemJson"),
            Self::Custom(_) => f.write_str("Custom(..)"),
        }
    }
}

impl RejectionBody {
    /// A custom body for every rejection.
    pub fn custom(
        body: impl Fn(&Rejection) -> Response<Full<Bytes>> + Send + Sync + 'static,
    ) -> Self {
        Self::Custom(Arc::new(body))
    }

    /// The response for `rejection`, as a gRPC status when `grpc`.
    pub(crate) fn render(&self, rejection: &Rejection, grpc: bool) -> Response<Full<Bytes>> {
        if grpc {
            return grpc_status(rejection);
        }
        let mut response = match self {
            Self::PlainText => text(
                "text/plain; charset=utf-8",
                format!("{}\n", rejection.detail),
            ),
            Self::ProblemJson => text("application/problem+json", problem_json(rejection)),
            Self::Custom(body) => return body(rejection),
        };
        *response.status_mut() = rejection.status;
        response
    }
}

fn text(content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn problem_json(r: &Rejection) -> String {
    let title = r.status.canonical_reason().unwrap_or("Error");
    let mut out = format!(
        "{{\"type\":\"about:blank\",\"title\":{},\"status\":{},\"detail\":{}",
        json_string(title),
        r.status.as_u16(),
        json_string(&r.detail)
    );
    if let Some(policy) = &r.policy {
        let _ = write!(out, ",\"policy\":{}", json_string(policy));
    }
    if let Some(wait) = r.retry_after {
        let seconds = crate::headers::ceil_seconds(wait.as_nanos().try_into().unwrap_or(u64::MAX));
        let _ = write!(out, ",\"retry_after\":{}", seconds.max(1));
    }
    out.push('}');
    out
}

/// `text` as a JSON string literal.
fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Whether a request is gRPC (its answer must be a gRPC status, not an HTTP error page).
pub(crate) fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

/// The gRPC code for a rejection.
pub(crate) fn grpc_code(rejection: &Rejection) -> u8 {
    match rejection.kind {
        RejectionKind::OverLimit => 8,    // RESOURCE_EXHAUSTED
        RejectionKind::Unavailable => 14, // UNAVAILABLE
        RejectionKind::MissingKey if rejection.status.is_client_error() => 3, // INVALID_ARGUMENT
        RejectionKind::MissingKey | RejectionKind::Error => 13, // INTERNAL
    }
}

/// A trailers-only gRPC response: HTTP 200, `grpc-status` and a percent-encoded
/// `grpc-message` in the headers, no body.
fn grpc_status(rejection: &Rejection) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::new()));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(
        "grpc-status",
        HeaderValue::from(u16::from(grpc_code(rejection))),
    );
    let mut message = String::new();
    for b in rejection.detail.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            message.push(char::from(b));
        } else {
            let _ = write!(message, "%{b:02X}");
        }
    }
    if let Ok(value) = HeaderValue::try_from(message) {
        headers.insert("grpc-message", value);
    }
    response
}

/// A rejection with no wait and no policy named: `kind`, answered `status`, saying `detail`.
pub(crate) fn rejection(kind: RejectionKind, status: StatusCode, detail: String) -> Rejection {
    Rejection {
        kind,
        status,
        retry_after: None,
        policy: None,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn denial() -> Rejection {
        Rejection {
            kind: RejectionKind::OverLimit,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(Duration::from_millis(1_500)),
            policy: Some("per-\"ip\"".into()),
            detail: "over the limit: retry after 2 s\n%".into(),
        }
    }

    #[test]
    fn problem_json_escapes_and_rounds_up() {
        assert_eq!(
            problem_json(&denial()),
            r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"over the limit: retry after 2 s\u000a%","policy":"per-\"ip\"","retry_after":2}"#
        );
    }

    #[test]
    fn grpc_rejections_are_trailers_only_statuses() {
        let response = RejectionBody::PlainText.render(&denial(), true);
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["grpc-status"], "8");
        assert_eq!(
            response.headers()["grpc-message"],
            "over the limit: retry after 2 s%0A%25"
        );
        let unavailable = Rejection {
            kind: RejectionKind::Unavailable,
            status: StatusCode::SERVICE_UNAVAILABLE,
            ..denial()
        };
        assert_eq!(grpc_code(&unavailable), 14);
        let missing = Rejection {
            kind: RejectionKind::MissingKey,
            status: StatusCode::BAD_REQUEST,
            ..denial()
        };
        assert_eq!(grpc_code(&missing), 3);
    }
}
