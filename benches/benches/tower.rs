//! The HTTP middleware's own cost: one request through `RateLimit` (key extraction, the stack,
//! the headers, an inner service that answers at once) beside the bare stack check it wraps,
//! in the same group, so one run gives the overhead the tower issue targets (at most 1 µs per
//! request). The service is called directly and its future polled once: an in-memory stack
//! decides without waiting, so nothing here measures a runtime or a socket. Building each
//! request is setup, outside the timing.

use std::hint::black_box;

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

criterion_group!(benches, middleware);
criterion_main!(benches);
