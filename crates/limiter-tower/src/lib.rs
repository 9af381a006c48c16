//! Rate limiting as a tower layer, for axum, hyper and tonic: any stack of limits (in process or
//! on Redis) in front of a service, with the IETF `RateLimit` headers.
//!
//! A [`RateLimitLayer`] takes named keys from each request (the peer's IP with IPv6 cut to a
//! /64, the client's IP behind proxies you trust, an API key header, or any closure), decides
//! the request on an [`AsyncLimiter`] (a `limiter_stack::Stack` over [`HttpRequest`], a direct
//! limiter, a keyed one with its keyer in a `limiter_stack::KeyedBy`, or a
//! `limiter_redis::RedisStack` with feature `redis`), and then:
//!
//! - **admits**: calls the service and adds the headers (`RateLimit-Policy` and `RateLimit`,
//!   one item per layer; or the legacy `X-RateLimit-*`; or none);
//! - **denies**: answers 429 with `Retry-After` in whole seconds rounded up, the same headers,
//!   and a plain-text, `application/problem+json` or custom body; the service is not called
//!   and the denial consumed nothing;
//! - **fails closed** (a Redis backend down, policy "closed"): answers 503, never 429;
//! - **cannot key the request** (no API key header, no peer address): answers the key error's
//!   status (400, or 500 for a server set up wrong) with a message saying what is missing.
//!
//! A gRPC request gets a gRPC status instead (`RESOURCE_EXHAUSTED` for a denial). Cloning the
//! layer or the service shares one limiter, so an axum router cloning per connection still
//! limits across connections.
//!
//! # Example
//!
//! Per IP 10 per second, writes 2 per second on top, and a global cap:
//!
//! ```
//! use std::net::SocketAddr;
//!
//! use axum::{Router, extract::ConnectInfo, routing::get};
//! use http::{Method, Request};
//! use limiter_core::Limit;
//! use limiter_stack::{Kind, Layer, Stack};
//! use limiter_tower::{HttpRequest, PeerIp, RateLimitLayer, by_key};
//! use tower_service::Service;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let stack = Stack::builder()
//!     .layer(Layer::keyed("per-ip", by_key("ip")).limit(Kind::TokenBucket, Limit::per_second(10)))
//!     .layer(
//!         // Reads skip this layer: a keyer returning `None` leaves the request out.
//!         Layer::keyed("writes", |r: &HttpRequest| {
//!             (r.method() != Method::GET).then(|| r.key("ip").cloned()).flatten()
//!         })
//!         .limit(Kind::TokenBucket, Limit::per_second(2)),
//!     )
//!     .layer(Layer::global("global").limit(Kind::TokenBucket, Limit::per_second(10_000)))
//!     .build()?;
//! let limits = RateLimitLayer::builder(stack).key("ip", PeerIp::new()).build()?;
//! let mut app = Router::new().route("/", get(|| async { "hello" })).layer(limits);
//! // Serve it with `axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>())`;
//! // here one request goes straight in, as axum would hand it over.
//! let mut request = Request::get("/").body(axum::body::Body::empty())?;
//! request.extensions_mut().insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 4000))));
//! let response = app.call(request).await?;
//! assert_eq!(response.status(), 200);
//! assert_eq!(
//!     response.headers()["ratelimit-policy"],
//!     r#""per-ip";q=10;w=1, "global";q=10000;w=1"#
//! );
//! assert_eq!(response.headers()["ratelimit"], r#""per-ip";r=9;t=1, "global";r=9999;t=1"#);
//! # Ok(()) }
//! ```
//!
//! A layer keyed by [`by_key`]`(name)` reads the key registered under `name`; `build()`
//! refuses a layer whose name no [`key`](RateLimitLayerBuilder::key) or
//! [`optional_key`](RateLimitLayerBuilder::optional_key) registers
//! ([`ConfigError::UnknownKey`]), so a typo cannot switch a limit off. A closure keyer is not
//! checked.
//!
//! On Redis, build a `limiter_redis::RedisStack<HttpRequest>` with
//! `RedisLayer::keyed("per-ip", by_key_string("ip"))` and hand it to the same builder.
//!
//! Beside rate limits, a [`ConcurrencyLayer`] keeps at most `count` requests in flight per key,
//! each holding its permit until its response body ends or is dropped.
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

mod body;
mod concurrency;
mod digits;
mod error;
mod failures;
#[cfg(feature = "redis")]
mod fleet;
mod future;
mod headers;
mod ip;
mod key;
mod layer;
mod request;
mod response;
mod values;

pub use body::AnswerBody;
pub use concurrency::{
    BodyPermit, ConcurrencyLayer, ConcurrencyLimit, DEFAULT_RETRY_AFTER, PermitBody, PermitFuture,
};
pub use error::{ConfigError, IpNetError, KeyError};
#[cfg(feature = "redis")]
pub use fleet::{FleetPermitFuture, RedisConcurrencyLayer, RedisConcurrencyLimit};
pub use future::ResponseFuture;
pub use headers::HeaderMode;
pub use ip::{ForwardedHeader, IpNet};
pub use key::{ClientIp, DEFAULT_IPV6_PREFIX, HeaderKey, Key, KeyExtractor, PeerAddr, PeerIp};
pub use layer::{PerIpStack, RateLimit, RateLimitLayer, RateLimitLayerBuilder};
pub use limiter_stack::{AsyncLimiter, Decide, LayerInfo, Outcome};
pub use request::{ByKey, ByKeyString, HttpRequest, by_key, by_key_string};
pub use response::{Rejection, RejectionBody, RejectionKind};
