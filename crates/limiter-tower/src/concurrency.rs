//! [`ConcurrencyLayer`]: at most `count` requests in flight per key. A request takes a permit
//! before the service is called and holds it in its response body ([`PermitBody`]) until the
//! body ends or is dropped (a client that disconnects included); a request that finds every
//! permit of its key held is answered 429 with `Retry-After`, and the service is not called.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use limiter_concurrency::{KeyedConcurrency, OwnedPermit, Refused};
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::AnswerBody;
use crate::error::ConfigError;
use crate::key::{Key, KeyExtractor};
use crate::response::{Rejection, RejectionBody, RejectionKind, is_grpc};

/// What a denied request is told to wait unless [`ConcurrencyLayer::retry_after`] says
/// otherwise: when a permit frees is not known, so a client is asked to come back soon.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(1);

/// At most `count` requests in flight per key, in front of any tower service whose response
/// body can carry the middleware's own answers ([`AnswerBody`]: axum's, tonic's, boxed ones).
/// Beside a [`RateLimitLayer`](crate::RateLimitLayer), add this one last (outermost): a
/// request refused for want of a permit then takes no rate units, and one the rate limit
/// refuses gives its permit back as its 429 ends.
///
/// ```
/// use axum::{Router, routing::get};
/// use limiter_tower::{ConcurrencyLayer, HeaderKey};
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// // At most 2 exports running per API key; a third waits for one to finish.
/// let exports = ConcurrencyLayer::new(2, HeaderKey::new("x-api-key".parse()?))?;
/// let app: Router = Router::new().route("/export", get(|| async { "..." })).layer(exports);
/// # let _ = app;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct ConcurrencyLayer<X> {
    permits: Arc<KeyedConcurrency<Key>>,
    key: Arc<X>,
    retry_after: Duration,
    body: RejectionBody,
}

impl<X> Clone for ConcurrencyLayer<X> {
    fn clone(&self) -> Self {
        Self {
            permits: Arc::clone(&self.permits),
            key: Arc::clone(&self.key),
            retry_after: self.retry_after,
            body: self.body.clone(),
        }
    }
}

impl<X: KeyExtractor> ConcurrencyLayer<X> {
    /// At most `count` requests in flight per key taken by `key` (1 or more).
    pub fn new(count: u64, key: X) -> Result<Self, ConfigError> {
        key.check()?;
        let permits = KeyedConcurrency::new(count).map_err(ConfigError::Concurrency)?;
        Ok(Self {
            permits: Arc::new(permits),
            key: Arc::new(key),
            retry_after: DEFAULT_RETRY_AFTER,
            body: RejectionBody::default(),
        })
    }

    /// The `Retry-After` of a 429 (rounded up to whole seconds, at least 1).
    pub fn retry_after(mut self, wait: Duration) -> Self {
        self.retry_after = wait;
        self
    }

    /// How the 429 (and a missing key's answer) is written.
    pub fn rejection_body(mut self, body: RejectionBody) -> Self {
        self.body = body;
        self
    }

    /// The permits, to read what each key holds.
    pub fn permits(&self) -> &Arc<KeyedConcurrency<Key>> {
        &self.permits
    }
}

impl<S, X: KeyExtractor> Layer<S> for ConcurrencyLayer<X> {
    type Service = ConcurrencyLimit<S, X>;

