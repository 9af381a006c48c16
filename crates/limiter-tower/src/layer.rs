//! [`RateLimitLayer`] builds the [`RateLimit`] service (its future: `future.rs`): extract the
//! keys, decide, then call the inner service with the rate limit headers added, or answer 429
//! / 503 / 400 / 500 without calling it. Every clone of the layer or the service shares one
//! limiter (an axum router clones its services per connection).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response, StatusCode};
use limiter_core::Limit;
use limiter_stack::{
    AsyncLimiter, CallError, Decide, Kind, LayerAnswers, Outcome, Stack, StackDecision,
};
use tower_layer::Layer;
use tower_service::Service;

use crate::body::AnswerBody;
use crate::error::ConfigError;
use crate::failures::FailureLog;
use crate::future::ResponseFuture;
use crate::headers::{self, HeaderMode, Policies, RateHeaders};
use crate::key::{Key, KeyExtractor, PeerIp};
use crate::request::{HttpRequest, KeyList, by_key};
use crate::response::{self, Rejection, RejectionBody, RejectionKind, rejection};

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
    /// The failures answered for, for the operator.
    failures: FailureLog,
}

/// Rate limits every request through an [`AsyncLimiter`] (an in-process `Stack`, a direct
/// limiter, a keyed one with its keyer, or a Redis stack). Build one with [`RateLimitLayer::builder`]; see the crate docs for an example.
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

/// The stack [`RateLimitLayer::per_ip`] limits with: a token bucket per client IP.
pub type PerIpStack = Stack<HttpRequest, Key>;

impl RateLimitLayer<PerIpStack> {
    /// Every client limited to `limit` by a token bucket per IP (the connection's peer address;
    /// IPv6 cut to a /64), with the IETF headers: the common case in one call. Serve the
    /// router with connect info (`into_make_service_with_connect_info::<SocketAddr>()`);
    /// behind a proxy, or for several limits, build the stack yourself with
    /// [`builder`](Self::builder) and [`ClientIp`](crate::ClientIp).
    ///
    /// ```
    /// use limiter_core::Limit;
    /// use limiter_tower::RateLimitLayer;
    ///
    /// let layer = RateLimitLayer::per_ip(Limit::per_second(5))?;
    /// let app = axum::Router::<()>::new()
    ///     .route("/", axum::routing::get(|| async { "hello" }))
    ///     .layer(layer);
    /// # let _ = app;
    /// # Ok::<(), limiter_tower::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::Stack`] if the token bucket refuses `limit`.
    pub fn per_ip(limit: Limit) -> Result<Self, ConfigError> {
        let stack = Stack::builder()
            .layer(
                limiter_stack::Layer::keyed("per-ip", by_key("ip")).limit(Kind::TokenBucket, limit),
            )
            .build()?;
        Self::builder(stack).key("ip", PeerIp::new()).build()
    }
}

