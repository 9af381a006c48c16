//! A tonic gRPC server behind the rate limiter, and a client that goes over its limit: the
//! denied call fails with `RESOURCE_EXHAUSTED`, which any gRPC client understands.
//!
//! ```sh
//! cargo run -p limiter-tower --example tonic
//! ```
//!
//! In your own crate, turn on limiter-tower's feature `tonic`: the middleware answers in the
//! inner service's body type, here tonic's.
//!
//! The server is tonic's standard health service, limited per `x-api-key` metadata value to 2
//! calls per second; it listens on a free loopback port and the client calls it three times.

use http::HeaderName;
use limiter_core::Limit;
use limiter_stack::Kind;
use limiter_stack::{Layer, Stack};
use limiter_tower::{HeaderKey, RateLimitLayer, by_key};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let stack = Stack::builder()
        .layer(
            Layer::keyed("per-key", by_key("api-key"))
                .limit(Kind::TokenBucket, Limit::per_second(2)),
        )
        .build()?;
    let limits = RateLimitLayer::builder(stack)
        .key(
            "api-key",
            HeaderKey::new(HeaderName::from_static("x-api-key")),
        )
        .build()?;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = Server::builder()
        .layer(limits)
        .add_service(health)
        .serve_with_incoming(TcpIncoming::from(listener));
    tokio::spawn(server);
    println!("gRPC health service on {addr}, 2 calls per second per x-api-key");

    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;
    let mut client = HealthClient::new(channel);
    for call in 1..=3 {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request.metadata_mut().insert("x-api-key", "demo".parse()?);
        match client.check(request).await {
            Ok(response) => println!(
                "call {call}: {:?}, ratelimit: {:?}",
                response.get_ref().status(),
                response.metadata().get("ratelimit")
            ),
            Err(status) => println!("call {call}: {:?}: {}", status.code(), status.message()),
        }
    }
    Ok(())
}