    fn layer(&self, inner: S) -> Self::Service {
        ConcurrencyLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`ConcurrencyLayer`] builds.
#[derive(Debug)]
pub struct ConcurrencyLimit<S, X> {
    inner: S,
    layer: ConcurrencyLayer<X>,
}

impl<S: Clone, X> Clone for ConcurrencyLimit<S, X> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

impl<S, X, B, RB> Service<Request<B>> for ConcurrencyLimit<S, X>
where
    S: Service<Request<B>, Response = Response<RB>>,
    X: KeyExtractor,
    RB: AnswerBody,
{
    type Response = Response<PermitBody<RB>>;
    type Error = S::Error;
    type Future = PermitFuture<S::Future, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let grpc = is_grpc(&parts.headers);
        let layer = &self.layer;
        let refused = match layer.key.extract(&parts) {
            Err(error) => Rejection {
                kind: RejectionKind::MissingKey,
                status: error.status(),
                retry_after: None,
                policy: None,
                detail: error.to_string(),
            },
            Ok(key) => match layer.permits.try_acquire_owned(&key, 1) {
                Ok(permit) => {
                    let future = self.inner.call(Request::from_parts(parts, body));
                    return PermitFuture {
                        state: State::Called {
                            future,
                            permit: Some(permit),
                        },
                    };
                }
                Err(refused) => busy(refused, layer.retry_after),
            },
        };
        let mut answer = layer.body.render(&refused, grpc);
        if let Some(wait) = refused.retry_after {
            let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            crate::headers::retry_after(nanos, answer.headers_mut());
        }
        PermitFuture {
            state: State::Answered {
                response: Some(answer.map(|full| PermitBody::new(RB::from_answer(full), None))),
            },
        }
    }
}

fn busy(refused: Refused, retry_after: Duration) -> Rejection {
    Rejection {
        kind: RejectionKind::OverLimit,
        status: StatusCode::TOO_MANY_REQUESTS,
        retry_after: Some(retry_after),
        policy: None,
        detail: format!("too many requests in flight: {refused}"),
    }
}

pin_project! {
    /// The future of a [`ConcurrencyLimit`]'s call: the service's, holding the permit until its
    /// response's body takes it over (dropped unfinished, it releases the permit), or the
    /// middleware's own answer.
    pub struct PermitFuture<F, RB> {
        #[pin]
        state: State<F, RB>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, RB> {
        Called {
            #[pin]
            future: F,
            permit: Option<OwnedPermit<Key>>,
        },
        Answered {
            response: Option<Response<PermitBody<RB>>>,
        },
    }
}

impl<F, RB, E> Future for PermitFuture<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
{
    type Output = Result<Response<PermitBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Called { future, permit } => {
                let response = std::task::ready!(future.poll(cx))?;
                let permit = permit.take();
                Poll::Ready(Ok(response.map(|body| PermitBody::new(body, permit))))
            }
            StateProj::Answered { response } => match response.take() {
                Some(response) => Poll::Ready(Ok(response)),
                None => Poll::Pending,
            },
        }
    }
}

/// A permit a response body holds (released when dropped): told when the body makes progress,
/// so one with an expiry can renew itself.
pub trait BodyPermit: Send + 'static {
    /// The body yielded a frame: its request is still being served.
    fn progressed(&mut self) {}
}

impl BodyPermit for OwnedPermit<Key> {}

pin_project! {
    /// A response body holding its request's permit: released when the body ends (its last
    /// frame, or an error) or is dropped (a client that went away).
    #[derive(Debug)]
    pub struct PermitBody<B, P = OwnedPermit<Key>> {
        // Declared first, so dropped first: once the inner body is gone (its channel closed,
        // its stream ended), the permit is released already.
        permit: Option<P>,
        #[pin]
        inner: B,
    }
}

impl<B, P> PermitBody<B, P> {
    pub(crate) fn new(inner: B, permit: Option<P>) -> Self {
        Self { inner, permit }
    }

    /// Whether the body still holds its request's permit.
    pub fn holds_permit(&self) -> bool {
        self.permit.is_some()
    }
}

impl<B: Body, P: BodyPermit> Body for PermitBody<B, P> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = this.inner.poll_frame(cx);
        match &polled {
            Poll::Ready(None | Some(Err(_))) => {
                this.permit.take(); // the body ended: the request is no longer in flight
            }
            Poll::Ready(Some(Ok(_))) => {
                if let Some(permit) = this.permit.as_mut() {
                    permit.progressed();
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: AnswerBody, P: BodyPermit> AnswerBody for PermitBody<B, P> {
    fn from_answer(body: Full<Bytes>) -> Self {
        Self::new(B::from_answer(body), None)
    }
}
