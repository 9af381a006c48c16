//! [`RedisConcurrencyLayer`]: at most `count` requests in flight per key across a fleet, on
//! Redis permits ([`RedisPermits`]). A request takes a permit before the service is called and
//! its response body holds it ([`PermitBody`] with a [`HeldPermit`]): released when the body
//! ends or is dropped (a client that went away), renewed as the body yields frames past half
//! the permit's time to live, and lost after that time to live if the process dies. A request
//! that finds every permit held is answered 429 with `Retry-After` (until the first held permit
//! expires); while Redis fails, 503 (or, with [`fail_open`](RedisConcurrencyLayer::fail_open),
//! the service is called without a permit).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use limiter_redis::{Acquired, HeldPermit, RedisPermits};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::AnswerBody;
use crate::concurrency::{BodyPermit, PermitBody};
use crate::error::ConfigError;
use crate::failures::FailureLog;
use crate::key::KeyExtractor;
use crate::response::{Rejection, RejectionBody, RejectionKind, is_grpc, rejection};

impl BodyPermit for HeldPermit {
    fn progressed(&mut self) {
        self.renew_soon_if_due();
    }
}

/// At most `permits.count()` requests in flight per key across every process sharing the
/// Redis behind `permits`, in front of any tower service whose response body can carry the
/// middleware's own answers ([`AnswerBody`]). Beside a rate limit, add it last (outermost),
/// as [`ConcurrencyLayer`](crate::ConcurrencyLayer) says.
///
/// ```no_run
/// use std::time::Duration;
/// use axum::{Router, routing::get};
/// use limiter_redis::RedisBackend;
/// use limiter_tower::{HeaderKey, RedisConcurrencyLayer};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// // At most 2 exports running per API key, fleet-wide.
/// let permits = backend.permits("exports", 2, Duration::from_secs(30))?;
/// let exports = RedisConcurrencyLayer::new(permits, HeaderKey::new("x-api-key".parse()?))?;
/// let app: Router = Router::new().route("/export", get(|| async { "..." })).layer(exports);
/// # let _ = app;
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct RedisConcurrencyLayer<X> {
    permits: RedisPermits,
    key: Arc<X>,
    fail_open: bool,
    body: RejectionBody,
    /// Redis's failures answered for, for the operator (shared by every clone).
    failures: Arc<FailureLog>,
}

impl<X> Clone for RedisConcurrencyLayer<X> {
    fn clone(&self) -> Self {
        Self {
            permits: self.permits.clone(),
            key: Arc::clone(&self.key),
            fail_open: self.fail_open,
            body: self.body.clone(),
            failures: Arc::clone(&self.failures),
        }
    }
}

impl<X: KeyExtractor> RedisConcurrencyLayer<X> {
    /// A permit of `permits` per request in flight, per key taken by `key`. While Redis fails,
    /// requests are refused with 503 unless [`fail_open`](Self::fail_open).
    pub fn new(permits: RedisPermits, key: X) -> Result<Self, ConfigError> {
        key.check()?;
        Ok(Self {
            permits,
            key: Arc::new(key),
            fail_open: false,
            body: RejectionBody::default(),
            failures: Arc::new(FailureLog::new()),
        })
    }

    /// While Redis fails, call the service without a permit (nothing is counted), where by
    /// default the request is refused with 503.
    pub fn fail_open(mut self) -> Self {
        self.fail_open = true;
        self
    }

    /// How the 429, the 503 and a missing key's answer are written.
    pub fn rejection_body(mut self, body: RejectionBody) -> Self {
        self.body = body;
        self
    }

    /// The permits, to read what each key holds.
    pub fn permits(&self) -> &RedisPermits {
        &self.permits
    }
}

impl<S, X: KeyExtractor> Layer<S> for RedisConcurrencyLayer<X> {
    type Service = RedisConcurrencyLimit<S, X>;

    fn layer(&self, inner: S) -> Self::Service {
        RedisConcurrencyLimit {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service [`RedisConcurrencyLayer`] builds.
#[derive(Debug)]
pub struct RedisConcurrencyLimit<S, X> {
    inner: S,
    layer: RedisConcurrencyLayer<X>,
}

impl<S: Clone, X> Clone for RedisConcurrencyLimit<S, X> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            layer: self.layer.clone(),
        }
    }
}

/// The future of a [`RedisConcurrencyLimit`]'s call: it takes the permit on Redis, then calls
/// the service.
pub type FleetPermitFuture<RB, E> =
    Pin<Box<dyn Future<Output = Result<Response<PermitBody<RB, HeldPermit>>, E>> + Send>>;

impl<S, X, B, RB> Service<Request<B>> for RedisConcurrencyLimit<S, X>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Send,
    X: KeyExtractor,
    B: Send + 'static,
    RB: AnswerBody + Send + 'static,
{
    type Response = Response<PermitBody<RB, HeldPermit>>;
    type Error = S::Error;
    type Future = FleetPermitFuture<RB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let grpc = is_grpc(request.headers());
        let layer = self.layer.clone();
        let (parts, body) = request.into_parts();
        let key = match layer.key.extract(&parts) {
            Ok(key) => key.to_string(),
            Err(error) => {
                let refused =
                    rejection(RejectionKind::MissingKey, error.status(), error.to_string());
                return Box::pin(std::future::ready(Ok(layer.answer(&refused, grpc))));
            }
        };
        // The clone that was driven to readiness serves this call; the fresh one stays.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        Box::pin(async move {
            let held = match layer.permits.acquire(&key).await {
                Ok(Acquired::Held(permit)) => Some(layer.permits.hold(&key, permit)),
                Ok(Acquired::Busy {
                    held, retry_after, ..
                }) => return Ok(layer.busy(held, retry_after, grpc)),
                Err(error) if layer.fail_open => {
                    let what = "the concurrency limiter's store failed: the request went through without a permit";
                    layer.failures.report(what, &error);
                    None
                }
                Err(error) => {
                    let what =
                        "the concurrency limiter's store failed: the request was refused with 503";
                    layer.failures.report(what, &error);
                    // The error names servers and keys: the client is told only this.
                    let detail = "the concurrency limiter is unavailable; try again later";
                    let refused = rejection(
                        RejectionKind::Unavailable,
                        StatusCode::SERVICE_UNAVAILABLE,
                        detail.to_owned(),
                    );
                    return Ok(layer.answer(&refused, grpc));
                }
            };
            let response = inner.call(Request::from_parts(parts, body)).await?;
            Ok(response.map(|body| PermitBody::new(body, held)))
        })
    }
}

impl<X> RedisConcurrencyLayer<X> {
    fn busy<RB: AnswerBody>(
        &self,
        held: u64,
        retry_after: Duration,
        grpc: bool,
    ) -> Response<PermitBody<RB, HeldPermit>> {
        let refused = Rejection {
            kind: RejectionKind::OverLimit,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(retry_after),
            policy: None,
            detail: format!(
                "too many requests in flight: {held} of {} held",
                self.permits.count()
            ),
        };
        self.answer(&refused, grpc)
    }

    fn answer<RB: AnswerBody>(
        &self,
        refused: &Rejection,
        grpc: bool,
    ) -> Response<PermitBody<RB, HeldPermit>> {
        let mut answer = self.body.render(refused, grpc);
        if let Some(wait) = refused.retry_after {
            let nanos = u64::try_from(wait.as_nanos()).unwrap_or(u64::MAX);
            crate::headers::retry_after(nanos, answer.headers_mut());
        }
        answer.map(|full| PermitBody::new(RB::from_answer(full), None))
    }
}
