//! gRPC through the middleware: tonic's standard health service behind the limiter on a
//! loopback port, called by a real tonic client over HTTP/2. A denial arrives as the gRPC
//! status `RESOURCE_EXHAUSTED` with the reason; a missing key as `INVALID_ARGUMENT`; admitted
//! calls carry the `ratelimit` metadata.

use std::net::SocketAddr;

use http::HeaderName;
use limiter_core::{Limit, ManualClock};
use limiter_stack::Kind;
use limiter_stack::{Layer, Stack};
use limiter_tower::{HeaderKey, RateLimitLayer, by_key};
use tonic::Code;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

async fn serve(
    limits: RateLimitLayer<Stack<limiter_tower::HttpRequest, limiter_tower::Key, ManualClock>>,
) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        let _reporter = reporter;
        Server::builder()
            .layer(limits)
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

fn check(api_key: Option<&'static str>) -> tonic::Request<HealthCheckRequest> {
    let mut request = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    if let Some(key) = api_key {
        request
            .metadata_mut()
            .insert("x-api-key", key.parse().unwrap());
    }
    request
}

#[tokio::test]
async fn a_denial_is_resource_exhausted_for_a_tonic_client() {
    let clock = ManualClock::new();
    let stack = Stack::builder()
        .layer(
            Layer::keyed("per-key", by_key("api-key"))
                .limit(Kind::TokenBucket, Limit::per_second(2)),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let limits = RateLimitLayer::builder(stack)
        .key(
            "api-key",
            HeaderKey::new(HeaderName::from_static("x-api-key")),
        )
        .build()
        .unwrap();
    let addr = serve(limits).await;
    // Deadlines, so a server that stopped answering fails the test rather than hanging it.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);

    let first = client.check(check(Some("k1"))).await.unwrap();
    assert_eq!(
        first.metadata().get("ratelimit").unwrap(),
        r#""per-key";r=1;t=1"#
    );
    client.check(check(Some("k1"))).await.unwrap();
    let denied = client.check(check(Some("k1"))).await.unwrap_err();
    assert_eq!(denied.code(), Code::ResourceExhausted);
    assert_eq!(
        denied.message(),
        "too many requests (limit `per-key`): retry after 1 s"
    );
    // Another key has its own limit; time brings the first one back.
    client.check(check(Some("k2"))).await.unwrap();
    clock.advance(std::time::Duration::from_millis(500));
    client.check(check(Some("k1"))).await.unwrap();

    let missing = client.check(check(None)).await.unwrap_err();
    assert_eq!(missing.code(), Code::InvalidArgument);
    assert_eq!(
        missing.message(),
        "the request has no `x-api-key` header: send one"
    );
}
