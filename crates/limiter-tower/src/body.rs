//! [`AnswerBody`]: the response body types the middleware answers in. The middleware's
//! response is the inner service's own type, so a router above it (axum's) passes it on
//! without boxing it again; the middleware's own answers (a 429, a 503, a gRPC status) are
//! built in that type from their [`Full`] body.

use bytes::Bytes;
use http_body_util::combinators::{BoxBody, UnsyncBoxBody};
use http_body_util::{BodyExt as _, Either, Full};

/// A response body type the middleware can write its own answers in: the inner service's
/// response body. Implemented for `Full<Bytes>`, boxed bodies of `Bytes`, `Either<B,
/// Full<Bytes>>` (to wrap any other body), axum's `Body` (feature `axum`) and tonic's `Body`
/// (feature `tonic`).
///
/// A service with another body type goes behind the middleware mapped into one of these, e.g.
/// with `tower::util::MapResponse` to `Either::Left`.
pub trait AnswerBody: Sized {
    /// The middleware's own answer, `body`, in this type.
    fn from_answer(body: Full<Bytes>) -> Self;
}

impl AnswerBody for Full<Bytes> {
    #[inline]
    fn from_answer(body: Full<Bytes>) -> Self {
        body
    }
}

impl<B> AnswerBody for Either<B, Full<Bytes>> {
    #[inline]
    fn from_answer(body: Full<Bytes>) -> Self {
        Either::Right(body)
    }
}

impl<E: 'static> AnswerBody for BoxBody<Bytes, E> {
    fn from_answer(body: Full<Bytes>) -> Self {
        body.map_err(|never| match never {}).boxed()
    }
}

impl<E: 'static> AnswerBody for UnsyncBoxBody<Bytes, E> {
    fn from_answer(body: Full<Bytes>) -> Self {
        body.map_err(|never| match never {}).boxed_unsync()
    }
}

#[cfg(feature = "axum")]
impl AnswerBody for axum::body::Body {
    fn from_answer(body: Full<Bytes>) -> Self {
        Self::new(body)
    }
}

#[cfg(feature = "tonic")]
impl AnswerBody for tonic::body::Body {
    fn from_answer(body: Full<Bytes>) -> Self {
        Self::new(body)
    }
}
