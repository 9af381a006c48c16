//! The middleware on a Redis stack: a real `redis-server` on a free loopback port (started by
//! the test, with decisions and the deny cache on an injected `ManualClock`), and a Redis that is not there, for
//! each failure policy: fail closed answers 503 (never 429), fail open passes with no headers,
//! the fallback decides locally with the same headers; each failure is the operator's to read
//! in the log (paced), never the client's.

use crate::support;
use limiter_testkit::redis_server;

use std::time::Duration;

use crate::support::{get, item, items, serve};
use limiter_core::{Limit, ManualClock};
use limiter_redis::{Kind, OnFailure, RedisBackend, RedisLayer, RedisStack};
use limiter_tower::{HttpRequest, PeerIp, RateLimitLayer, by_key_string};

fn stack(backend: &RedisBackend, policy: OnFailure) -> RedisStack<HttpRequest> {
    RedisStack::builder(backend, "http")
        .layer(
            RedisLayer::keyed("per-ip", by_key_string("ip"))
                .limit(Kind::TokenBucket, Limit::per_second(2))
                .limit(Kind::SlidingWindow, Limit::per_minute(50)),
        )
        .layer(RedisLayer::global("global").limit(Kind::FixedWindow, Limit::per_second(1_000)))
        .on_failure(policy)
        .build()
        .unwrap()
}

#[tokio::test]
async fn decides_on_redis_with_the_same_headers() {
    let server = redis_server::RedisServer::start();
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let backend = RedisBackend::builder(server.url())
        .time_from(clock.clone())
        .clock(clock.clone())
        .connect()
        .await
        .unwrap();
    let limits = RateLimitLayer::builder(stack(&backend, OnFailure::Closed))
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(limits)).await;

    let policy = vec![
        item("per-ip.0", &[("q", 2), ("w", 1)]),
        item("per-ip.1", &[("q", 50), ("w", 60)]),
        item("global", &[("q", 1000), ("w", 1)]),
    ];
    let first = get(addr, &[]).await;
    assert_eq!(first.status, 200);
    assert_eq!(items(first.header("ratelimit-policy").unwrap()), policy);
    // The binding limit of the per-ip layer is the one with the fewest left: the bucket.
    // Every layer that applied is reported, each with its own binding limit.
    assert_eq!(
        items(first.header("ratelimit").unwrap()),
        [
            item("per-ip.0", &[("r", 1), ("t", 1)]),
            item("global", &[("r", 999), ("t", 1)])
        ]
    );
    assert_eq!(get(addr, &[]).await.status, 200);
    let denied = get(addr, &[]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(
        items(denied.header("ratelimit").unwrap())[0],
        item("per-ip.0", &[("r", 0), ("t", 1)])
    );
    // Half a second later one unit is back (Redis decides on the injected time).
    clock.advance(Duration::from_millis(500));
    assert_eq!(get(addr, &[]).await.status, 200);
    // The keys live in Redis: a second, independent middleware on the same server agrees.
    let other = RateLimitLayer::builder(stack(&backend, OnFailure::Closed))
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(other)).await;
    assert_eq!(get(addr, &[]).await.status, 429);
}