impl<L: AsyncLimiter<HttpRequest>> RateLimitLayer<L> {
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

impl<L: AsyncLimiter<HttpRequest>> RateLimitLayerBuilder<L> {
    /// Takes a key named `name` from every request with `extractor`; layers read it with
    /// [`by_key`]`(name)`. A request it cannot be taken from is rejected with
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
    /// ([`by_key`]`(name)`) that no [`key`](Self::key) or
    /// [`optional_key`](Self::optional_key) extracts: such a layer would never apply.
    pub fn build(self) -> Result<RateLimitLayer<L>, ConfigError> {
        for (i, key) in self.keys.iter().enumerate() {
            if self.keys[..i].iter().any(|k| k.name == key.name) {
                return Err(ConfigError::DuplicateKey { name: key.name });
            }
            key.extractor.check()?;
        }
        let layers = AsyncLimiter::layers(&self.limiter);
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
                failures: FailureLog::new(),
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

impl<S, L, B, RB> Service<Request<B>> for RateLimit<S, L>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send,
    L: AsyncLimiter<HttpRequest> + 'static,
    B: Send + 'static,
    RB: AnswerBody,
{
    type Response = Response<RB>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future, RB, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let shared = &self.shared;
        let (parts, body) = request.into_parts();
        // Keys and cost are taken now, outside any future, so a future carries only what it
        // needs; the head moves once, into the request the limiter sees, and its keys are
        // written in place beside it (taken first and moved in, the head moved twice).
        let mut request = HttpRequest {
            parts,
            keys: KeyList::default(),
        };
        if let Err(rejection) = shared.take_keys(&mut request) {
            let grpc = response::is_grpc(&request.parts.headers);
            return ResponseFuture::answered(shared.respond(&rejection, grpc));
        }
        let cost = shared.cost.as_ref().map_or(1, |cost| cost(&request.parts));
        // In process, the answer is here now. A remote limiter's future borrows the request
        // and has done nothing yet: it is dropped, and asked again from a future that owns the
        // request.
        let now = shared.decide_now(&request, cost);
        if let Some(verdict) = now {
            // The inner service (the one driven to readiness) is called at once: no
            // allocation, no clone of it.
            return match verdict {
                Ok(headers) => {
                    let request = Request::from_parts(request.parts, body);
                    ResponseFuture::inner(self.inner.call(request), headers)
                }
                Err(response) => ResponseFuture::answered(response),
            };
        }
        // The clone that was driven to readiness serves this call; the fresh one stays.
        let ready = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, ready);
        let shared = Arc::clone(shared);
        ResponseFuture::waiting(Box::pin(async move {
            let mut each = None;
            let answer = shared.decide(&request, cost, &mut each).await;
            let headers = match shared.verdict(&answer, &request, answers(&each)) {
                Ok(headers) => headers,
                Err(response) => return Ok(response),
            };
            let request = Request::from_parts(request.parts, body);
            let mut response = inner.call(request).await?;
            headers.apply(response.headers_mut());
            Ok(response)
        }))
    }
}

impl<L: AsyncLimiter<HttpRequest>> Shared<L> {
    /// Takes the request's keys into its list (empty), or says why it cannot be keyed.
    fn take_keys(&self, request: &mut HttpRequest) -> Result<(), Rejection> {
        for spec in &self.keys {
            match spec.extractor.extract(&request.parts) {
                Ok(key) => request.keys.push(spec.name, Some(key)),
                Err(_) if !spec.required => request.keys.push(spec.name, None),
                Err(error) => {
                    return Err(rejection(
                        RejectionKind::MissingKey,
                        error.status(),
                        error.to_string(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The verdict on `request` when the limiter answers at once (in process), `None` when it
    /// decides later. Each layer's answer is kept only for the IETF headers. The answer is
    /// read where the limiter wrote it, not moved out of `Decide::Now` into an `Option` first
    /// (a copy of the whole answer per request). Where each layer's answer is kept (`each`
    /// borrowed until the answer is out), an admission is told apart in place and rendered
    /// from `each` alone; only another answer is moved out.
    #[allow(clippy::result_large_err)]
    #[inline]
    fn decide_now<RB: AnswerBody>(
        &self,
        request: &HttpRequest,
        cost: u64,
    ) -> Option<Result<RateHeaders, Response<RB>>> {
        if self.mode != HeaderMode::Ietf {
            return match self.limiter.decide_request(request, cost) {
                Decide::Now(answer) => Some(self.verdict(&answer, request, answers(&None))),
                Decide::Later(_unpolled) => None,
            };
        }
        let mut each = None;
        let other = match self.decide(request, cost, &mut each) {
            Decide::Now(Ok(Outcome::Decided {
                decision,
                failure: None,
                ..
            })) if decision.is_allowed() => None,
            Decide::Now(other) => Some(other),
            Decide::Later(_unpolled) => return None,
        };
        let each = answers(&each);
        Some(match other {
            None => Ok(self.policies.ietf(each)),
            Some(answer) => self.verdict(&answer, request, each),
        })
    }

    /// The limiter's answer to `cost` units of `request`, with each layer's in `each` when
    /// the headers report every layer (else `each` stays `None`: nothing is kept).
    #[inline]
    fn decide<'a>(
        &'a self,
        request: &'a HttpRequest,
        cost: u64,
        each: &'a mut Option<LayerAnswers>,
    ) -> Decide<'a> {
        if self.mode == HeaderMode::Ietf {
            let each = each.insert(LayerAnswers::new());
            self.limiter.decide_request_each(request, cost, each)
        } else {
            self.limiter.decide_request(request, cost)
        }
    }

    /// The headers for an admitted request (`each`: every layer's answer, for the IETF
    /// headers), or the response for any other answer.
    // The error is the response itself, returned as is: boxing it would cost an allocation.
    #[allow(clippy::result_large_err)]
    fn verdict<RB: AnswerBody>(
        &self,
        answer: &Result<Outcome, CallError>,
        request: &HttpRequest,
        each: &LayerAnswers,
    ) -> Result<RateHeaders, Response<RB>> {
        // Read only to answer: an admitted request never looks.
        let grpc = || response::is_grpc(request.headers());
        // A failure is the operator's to read (logged, paced); of a store's, the client is
        // told only that the limiter is unavailable: its error names servers and keys.
        let log = &self.failures;
        match answer {
            Ok(Outcome::Decided {
                decision, failure, ..
            }) => {
                if let Some(failure) = failure {
                    log.report(
                        "the rate limiter's store failed: its local fallback decided",
                        failure,
                    );
                }
                if decision.is_allowed() {
                    // `decide_now` renders an in-process IETF admission from `each` as this does.
                    Ok(self.policies.render(self.mode, decision, each))
                } else {
                    Err(self.denied(decision, each, grpc()))
                }
            }
            Ok(Outcome::FailedOpen(failure)) => {
                log.report(
                    "the rate limiter's store failed: the request went through uncounted",
                    failure,
                );
                Ok(RateHeaders::default())
            }
            Ok(Outcome::FailedClosed(failure)) => {
                log.report(
                    "the rate limiter's store failed: the request was refused with 503",
                    failure,
                );
                let detail = "the rate limiter is unavailable; try again later".to_owned();
                let r = rejection(
                    RejectionKind::Unavailable,
                    StatusCode::SERVICE_UNAVAILABLE,
                    detail,
                );
                Err(self.respond(&r, grpc()))
            }
            Err(reason) => {
                log.report(
                    "a request cannot be rate limited: it was refused with 500",
                    reason,
                );
                // The stack's own error (a cost above a burst, a full key store) names layers
                // and limits, which the headers show anyway: the client may act on it.
                let detail = format!("the request cannot be rate limited: {reason}");
                let r = rejection(
                    RejectionKind::Error,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    detail,
                );
                Err(self.respond(&r, grpc()))
            }
        }
    }

    fn respond<RB: AnswerBody>(&self, rejection: &Rejection, grpc: bool) -> Response<RB> {
        self.body.render(rejection, grpc).map(RB::from_answer)
    }

    fn denied<RB: AnswerBody>(
        &self,
        decision: &StackDecision,
        each: &LayerAnswers,
        grpc: bool,
    ) -> Response<RB> {
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
            .render(self.mode, decision, each)
            .apply(response.headers_mut());
        response.map(RB::from_answer)
    }
}

/// Each layer's answer where it was kept, else none.
fn answers(each: &Option<LayerAnswers>) -> &LayerAnswers {
    static NONE: LayerAnswers = LayerAnswers::new();
    each.as_ref().unwrap_or(&NONE)
}
