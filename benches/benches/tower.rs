//! The HTTP middleware's own cost, in two groups.
//!
//! - `tower`: one request through `RateLimit` (key extraction, the stack, the headers, an
//!   inner service that answers at once) beside the bare stack check it wraps.
//! - `tower_axum`: the same axum router bare, behind tower_governor (its default per-IP
//!   limiter, with and without its headers) and behind our layer (per-IP token bucket, each
//!   header mode), every call allowed. A layer's overhead is its time minus the bare router's,
//!   so one run gives the ratio to tower_governor's overhead and what each header mode adds.
//!
//! Every service is driven as tower drives it, `poll_ready` then `call`, with the future polled
//! once: an in-memory limiter decides without waiting and the handler answers at once, so
//! nothing here measures a runtime or a socket. Building each request is setup, outside the
//! timing; dropping the response is inside it.

use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::routing::get;
use tower_governor::GovernorLayer;
use tower_governor::governor::GovernorConfigBuilder;
use tower_service::Service;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::Request;
use limiter_benches::{group, never_limit, token_bucket_allow};
use limiter_core::Limit;
use limiter_stack::Kind;
use limiter_stack::{Layer, Stack};
use limiter_testkit::http::{Ok200, call};
use limiter_tower::{HeaderMode, HttpRequest, Key, PeerAddr, PeerIp, RateLimitLayer, by_key};
use tower_layer::Layer as _;

fn per_ip(limit: Limit) -> Stack<HttpRequest, Key> {
    Stack::builder()
        .layer(Layer::keyed("per-ip", by_key("ip")).limit(Kind::TokenBucket, limit))
        .build()
        .expect("valid")
}

fn request() -> Request<()> {
    let mut request = Request::get("/").body(()).expect("valid");
    request
        .extensions_mut()
        .insert(PeerAddr(([192, 0, 2, 1], 4000).into()));
    request
}

fn middleware(c: &mut Criterion) {
    let mut g = group(c, "tower", 1);

    let bare = per_ip(token_bucket_allow());
    let (parts, ()) = request().into_parts();
    let key = Key::Ip(std::net::IpAddr::from([192, 0, 2, 1]));
    let prepared = HttpRequest::new(parts, [("ip", Some(key))]);
    g.bench_function("bare_stack_check", |b| {
        b.iter(|| {
            bare.check(black_box(&prepared))
                .expect("valid")
                .is_allowed()
        })
    });

    for (name, mode, limit) in [
        ("layer_ietf_headers", HeaderMode::Ietf, token_bucket_allow()),
        ("layer_no_headers", HeaderMode::Off, token_bucket_allow()),
        ("layer_denied_429", HeaderMode::Ietf, never_limit()),
    ] {
        let layer = RateLimitLayer::builder(per_ip(limit))
            .key("ip", PeerIp::new())
            .headers(mode)
            .build()
            .expect("valid");
        let mut service = layer.layer(Ok200);
        let _ = call(&mut service, request());
        g.bench_function(name, |b| {
            b.iter_batched(
                request,
                |r| call(&mut service, black_box(r)).status().as_u16(),
                BatchSize::SmallInput,
            )
        });
    }
    g.finish();
}

fn axum_request() -> Request<Body> {
    let mut request = Request::get("/").body(Body::empty()).expect("valid");
    request
        .extensions_mut()
        .insert(ConnectInfo(SocketAddr::from(([192, 0, 2, 1], 4000))));
    request
}

/// `poll_ready`, `call`, one poll of the future: the status, or a panic if anything waited.
fn drive<S>(service: &mut S, request: Request<Body>) -> u16
where
    S: Service<Request<Body>, Response = http::Response<Body>>,
    S::Error: std::fmt::Debug,
{
    let mut cx = Context::from_waker(Waker::noop());
    match service.poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {}
        other => panic!("not ready: {other:?}"),
    }
    let mut future = pin!(service.call(request));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(response)) => response.status().as_u16(),
        Poll::Ready(Err(e)) => panic!("failed: {e:?}"),
        Poll::Pending => panic!("an in-memory limiter and an instant handler never wait"),
    }
}

fn router() -> Router {
    Router::new().route("/", get(|| async { "ok" }))
}

fn axum_router(c: &mut Criterion) {
    let mut g = group(c, "tower_axum", 1);
    let mut bench = |name: &str, mut service: Router| {
        assert_eq!(drive(&mut service, axum_request()), 200, "{name}");
        g.bench_function(name, |b| {
            b.iter_batched(
                axum_request,
                |r| drive(&mut service, black_box(r)),
                BatchSize::SmallInput,
            )
        });
    };

    bench("bare_router", router());

    // tower_governor's per-peer-IP limiter, as its README sets it up, at a rate no run reaches.
    let per_second = NonZeroU32::new(1_000_000_000).expect("non-zero");
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(per_second.get())
        .finish()
        .expect("valid");
    bench(
        "tower_governor",
        router().layer(GovernorLayer::new(Arc::new(config))),
    );
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(per_second.get())
        .use_headers()
        .finish()
        .expect("valid");
    bench(
        "tower_governor_headers",
        router().layer(GovernorLayer::new(Arc::new(config))),
    );

    for (name, mode) in [
        ("ours_no_headers", HeaderMode::Off),
        ("ours_ietf_headers", HeaderMode::Ietf),
        ("ours_legacy_headers", HeaderMode::Legacy),
    ] {
        let layer = RateLimitLayer::builder(per_ip(token_bucket_allow()))
            .key("ip", PeerIp::new())
            .headers(mode)
            .build()
            .expect("valid");
        bench(name, router().layer(layer));
    }
    g.finish();
}

criterion_group!(benches, middleware, axum_router);
criterion_main!(benches);
