//! Reading a request's body (its `Content-Type`, its size and the time it may take, each
//! refused in the API's error shape) and writing a JSON answer's. Shared by the native API and
//! unkey's.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
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
    let mut body = body;
    let mut read = Gathered::default();
    // A small body usually arrived with its head: read what is here without arming a timer.
    let here = std::future::poll_fn(|cx| Poll::Ready(read.poll_rest(&mut body, cx))).await;
    match here {
        Poll::Ready(done) => done?,
        Poll::Pending => {
            let rest = std::future::poll_fn(|cx| read.poll_rest(&mut body, cx));
            tokio::time::timeout(timeout, rest)
                .await
                .map_err(|_| ApiError {
                    status: StatusCode::REQUEST_TIMEOUT,
                    code: "request_timeout",
                    field: None,
                    message: format!(
                        "the body did not arrive within {} ms (`[server] body_timeout_ms`): send it whole, at once",
                        timeout.as_millis()
                    ),
                })??;
        }
    }
    Ok(read.into_bytes())
}

/// A body's bytes as its frames arrive: the usual body is one frame, kept as it came (no copy,
/// no collecting: hyper's own buffer); more are joined, up to [`MAX_BODY_BYTES`].
#[derive(Default)]
struct Gathered {
    first: Bytes,
    joined: Option<Vec<u8>>,
}

impl Gathered {
    /// Reads `body`'s frames until it ends (ready) or has no more for now (pending).
    fn poll_rest(&mut self, body: &mut Body, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        loop {
            let frame = match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => return Poll::Ready(Ok(())),
                Poll::Ready(Some(Err(e))) => {
                    return Poll::Ready(Err(ApiError {
                        status: StatusCode::BAD_REQUEST,
                        code: "invalid_body",
                        field: None,
                        message: format!("the body could not be read ({e}): send it whole"),
                    }));
                }
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            // Trailers carry nothing a decision reads.
            if let Ok(data) = frame.into_data() {
                self.push(data)?;
            }
            if body.is_end_stream() {
                return Poll::Ready(Ok(()));
            }
        }
    }

    fn push(&mut self, data: Bytes) -> Result<(), ApiError> {
        let held = self.first.len() + self.joined.as_ref().map_or(0, Vec::len);
        if held.saturating_add(data.len()) > MAX_BODY_BYTES {
            return Err(ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                code: "body_too_large",
                field: None,
                message: format!(
                    "the body is over {MAX_BODY_BYTES} bytes: send less (a batch holds at most {} requests)",
                    super::request::MAX_BATCH
                ),
            });
        }
        match &mut self.joined {
            Some(joined) => joined.extend_from_slice(&data),
            None if self.first.is_empty() => self.first = data,
            None => {
                let mut joined = Vec::with_capacity(held + data.len());
                joined.extend_from_slice(&self.first);
                joined.extend_from_slice(&data);
                self.joined = Some(joined);
            }
        }
        Ok(())
    }

    fn into_bytes(self) -> Bytes {
        self.joined.map_or(self.first, Bytes::from)
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

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use hyper::body::Frame;

    use super::*;

    /// A body of the given frames, each ready when polled (an `Err` is a failed read).
    struct Frames(VecDeque<Result<&'static [u8], &'static str>>);

    impl HttpBody for Frames {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|next| match next {
                Ok(data) => Ok(Frame::data(Bytes::from_static(data))),
                Err(e) => Err(std::io::Error::other(e)),
            }))
        }
    }

    async fn read(frames: Vec<Result<&'static [u8], &'static str>>) -> Result<Bytes, ApiError> {
        let body = Body::new(Frames(frames.into()));
        read_body(&HeaderMap::new(), body, Duration::from_secs(3600)).await
    }

    #[tokio::test]
    async fn a_body_in_several_frames_is_joined_and_one_frame_is_taken_whole() {
        let one = read(vec![Ok(b"{\"policy\":\"api\"}")]).await.unwrap();
        assert_eq!(one, &b"{\"policy\":\"api\"}"[..]);
        let joined = read(vec![Ok(b"{\"po"), Ok(b""), Ok(b"licy\""), Ok(b":\"api\"}")])
            .await
            .unwrap();
        assert_eq!(joined, &b"{\"policy\":\"api\"}"[..]);
        assert_eq!(read(Vec::new()).await.unwrap(), &b""[..]);
    }

    #[tokio::test]
    async fn a_body_over_the_limit_across_frames_is_413_and_a_failed_read_400() {
        static HALF: [u8; MAX_BODY_BYTES / 2 + 1] = [b' '; MAX_BODY_BYTES / 2 + 1];
        let whole = read(vec![
            Ok(&HALF[..MAX_BODY_BYTES / 2]),
            Ok(&HALF[..MAX_BODY_BYTES / 2]),
        ]);
        assert_eq!(whole.await.unwrap().len(), MAX_BODY_BYTES / 2 * 2);
        let over = read(vec![Ok(&HALF), Ok(&HALF)]).await.unwrap_err();
        assert_eq!(
            (over.status, over.code),
            (StatusCode::PAYLOAD_TOO_LARGE, "body_too_large")
        );
        let failed = read(vec![Ok(b"{\"po"), Err("connection reset")])
            .await
            .unwrap_err();
        assert_eq!(
            (failed.status, failed.code),
            (StatusCode::BAD_REQUEST, "invalid_body")
        );
        assert!(
            failed.message.contains("connection reset"),
            "{}",
            failed.message
        );
    }
}