#[tokio::test]
async fn a_failing_backend_is_answered_by_its_policy_never_as_over_the_limit() {
    let (_capture, logs) = limiter_testkit::logs::capture();
    // Nothing listens on this port: every call fails (quickly, connection refused).
    let port = redis_server::free_port();
    let server = format!("127.0.0.1:{port}");
    let backend = RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();

    let closed = RateLimitLayer::builder(stack(&backend, OnFailure::Closed))
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let (app, calls) = support::counting_app();
    let addr = serve(app.layer(closed)).await;
    let reply = get(addr, &[]).await;
    assert_eq!(reply.status, 503);
    assert!(
        reply.body.starts_with("the rate limiter is unavailable"),
        "{}",
        reply.body
    );
    // The error names the server: the operator reads it in the log, the client never does.
    assert!(!reply.body.contains(&server), "{}", reply.body);
    let said = logs.text();
    assert!(
        said.lines()
            .any(|l| l.contains("refused with 503") && l.contains(&server)),
        "{said}"
    );
    assert_eq!(reply.header("retry-after"), None);
    assert_eq!(reply.header("ratelimit"), None);
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
    let grpc = support::send(addr, "POST", "/", &[("content-type", "application/grpc")]).await;
    assert_eq!(
        grpc.header("grpc-status"),
        Some("14"),
        "UNAVAILABLE, not RESOURCE_EXHAUSTED"
    );

    let open = RateLimitLayer::builder(stack(&backend, OnFailure::Open))
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(open)).await;
    let reply = get(addr, &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit"), None, "no limit was consulted");
    let said = logs.text();
    assert!(
        said.lines()
            .any(|l| l.contains("went through uncounted") && l.contains(&server)),
        "{said}"
    );

    let fallback = RateLimitLayer::builder(stack(&backend, OnFailure::Fallback))
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(fallback)).await;
    let reply = get(addr, &[]).await;
    assert_eq!(reply.status, 200);
    // The local fallback reports every layer, as Redis does.
    let state = items(reply.header("ratelimit").unwrap());
    assert_eq!(state[0], item("per-ip.0", &[("r", 1), ("t", 1)]));
    assert_eq!(state.len(), 2, "{state:?}");
    get(addr, &[]).await;
    assert_eq!(
        get(addr, &[]).await.status,
        429,
        "the local fallback enforces the same limit"
    );
    let said = logs.text();
    let fell_back: Vec<&str> = said
        .lines()
        .filter(|l| l.contains("its local fallback decided"))
        .collect();
    assert_eq!(fell_back.len(), 1, "paced, not a line a request:\n{said}");
    assert!(fell_back[0].contains(&server), "{said}");
}

/// A Redis layer reading a key the middleware never extracts is refused at build, as in
/// process: a typo would otherwise switch the limit off for every request.
#[tokio::test]
async fn a_redis_layer_reading_an_unregistered_key_is_refused_at_build() {
    let port = redis_server::free_port();
    let backend = RedisBackend::builder(format!("redis://127.0.0.1:{port}"))
        .timeout(Duration::from_millis(200))
        .connect()
        .await
        .unwrap();
    let err = RateLimitLayer::builder(stack(&backend, OnFailure::Closed))
        .key("peer-ip", PeerIp::new())
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "layer `per-ip` reads the key `ip`, which the middleware never extracts (it extracts `peer-ip`): register it with `.key(\"ip\", extractor)` or `.optional_key(…)`, or fix the name"
    );
    RateLimitLayer::builder(stack(&backend, OnFailure::Closed))
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
}

#[tokio::test]
async fn a_leased_stack_is_decided_locally_behind_the_middleware() {
    let server = redis_server::RedisServer::start();
    let clock = ManualClock::starting_at(1_700_000_000_000_000_000);
    let backend = RedisBackend::builder(server.url())
        .time_from(clock.clone())
        .clock(clock.clone())
        .connect()
        .await
        .unwrap();
    let leased = RedisStack::builder(&backend, "http-leased")
        .layer(
            RedisLayer::keyed("per-ip", by_key_string("ip"))
                .limit(Kind::TokenBucket, Limit::per_minute(20)),
        )
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
        .leased(limiter_redis::Lease::new(limiter_redis::Slack::units(5)))
        .unwrap();
    let limits = RateLimitLayer::builder(leased.clone())
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(limits)).await;
    let mut passed = 0;
    for _ in 0..25 {
        let response = get(addr, &[]).await;
        if response.status == 200 {
            passed += 1;
        } else {
            assert_eq!(response.status, 429);
            assert!(response.header("retry-after").is_some());
        }
    }
    assert_eq!(passed, 20, "the limit, exactly, through leases");
    let calls = backend.stats().round_trips;
    assert!(calls < 12, "{calls} script calls for 25 requests");
    assert!(leased.stats().leased > 0);
}
