//! Reading a request's body (its `Content-Type`, its size and the time it may take, each
//! refused in the API's error shape) and writing a JSON answer's. Shared by the native API and
//! unkey's.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;

use super::request::{ApiError, MAX_BODY_BYTES};

/// The body of a decision request, read within `timeout`, or the error that says what is wrong
/// with it: a JSON error for a body over [`MAX_BODY_BYTES`] (413), one not sent in time (408;
/// the connection is then closed), one that could not be read (400), or a `Content-Type` that
/// is not JSON (415). No type, `application/json`, any `+json` type and curl's default form
/// type (what `curl -d` sends) are read as JSON.
pub(crate) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    timeout: Duration,
) -> Result<Bytes, ApiError> {
    if let Some(value) = headers.get(header::CONTENT_TYPE) {
        let essence = value
            .to_str()
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim();
        // Compared without case and without allocating: this runs on every request.
        let suffix = essence
            .len()
            .checked_sub(5)
            .and_then(|start| essence.get(start..));
        let json = essence.eq_ignore_ascii_case("application/json")
            || suffix.is_some_and(|s| s.eq_ignore_ascii_case("+json"))
            || essence.eq_ignore_ascii_case("application/x-www-form-urlencoded");
        if !json {
            return Err(ApiError {
                status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
                code: "unsupported_media_type",
                field: None,
                message: format!(
                    "the body is read as JSON, not {essence:?}: send `Content-Type: application/json`"
                ),
            });
        }
    }
    let too_large = || ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "body_too_large",
        field: None,
        message: format!(
            "the body is over {MAX_BODY_BYTES} bytes: send less (a batch holds at most {} requests)",
            super::request::MAX_BATCH
        ),
    };
    let limited = http_body_util::Limited::new(body, MAX_BODY_BYTES);
    let mut collect = std::pin::pin!(http_body_util::BodyExt::collect(limited));
    // A small body is usually here already: read it without arming a timer.
    let first = std::future::poll_fn(|cx| {
        std::task::Poll::Ready(std::future::Future::poll(collect.as_mut(), cx))
    })
    .await;
    let read = match first {
        std::task::Poll::Ready(read) => Ok(read),
        std::task::Poll::Pending => tokio::time::timeout(timeout, collect).await,
    };
    match read {
        Err(_) => Err(ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            code: "request_timeout",
            field: None,
            message: format!(
                "the body did not arrive within {} ms (`[server] body_timeout_ms`): send it whole, at once",
                timeout.as_millis()
            ),
        }),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            code: "invalid_body",
            field: None,
            message: format!("the body could not be read ({e}): send it whole"),
        }),
    }
}

/// A JSON answer: `body` with `status` and `Content-Type: application/json`, built directly
/// (axum's tuple of parts allocates the header's value and costs about 1,500 instructions a
/// response, callgrind).
pub(crate) fn json_response(status: StatusCode, body: impl Into<Body>) -> Response {
    let mut response = Response::new(body.into());
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
