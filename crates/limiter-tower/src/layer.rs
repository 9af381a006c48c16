//! [`RateLimitLayer`] builds the [`RateLimit`] service: extract the keys, decide, then call
//! the inner service with the rate limit headers added, or answer 429 / 503 / 400 / 500
//! without calling it. Every clone of the layer or the service shares one limiter (an axum
//! router clones its services per connection).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body_util::{Either, Full};
use limiter_stack::StackDecision;
use tower_layer::Layer;
use tower_service::Service;

use crate::error::ConfigError;
use crate::headers::{self, HeaderMode, Policies, RateHeaders};
use crate::key::KeyExtractor;
use crate::limiter::{HttpLimiter, Verdict};
use crate::request::HttpRequest;
use crate::response::{self, Rejection, RejectionBody, RejectionKind};

type CostFn = Box<dyn Fn(&Parts) -> u64 + Send + Sync>;

/// A key the middleware takes from every request.
struct KeySpec {
    name: &'static str,
    extractor: Box<dyn KeyExtractor>,
    required: bool,
}

impl fmt::Debug for KeySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.required {
            "required"
        } else {
            "optional"
        };
        write!(f, "{} ({kind})", self.name)
    }
}

/// What every clone of the layer and its services shares.
struct Shared<L> {
    limiter: L,
    keys: Vec<KeySpec>,
    cost: Option<CostFn>,
    mode: HeaderMode,
    policies: Policies,
    body: RejectionBody,
}

/// Rate limits every request through an [`HttpLimiter`] (an in-process `Stack` or a Redis
/// stack). Build one with [`RateLimitLayer::builder`]; see the crate docs for an example.
pub struct RateLimitLayer<L> {
    shared: Arc<Shared<L>>,
}

impl<L> Clone for RateLimitLayer<L> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<L> fmt::Debug for RateLimitLayer<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt(f)
    }
}

impl<L> fmt::Debug for Shared<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayer")
            .field("keys", &self.keys)
            .field("headers", &self.mode)
            .field("body", &self.body)
            .finish_non_exhaustive()
    }
}

/// Builds a [`RateLimitLayer`].
pub struct RateLimitLayerBuilder<L> {
    limiter: L,
    keys: Vec<KeySpec>,
    cost: Option<CostFn>,
    mode: HeaderMode,
    body: RejectionBody,
}

impl<L> fmt::Debug for RateLimitLayerBuilder<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimitLayerBuilder")
            .field("keys", &self.keys)
            .field("headers", &self.mode)
            .field("body", &self.body)
            .finish_non_exhaustive()
    }
}

impl<L: HttpLimiter> RateLimitLayer<L> {
    /// A builder around `limiter`, with no keys, cost 1 per request, the IETF headers and
    /// plain-text rejections.
    pub fn builder(limiter: L) -> RateLimitLayerBuilder<L> {
        RateLimitLayerBuilder {
            limiter,
            keys: Vec::new(),
            cost: None,
            mode: HeaderMode::default(),
            body: RejectionBody::default(),
        }
    }

    /// The limiter every clone shares.
    pub fn limiter(&self) -> &L {
        &self.shared.limiter
    }
}

impl<L: HttpLimiter> RateLimitLayerBuilder<L> {
    /// Takes a key named `name` from every request with `extractor`; layers read it with
    /// [`by_key`](crate::by_key)`(name)`. A request it cannot be taken from is rejected with
    /// the extractor's error (400 when the client's fault, 500 when the server's).
    pub fn key(mut self, name: &'static str, extractor: impl KeyExtractor) -> Self {
        self.keys.push(KeySpec {
            name,
            extractor: Box::new(extractor),
            required: true,
        });
        self
    }

    /// Like [`key`](Self::key), but a request without it goes ahead with the layers keyed by
    /// it skipped (an API key that only some clients send).
    pub fn optional_key(mut self, name: &'static str, extractor: impl KeyExtractor) -> Self {
        self.keys.push(KeySpec {
            name,
            extractor: Box::new(extractor),
            required: false,
        });
        self
    }

    /// What each request costs (by default 1; cost 0 only reports).
    pub fn cost(mut self, cost: impl Fn(&Parts) -> u64 + Send + Sync + 'static) -> Self {
        self.cost = Some(Box::new(cost));
        self
    }

    /// Which rate limit headers responses carry (by default [`HeaderMode::Ietf`]).
    pub fn headers(mut self, mode: HeaderMode) -> Self {
        self.mode = mode;
        self
    }

    /// How the middleware's own responses are written (by default plain text).
    pub fn body(mut self, body: RejectionBody) -> Self {
        self.body = body;
        self
    }

    /// Checks the keys and builds the layer, describing every policy for the headers once.
    /// Refused when two keys share a name, when a key's extractor is misconfigured (an IPv6
    /// prefix above 128, a header length bound of 0), or when a layer reads a key
    /// ([`by_key`](crate::by_key)`(name)`) that no [`key`](Self::key) or
    /// [`optional_key`](Self::optional_key) extracts: such a layer would never apply.
    pub fn build(self) -> Result<RateLimitLayer<L>, ConfigError> {
        for (i, key) in self.keys.iter().enumerate() {
            if self.keys[..i].iter().any(|k| k.name == key.name) {
                return Err(ConfigError::DuplicateKey { name: key.name });
            }
            key.extractor.check()?;
        }
        let layers = self.limiter.layers();
        for layer in &layers {
            let Some(name) = layer.key else { continue };
            if !self.keys.iter().any(|k| k.name == name) {
                let known: Vec<String> =
                    self.keys.iter().map(|k| format!("`{}`", k.name)).collect();
                return Err(ConfigError::UnknownKey {
                    layer: layer.name.clone(),
                    name,
                    known: if known.is_empty() {
                        "it extracts none".to_owned()
                    } else {
                        format!("it extracts {}", known.join(", "))
                    },
                });
            }
        }
        let policies = Policies::new(&layers);
        Ok(RateLimitLayer {
            shared: Arc::new(Shared {
                limiter: self.limiter,
                keys: self.keys,
                cost: self.cost,
                mode: self.mode,
                policies,
                body: self.body,
            }),
        })
    }
}

