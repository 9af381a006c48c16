//! The fleet's concurrency layer over real HTTP on loopback and a real `redis-server`: two
//! processes' layers (each its own backend) share one count; a body that ends or whose client
//! disconnects releases its permit; a body that keeps streaming past half the time to live
//! renews it (a pinned clock); while Redis fails, 503, or the service is called when failing
//! open.

use crate::support;

use std::time::Duration;

use crate::support::{Feeds, open_stream, read_to_end, streaming_routes};
use bytes::Bytes;
use http::StatusCode;
use limiter_core::ManualClock;
use limiter_redis::{RedisBackend, RedisPermits};
use limiter_testkit::http_client::send;
use limiter_testkit::redis_server::{RedisServer, raw_command};
use limiter_tower::{HeaderKey, RedisConcurrencyLayer};
use tokio::io::AsyncReadExt;

/// A Unix time (ns) the pinned tests start at.
const START: u64 = 1_790_000_000_000_000_000;
const S: u64 = 1_000_000_000;

/// `/stream` answers a body the test feeds (its sender pushed to `feeds`); `/quick` answers at
/// once; both behind `layer`. The address and the feeds.
async fn serve(layer: RedisConcurrencyLayer<HeaderKey>) -> (std::net::SocketAddr, Feeds) {
    let feeds: Feeds = Feeds::default();
    let app = streaming_routes(&feeds).layer(layer);
    (support::serve(app).await, feeds)
}

async fn permits(server: &RedisServer, clock: Option<&ManualClock>, ttl: Duration) -> RedisPermits {
    // Not a test of timeouts: a loaded machine (the whole suite at once) must not fail it.
    let mut builder = RedisBackend::builder(server.url().as_str()).timeout(Duration::from_secs(2));
    if let Some(clock) = clock {
        builder = builder.clock(clock.clone()).time_from(clock.clone());
    }
    let backend = builder.connect().await.expect("connects");
    backend.permits("exports", 1, ttl).expect("valid")
}

fn layer(permits: RedisPermits) -> RedisConcurrencyLayer<HeaderKey> {
    RedisConcurrencyLayer::new(permits, HeaderKey::new("x-api-key".parse().unwrap())).unwrap()
}

/// Waits (bounded) until `key` holds `count` permits: releases run in background tasks.
async fn until_held(permits: &RedisPermits, key: &str, count: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while permits.held(key).await.unwrap() != count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} never held {count}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_share_the_count_and_an_ended_or_dropped_body_releases() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(30);
    let (one, two) = (
        permits(&server, None, ttl).await,
        permits(&server, None, ttl).await,
    );
    let (a, feeds) = serve(layer(one.clone())).await;
    let (b, _) = serve(layer(two)).await;

    let (mut stream, head) = open_stream(a, "acme").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(
        one.held("acme").await.unwrap(),
        1,
        "the open body holds the permit"
    );
    let busy = send(b, "GET", "/quick", &[("x-api-key", "acme")]).await;
    assert_eq!(
        busy.status,
        StatusCode::TOO_MANY_REQUESTS,
        "the other process: {}",
        busy.body
    );
    let wait: u64 = busy
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    assert!(
        (29..=30).contains(&wait),
        "until the held permit expires: {wait}"
    );
    assert!(busy.body.contains("in flight"), "{}", busy.body);
    assert_eq!(
        send(b, "GET", "/quick", &[("x-api-key", "globex")])
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(
        send(b, "GET", "/quick", &[]).await.status,
        StatusCode::BAD_REQUEST
    );

    // The body ends: its permit goes back, and the other process may take it.
    let feed = feeds.lock().unwrap().pop().unwrap();
    feed.send(Bytes::from_static(b"done")).await.unwrap();
    drop(feed);
    read_to_end(&mut stream).await;
    until_held(&one, "acme", 0).await;
    assert_eq!(
        send(b, "GET", "/quick", &[("x-api-key", "acme")])
            .await
            .status,
        StatusCode::OK
    );
    until_held(&one, "acme", 0).await;

    // A client that goes away mid-body: the server drops the body, and its permit goes back.
    let (stream, head) = open_stream(a, "acme").await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(one.held("acme").await.unwrap(), 1);
    drop(stream);
    let feed = feeds.lock().unwrap().pop().unwrap();
    let noticed = tokio::time::timeout(Duration::from_secs(30), async {
        while feed.send(Bytes::from_static(b"more")).await.is_ok() {}
    })
    .await;
    assert!(
        noticed.is_ok(),
        "the server never dropped the body of a closed connection"
    );
    until_held(&one, "acme", 0).await;
}

