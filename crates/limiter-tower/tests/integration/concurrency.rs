//! The concurrency layer over real HTTP on loopback: a streaming response holds its request's
//! permit until its body ends; a second request for the key meanwhile is answered 429 with
//! `Retry-After` (another key passes); a client that disconnects mid-body releases its permit;
//! beside a rate limit, the concurrency layer outermost keeps the two all or nothing.

use crate::support;

use std::sync::Arc;

use crate::support::{Feeds, open_stream, read_to_end, streaming_routes};
use bytes::Bytes;
use http::StatusCode;
use limiter_core::{Limit, ManualClock};
use limiter_stack::{Kind, Layer, Stack};
use limiter_testkit::http_client::send;
use limiter_tower::{ConcurrencyLayer, HeaderKey, HttpRequest, Key, RateLimitLayer, by_key};

fn api_key() -> HeaderKey {
    HeaderKey::new("x-api-key".parse().unwrap())
}

/// The routes behind at most one request in flight per `x-api-key`.
async fn serve() -> (std::net::SocketAddr, Feeds, ConcurrencyLayer<HeaderKey>) {
    let feeds: Feeds = Arc::default();
    let layer = ConcurrencyLayer::new(1, api_key()).unwrap();
    let app = streaming_routes(&feeds).layer(layer.clone());
    (support::serve(app).await, feeds, layer)
}

fn held(layer: &ConcurrencyLayer<HeaderKey>, key: &str) -> u64 {
    layer.permits().held(&Key::from(key))
}

#[tokio::test]
async fn a_streaming_response_holds_its_permit_until_its_body_ends() {
    let (addr, feeds, layer) = serve().await;
    let (mut stream, head) = open_stream(addr, "acme").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(held(&layer, "acme"), 1, "the open body holds the permit");

    let busy = send(addr, "GET", "/quick", &[("x-api-key", "acme")]).await;
    assert_eq!(busy.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(busy.header("retry-after"), Some("1"));
    assert!(busy.body.contains("in flight"), "{}", busy.body);
    let other = send(addr, "GET", "/quick", &[("x-api-key", "globex")]).await;
    assert_eq!(
        other.status,
        StatusCode::OK,
        "another key has its own permit"
    );
    let keyless = send(addr, "GET", "/quick", &[]).await;
    assert_eq!(keyless.status, StatusCode::BAD_REQUEST, "{}", keyless.body);

    // The body's last chunk, then its end: the permit is released before the final chunk of
    // the chunked encoding goes out, so once the client has read it the key is free.
    let feed = feeds.lock().unwrap().pop().unwrap();
    feed.send(Bytes::from_static(b"done")).await.unwrap();
    drop(feed);
    read_to_end(&mut stream).await;
    assert_eq!(held(&layer, "acme"), 0);
    let again = send(addr, "GET", "/quick", &[("x-api-key", "acme")]).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(
        held(&layer, "acme"),
        0,
        "a short response released its permit too"
    );
}

#[tokio::test]
async fn a_client_that_disconnects_mid_body_releases_its_permit() {
    let (addr, feeds, layer) = serve().await;
    let (stream, head) = open_stream(addr, "acme").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(held(&layer, "acme"), 1);
    drop(stream); // the client goes away mid-body

    // The server finds out when it writes to the closed connection and drops the body; the
    // feed's send fails once the body is gone, and by then its permit is released (dropped
    // first). Bounded, so a server that never notices fails the test instead of hanging it.
    let feed = feeds.lock().unwrap().pop().unwrap();
    let noticed = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while feed.send(Bytes::from_static(b"more")).await.is_ok() {}
    })
    .await;
    assert!(
        noticed.is_ok(),
        "the server never dropped the body of a closed connection"
    );
    assert_eq!(
        held(&layer, "acme"),
        0,
        "the disconnected request's permit was released"
    );
    let again = send(addr, "GET", "/quick", &[("x-api-key", "acme")]).await;
    assert_eq!(again.status, StatusCode::OK);
}

/// Two starts an hour per key (on a clock that does not move), at most one running: the
/// concurrency layer added last, so it is outermost, as docs/concurrency.md says.
#[tokio::test]
async fn outermost_a_busy_request_takes_no_rate_unit_and_a_rate_denial_keeps_no_permit() {
    let feeds: Feeds = Arc::default();
    let starts: Stack<HttpRequest, Key, ManualClock> = Stack::builder()
        .layer(Layer::keyed("starts", by_key("api")).limit(Kind::TokenBucket, Limit::per_hour(2)))
        .clock(ManualClock::new())
        .build()
        .unwrap();
    let rate = RateLimitLayer::builder(starts)
        .key("api", api_key())
        .build()
        .unwrap();
    let in_flight = ConcurrencyLayer::new(1, api_key()).unwrap();
    let app = streaming_routes(&feeds)
        .layer(rate)
        .layer(in_flight.clone());
    let addr = support::serve(app).await;
    let quick = || send(addr, "GET", "/quick", &[("x-api-key", "acme")]);

    // The first start runs (one unit of two taken) and holds the permit.
    let (mut stream, head) = open_stream(addr, "acme").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // A second while it runs: refused for concurrency, before the rate limit is asked.
    let busy = quick().await;
    assert_eq!(busy.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(busy.body.contains("in flight"), "{}", busy.body);
    let feed = feeds.lock().unwrap().pop().unwrap();
    drop(feed);
    read_to_end(&mut stream).await;
    assert_eq!(held(&in_flight, "acme"), 0);

    // So the second unit is still there: the busy request took none.
    let second = quick().await;
    assert_eq!(second.status, StatusCode::OK, "{}", second.body);
    // The third start is the rate limit's to refuse, and its permit goes back with the 429.
    let third = quick().await;
    assert_eq!(third.status, StatusCode::TOO_MANY_REQUESTS);
    assert!(third.body.contains("too many requests"), "{}", third.body);
    assert!(
        third.header("ratelimit").is_some(),
        "the rate limit answered"
    );
    assert_eq!(held(&in_flight, "acme"), 0, "a rate denial keeps no permit");
}