impl<S, L> Layer<S> for RateLimitLayer<L> {
    type Service = RateLimit<S, L>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// The rate limiting service [`RateLimitLayer`] wraps around `S`.
pub struct RateLimit<S, L> {
    inner: S,
    shared: Arc<Shared<L>>,
}

impl<S: Clone, L> Clone for RateLimit<S, L> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<S: fmt::Debug, L> fmt::Debug for RateLimit<S, L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimit")
            .field("inner", &self.inner)
            .field("layer", &self.shared)
            .finish()
    }
}

/// The body of a rate-limited response: the inner service's, or the middleware's own.
pub type RateLimitBody<B> = Either<B, Full<Bytes>>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, L, B, RB> Service<Request<B>> for RateLimit<S, L>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    L: HttpLimiter,
    B: Send + 'static,
{
    type Response = Response<RateLimitBody<RB>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The clone that was driven to readiness serves this call; the fresh one stays.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let shared = Arc::clone(&self.shared);
        let (parts, body) = request.into_parts();
        let grpc = response::is_grpc(&parts.headers);
        // Keys and cost are taken now, outside the future, so it carries only what it needs.
        let request = match shared.prepare(parts) {
            Ok(request) => request,
            Err(rejection) => return Box::pin(async move { Ok(shared.respond(&rejection, grpc)) }),
        };
        Box::pin(async move {
            // Only the rendered headers outlive the decision: the future stays small.
            let headers = match shared.decide(&request.0, request.1, grpc).await {
                Ok(headers) => headers,
                Err(response) => return Ok(response),
            };
            let request = Request::from_parts(request.0.parts, body);
            let mut response = inner.call(request).await?.map(Either::Left);
            headers.apply(response.headers_mut());
            Ok(response)
        })
    }
}

impl<L: HttpLimiter> Shared<L> {
    /// The request with its keys, and its cost; or why it cannot be keyed.
    fn prepare(&self, parts: Parts) -> Result<(HttpRequest, u64), Rejection> {
        let mut keys = Vec::with_capacity(self.keys.len());
        for spec in &self.keys {
            match spec.extractor.extract(&parts) {
                Ok(key) => keys.push((spec.name, Some(key))),
                Err(_) if !spec.required => keys.push((spec.name, None)),
                Err(error) => {
                    return Err(rejection(
                        RejectionKind::MissingKey,
                        error.status(),
                        error.to_string(),
                    ));
                }
            }
        }
        let cost = self.cost.as_ref().map_or(1, |cost| cost(&parts));
        Ok((HttpRequest { parts, keys }, cost))
    }

    /// The headers for an admitted request, or the response for any other verdict.
    async fn decide<RB>(
        &self,
        request: &HttpRequest,
        cost: u64,
        grpc: bool,
    ) -> Result<RateHeaders, Response<RateLimitBody<RB>>> {
        match self.limiter.decide(request, cost).await {
            Verdict::Decided(decision) if decision.is_allowed() => {
                Ok(self.policies.render(self.mode, &decision))
            }
            Verdict::FailedOpen => Ok(RateHeaders::default()),
            Verdict::Decided(decision) => Err(self.denied(&decision, grpc)),
            Verdict::FailedClosed { reason } => {
                let detail = format!("the rate limiter is unavailable ({reason}); try again later");
                let r = rejection(
                    RejectionKind::Unavailable,
                    StatusCode::SERVICE_UNAVAILABLE,
                    detail,
                );
                Err(self.respond(&r, grpc))
            }
            Verdict::Error { reason } => {
                let detail = format!("the request cannot be rate limited: {reason}");
                let r = rejection(
                    RejectionKind::Error,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    detail,
                );
                Err(self.respond(&r, grpc))
            }
        }
    }

    fn respond<RB>(&self, rejection: &Rejection, grpc: bool) -> Response<RateLimitBody<RB>> {
        self.body.render(rejection, grpc).map(Either::Right)
    }

    fn denied<RB>(&self, decision: &StackDecision, grpc: bool) -> Response<RateLimitBody<RB>> {
        let wait = decision.decision().retry_after_nanos();
        let policy = decision
            .binding()
            .and_then(|b| self.policies.layer_name(b.layer))
            .map(str::to_owned);
        let seconds = headers::ceil_seconds(wait).max(1);
        let detail = match &policy {
            Some(name) => format!("too many requests (limit `{name}`): retry after {seconds} s"),
            None => format!("too many requests: retry after {seconds} s"),
        };
        let rejection = Rejection {
            kind: RejectionKind::OverLimit,
            status: StatusCode::TOO_MANY_REQUESTS,
            retry_after: Some(Duration::from_nanos(wait)),
            policy,
            detail,
        };
        let mut response = self.body.render(&rejection, grpc);
        headers::retry_after(wait, response.headers_mut());
        self.policies
            .render(self.mode, decision)
            .apply(response.headers_mut());
        response.map(Either::Right)
    }
}

fn rejection(kind: RejectionKind, status: StatusCode, detail: String) -> Rejection {
    Rejection {
        kind,
        status,
        retry_after: None,
        policy: None,
        detail,
    }
}