/// The expiry (ms) Redis holds for `key`'s one permit, by the score of its sorted set.
fn expiry_ms(server: &RedisServer, key: &str) -> Option<u64> {
    let reply = raw_command(
        server.port,
        &format!("ZRANGE limiter:permits:exports:{{{key}}} 0 -1 WITHSCORES"),
    )?;
    // `*2 $<n> <id> $<n> <score>`: the score is the last line.
    reply.lines().rev().find(|l| !l.is_empty())?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_keeps_streaming_renews_its_permit_and_one_that_stalls_does_not() {
    let server = RedisServer::start();
    let clock = ManualClock::new();
    clock.set(START);
    let permits = permits(&server, Some(&clock), Duration::from_secs(10)).await;
    let (addr, feeds) = serve(layer(permits.clone())).await;
    let (mut streaming, _) = open_stream(addr, "acme").await;
    let (_stalled, _) = open_stream(addr, "globex").await;
    // In the order the streams were opened: acme's, then globex's.
    let [streaming_feed, stalled_feed] = [0, 1].map(|_| feeds.lock().unwrap().remove(0));
    let taken = START / 1_000_000 + 10_000;
    assert_eq!(expiry_ms(&server, "acme"), Some(taken));

    // Less than half the time to live: a frame renews nothing.
    clock.advance(Duration::from_secs(4));
    streaming_feed.send(Bytes::from_static(b"a")).await.unwrap();
    let mut chunk = [0u8; 64];
    let mut read = async |stream: &mut tokio::net::TcpStream| {
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut chunk));
        read.await.expect("the frame never came").unwrap()
    };
    assert!(read(&mut streaming).await > 0);
    // Past half of it: the next frame renews the permit to a full time to live from now.
    clock.advance(Duration::from_secs(2));
    streaming_feed.send(Bytes::from_static(b"b")).await.unwrap();
    assert!(read(&mut streaming).await > 0);
    let renewed = (START + 6 * S) / 1_000_000 + 10_000;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while expiry_ms(&server, "acme") != Some(renewed) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "never renewed: {:?}",
            expiry_ms(&server, "acme")
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Past the first time to live: the streaming body still holds its permit; the stalled one
    // has lost its own (it expired on Redis while its body waited).
    clock.advance(Duration::from_secs(5));
    assert_eq!(permits.held("acme").await.unwrap(), 1);
    assert_eq!(permits.held("globex").await.unwrap(), 0);
    drop((stalled_feed, streaming_feed));
}

// One thread: its servers log where the capture is.
#[tokio::test]
async fn while_redis_fails_requests_are_refused_with_503_or_pass_when_failing_open() {
    let (_capture, logs) = limiter_testkit::logs::capture();
    let mut server = RedisServer::start();
    let address = format!("127.0.0.1:{}", server.port);
    let ttl = Duration::from_secs(30);
    let (closed, _) = serve(layer(permits(&server, None, ttl).await)).await;
    let (open, _) = serve(layer(permits(&server, None, ttl).await).fail_open()).await;
    assert_eq!(
        send(closed, "GET", "/quick", &[("x-api-key", "acme")])
            .await
            .status,
        StatusCode::OK
    );
    server.kill();
    let refused = send(closed, "GET", "/quick", &[("x-api-key", "acme")]).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        refused.body
    );
    assert!(refused.body.contains("unavailable"), "{}", refused.body);
    // The error names the server: the operator reads it in the log, the client never does.
    assert!(!refused.body.contains(&address), "{}", refused.body);
    let passed = send(open, "GET", "/quick", &[("x-api-key", "acme")]).await;
    assert_eq!(passed.status, StatusCode::OK, "{}", passed.body);
    let said = logs.text();
    for what in ["refused with 503", "went through without a permit"] {
        assert!(
            said.lines()
                .any(|l| l.contains(what) && l.contains(&address)),
            "{what}: {said}"
        );
    }
}
