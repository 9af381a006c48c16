//! An axum service behind the rate limiter: per client IP 5 per second (bursts of 5), writes
//! 1 per second on top, and a global cap, with the IETF `RateLimit` headers on every answer.
//!
//! ```sh
//! cargo run -p limiter-tower --example axum            # listens on 127.0.0.1:3000
//! curl -i http://127.0.0.1:3000/                       # 200, RateLimit: "per-ip";r=4;t=1, ...
//! for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code}\n' http://127.0.0.1:3000/; done
//! ```
//!
//! Set `LISTEN` to listen elsewhere (`LISTEN=127.0.0.1:0` picks a free port). Behind a load
//! balancer, key by `ClientIp::behind([its ranges])` instead of `PeerIp`.

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use http::Method;
use limiter_core::Limit;
use limiter_stack::Kind;
use limiter_stack::{Layer, Stack};
use limiter_tower::{HttpRequest, PeerIp, RateLimitLayer, by_key};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stack = Stack::builder()
        .layer(Layer::keyed("per-ip", by_key("ip")).limit(Kind::TokenBucket, Limit::per_second(5)))
        .layer(
            Layer::keyed("writes", |r: &HttpRequest| {
                (r.method() != Method::GET)
                    .then(|| r.key("ip").cloned())
                    .flatten()
            })
            .limit(Kind::TokenBucket, Limit::per_second(1)),
        )
        .layer(Layer::global("global").limit(Kind::TokenBucket, Limit::per_second(10_000)))
        .build()?;
    let limits = RateLimitLayer::builder(stack)
        .key("ip", PeerIp::new())
        .build()?;

    let app = Router::new()
        .route(
            "/",
            get(|| async { "hello\n" }).post(|| async { "written\n" }),
        )
        .layer(limits);

    let listen = std::env::var("LISTEN").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    println!("listening on http://{}/", listener.local_addr()?);
    // The peer address must be recorded for `PeerIp`: serve with connect info.
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .await?;
    Ok(())
}
