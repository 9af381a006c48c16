//! The middleware over real sockets: an axum app on a loopback port, the testkit's hyper
//! client opening a new connection per request (so every request meets a fresh clone of the
//! service), and the header values read back as Structured Fields. Time comes from a
//! `ManualClock`.

use crate::support;

use std::sync::atomic::Ordering;

use crate::support::{get, item, items, send, serve};
use http::{HeaderName, Method, Response, StatusCode};
use limiter_core::{Limit, ManualClock};
use limiter_stack::Kind;
use limiter_stack::{Layer, Stack};
use limiter_tower::{
    ClientIp, ForwardedHeader, HeaderKey, HeaderMode, HttpRequest, Key, PeerIp, RateLimitLayer,
    RejectionBody, by_key,
};
use tower_layer::Layer as _;
use tower_service::Service as _;

type HttpStack = Stack<HttpRequest, Key, ManualClock>;

/// One layer keyed by the peer IP: `count` per second, bursts of `count`.
fn per_ip(clock: &ManualClock, count: u64) -> HttpStack {
    Stack::builder()
        .layer(
            Layer::keyed("per-ip", by_key("ip")).limit(Kind::TokenBucket, Limit::per_second(count)),
        )
        .clock(clock.clone())
        .build()
        .unwrap()
}

#[tokio::test]
async fn ietf_headers_on_every_response_and_a_denial_that_calls_nothing() {
    let clock = ManualClock::new();
    let stack = Stack::builder()
        .layer(Layer::keyed("per-ip", by_key("ip")).limit(Kind::TokenBucket, Limit::per_second(3)))
        .layer(Layer::global("global").limit(Kind::TokenBucket, Limit::per_minute(100)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let limits = RateLimitLayer::builder(stack)
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let (app, calls) = support::counting_app();
    let addr = serve(app.layer(limits)).await;

    let policy = vec![
        item("per-ip", &[("q", 3), ("w", 1)]),
        item("global", &[("q", 100), ("w", 60)]),
    ];
    for n in 1..=3_i64 {
        let reply = get(addr, &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(reply.body, "ok");
        assert_eq!(items(reply.header("ratelimit-policy").unwrap()), policy);
        // Full again after n/3 s (per-ip) and n * 0.6 s (global): rounded up to whole seconds.
        assert_eq!(
            items(reply.header("ratelimit").unwrap()),
            vec![
                item("per-ip", &[("r", 3 - n), ("t", 1)]),
                item("global", &[("r", 100 - n), ("t", (n * 600 + 999) / 1000)]),
            ]
        );
        assert_eq!(reply.header("retry-after"), None);
    }

    let denied = get(addr, &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    // 1/3 s until one unit is back: rounded up, never down.
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(
        denied.header("content-type"),
        Some("text/plain; charset=utf-8")
    );
    assert_eq!(
        denied.body,
        "too many requests (limit `per-ip`): retry after 1 s\n"
    );
    assert_eq!(items(denied.header("ratelimit-policy").unwrap()), policy);
    let state = items(denied.header("ratelimit").unwrap());
    assert_eq!(state[0], item("per-ip", &[("r", 0), ("t", 1)]));
    // The denial took nothing from the global layer either.
    assert_eq!(state[1].0, "global");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "a denial never reaches the service"
    );

    // Exactly one unit comes back after 1/3 s, not a nanosecond sooner.
    clock.advance(std::time::Duration::from_nanos(333_333_333));
    assert_eq!(get(addr, &[]).await.status, StatusCode::TOO_MANY_REQUESTS);
    clock.advance(std::time::Duration::from_nanos(1));
    let again = get(addr, &[]).await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(
        items(again.header("ratelimit").unwrap())[1],
        item("global", &[("r", 96), ("t", 3)])
    );
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn cloned_services_share_one_limiter() {
    let clock = ManualClock::new();
    let limits = RateLimitLayer::builder(per_ip(&clock, 2))
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let (app, calls) = support::counting_app();
    let mut first = limits.layer(app);
    let mut second = first.clone();
    let mut third = limits.clone().layer(support::counting_app().0);
    let request = || {
        let mut r = http::Request::get("/")
            .body(axum::body::Body::empty())
            .unwrap();
        r.extensions_mut()
            .insert(limiter_tower::PeerAddr(([192, 0, 2, 1], 9).into()));
        r
    };
    assert_eq!(first.call(request()).await.unwrap().status(), 200);
    assert_eq!(second.call(request()).await.unwrap().status(), 200);
    // A clone of the layer, around another service, still shares the limiter.
    assert_eq!(third.call(request()).await.unwrap().status(), 429);
    assert_eq!(first.call(request()).await.unwrap().status(), 429);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn legacy_headers_and_no_headers() {
    let clock = ManualClock::new();
    let legacy = RateLimitLayer::builder(per_ip(&clock, 2))
        .key("ip", PeerIp::new())
        .headers(HeaderMode::Legacy)
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(legacy)).await;
    let reply = get(addr, &[]).await;
    assert_eq!(reply.header("x-ratelimit-limit"), Some("2"));
    assert_eq!(reply.header("x-ratelimit-remaining"), Some("1"));
    assert_eq!(reply.header("x-ratelimit-reset"), Some("1"));
    assert_eq!(reply.header("ratelimit"), None);
    get(addr, &[]).await;
    let denied = get(addr, &[]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(denied.header("retry-after"), Some("1"));

    let off = RateLimitLayer::builder(per_ip(&clock, 1))
        .key("ip", PeerIp::new())
        .headers(HeaderMode::Off)
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(off)).await;
    let reply = get(addr, &[]).await;
    assert_eq!(reply.status, 200);
    for name in ["ratelimit", "ratelimit-policy", "x-ratelimit-limit"] {
        assert_eq!(reply.header(name), None, "{name}");
    }
    let denied = get(addr, &[]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(
        denied.header("retry-after"),
        Some("1"),
        "a 429 always says when"
    );
}

#[tokio::test]
async fn reads_and_writes_are_limited_differently() {
    let clock = ManualClock::new();
    let stack = Stack::builder()
        .layer(Layer::keyed("per-ip", by_key("ip")).limit(Kind::TokenBucket, Limit::per_second(5)))
        .layer(
            // Writes only: reads skip this layer.
            Layer::keyed("writes", |r: &HttpRequest| {
                (r.method() != Method::GET)
                    .then(|| r.key("ip").cloned())
                    .flatten()
            })
            .limit(Kind::TokenBucket, Limit::per_second(1)),
        )
        .layer(
            // One route has a tighter limit of its own.
            Layer::keyed("other-route", |r: &HttpRequest| {
                (r.path() == "/other")
                    .then(|| r.key("ip").cloned())
                    .flatten()
            })
            .limit(Kind::TokenBucket, Limit::per_minute(1)),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    let limits = RateLimitLayer::builder(stack)
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(limits)).await;

    let write = send(addr, "POST", "/", &[]).await;
    assert_eq!(write.status, 200);
    assert_eq!(
        items(write.header("ratelimit").unwrap()),
        vec![
            item("per-ip", &[("r", 4), ("t", 1)]),
            item("writes", &[("r", 0), ("t", 1)]),
        ]
    );
    let second_write = send(addr, "PUT", "/", &[]).await;
    assert_eq!(second_write.status, 429);
    assert_eq!(
        second_write.body,
        "too many requests (limit `writes`): retry after 1 s\n"
    );
    let read = get(addr, &[]).await;
    assert_eq!(read.status, 200);
    assert_eq!(
        items(read.header("ratelimit-policy").unwrap()),
        vec![item("per-ip", &[("q", 5), ("w", 1)])],
        "a layer that does not apply is not advertised"
    );
    assert_eq!(send(addr, "GET", "/other", &[]).await.status, 200);
    let route = send(addr, "GET", "/other", &[]).await;
    assert_eq!(route.status, 429);
    assert_eq!(route.header("retry-after"), Some("60"));
}

#[tokio::test]
async fn a_missing_key_gets_the_configured_response_never_a_pass() {
    let clock = ManualClock::new();
    let stack = || {
        Stack::builder()
            .layer(
                Layer::keyed("per-key", by_key("api-key"))
                    .limit(Kind::TokenBucket, Limit::per_second(2)),
            )
            .layer(
                Layer::keyed("per-ip", by_key("ip"))
                    .limit(Kind::TokenBucket, Limit::per_second(100)),
            )
            .clock(clock.clone())
            .build()
            .unwrap()
    };
    let api_key = || HeaderKey::new(HeaderName::from_static("x-api-key"));

    // Required, default response: 400 saying what is missing.
    let required = RateLimitLayer::builder(stack())
        .key("api-key", api_key())
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let (app, calls) = support::counting_app();
    let addr = serve(app.layer(required)).await;
    let reply = get(addr, &[]).await;
    assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    assert_eq!(
        reply.body,
        "the request has no `x-api-key` header: send one\n"
    );
    assert_eq!(get(addr, &[("x-api-key", "k1")]).await.status, 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // Required, custom response: 401 with a body of the user's.
    let custom = RateLimitLayer::builder(stack())
        .key("api-key", api_key())
        .key("ip", PeerIp::new())
        .body(RejectionBody::custom(|rejection| {
            let status = if rejection.status == StatusCode::BAD_REQUEST {
                StatusCode::UNAUTHORIZED
            } else {
                rejection.status
            };
            Response::builder()
                .status(status)
                .body(rejection.detail.clone().into())
                .unwrap()
        }))
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(custom)).await;
    let reply = get(addr, &[]).await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        reply.body,
        "the request has no `x-api-key` header: send one"
    );

    // Optional: a request without it skips the layer keyed by it.
    let optional = RateLimitLayer::builder(stack())
        .optional_key("api-key", api_key())
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(optional)).await;
    let reply = get(addr, &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        items(reply.header("ratelimit-policy").unwrap()),
        vec![item("per-ip", &[("q", 100), ("w", 1)])]
    );

    // A server that does not record peer addresses is told how to fix it: 500, not a pass.
    let limits = RateLimitLayer::builder(per_ip(&clock, 10))
        .key("ip", PeerIp::new())
        .build()
        .unwrap();
    let (app, calls) = support::counting_app();
    let addr = support::serve_without_connect_info(app.layer(limits)).await;
    let reply = get(addr, &[]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(
        reply.body.contains("into_make_service_with_connect_info"),
        "{}",
        reply.body
    );
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn forwarded_addresses_count_only_behind_trusted_proxies() {
    let clock = ManualClock::new();
    // The test client connects from 127.0.0.1: trusted here, as a load balancer would be.
    let trusted = RateLimitLayer::builder(per_ip(&clock, 2))
        .key("ip", ClientIp::behind(["127.0.0.1/32".parse().unwrap()]))
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(trusted)).await;
    let xff = |v: &'static str| [("x-forwarded-for", v)];
    assert_eq!(get(addr, &xff("6.6.6.6, 203.0.113.9")).await.status, 200);
    assert_eq!(get(addr, &xff("203.0.113.9")).await.status, 200);
    // Whatever the client prepends, its key is the address the proxy saw.
    for spoof in ["7.7.7.7, 203.0.113.9", "8.8.8.8, 127.0.0.1, 203.0.113.9"] {
        assert_eq!(get(addr, &xff(spoof)).await.status, 429, "{spoof}");
    }
    // Another client has its own limit; so does the proxy's own traffic.
    assert_eq!(get(addr, &xff("203.0.113.10")).await.status, 200);
    assert_eq!(get(addr, &[]).await.status, 200);
    // A proxy-vouched entry that is not an address is refused, not guessed around.
    let junk = get(addr, &xff("203.0.113.11, not-an-ip")).await;
    assert_eq!(junk.status, 400);
    assert!(junk.body.contains("not-an-ip"), "{}", junk.body);

    // The peer is not a trusted proxy: its headers are ignored, all of them share its limit.
    let untrusted = RateLimitLayer::builder(per_ip(&clock, 2))
        .key("ip", ClientIp::behind(["10.0.0.0/8".parse().unwrap()]))
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(untrusted)).await;
    assert_eq!(get(addr, &xff("1.1.1.1")).await.status, 200);
    assert_eq!(get(addr, &xff("2.2.2.2")).await.status, 200);
    assert_eq!(get(addr, &xff("3.3.3.3")).await.status, 429);
    assert_eq!(get(addr, &[("forwarded", "for=4.4.4.4")]).await.status, 429);

    // RFC 7239 `Forwarded`, read instead of (never as well as) X-Forwarded-For.
    let rfc = RateLimitLayer::builder(per_ip(&clock, 1))
        .key(
            "ip",
            ClientIp::behind(["127.0.0.0/8".parse().unwrap()]).header(ForwardedHeader::Forwarded),
        )
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(rfc)).await;
    let v6 = [("forwarded", r#"for="[2001:db8:1:2::7]:443""#)];
    assert_eq!(get(addr, &v6).await.status, 200);
    // Same /64, another address: the same client.
    let same_net = [
        ("forwarded", r#"for="[2001:db8:1:2:ffff::1]""#),
        ("x-forwarded-for", "9.9.9.9"),
    ];
    assert_eq!(get(addr, &same_net).await.status, 429);
    assert_eq!(
        get(addr, &[("forwarded", r#"for="[2001:db8:1:3::7]""#)])
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn problem_json_grpc_and_undecidable_requests() {
    let (_capture, logs) = limiter_testkit::logs::capture();
    let clock = ManualClock::new();
    let problem = RateLimitLayer::builder(per_ip(&clock, 1))
        .key("ip", PeerIp::new())
        .body(RejectionBody::ProblemJson)
        .build()
        .unwrap();
    let addr = serve(support::counting_app().0.layer(problem)).await;
    get(addr, &[]).await;
    let denied = get(addr, &[]).await;
    assert_eq!(denied.status, 429);
    assert_eq!(
        denied.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(
        denied.body,
        r#"{"type":"about:blank","title":"Too Many Requests","status":429,"detail":"too many requests (limit `per-ip`): retry after 1 s","policy":"per-ip","retry_after":1}"#
    );

    // A gRPC client gets RESOURCE_EXHAUSTED as a trailers-only response, as tonic expects.
    let grpc = [("content-type", "application/grpc+proto")];
    let status = send(addr, "POST", "/", &grpc).await;
    assert_eq!(status.status, 200);
    assert_eq!(status.header("grpc-status"), Some("8"));
    assert_eq!(
        status.header("grpc-message"),
        Some("too many requests (limit `per-ip`): retry after 1 s")
    );
    assert_eq!(status.header("content-type"), Some("application/grpc"));

    // A cost above the burst can never be admitted: an error (500), not a 429 with a wait.
    let too_costly = RateLimitLayer::builder(per_ip(&clock, 3))
        .key("ip", PeerIp::new())
        .cost(|parts| if parts.uri.path() == "/other" { 4 } else { 1 })
        .build()
        .unwrap();
    let (app, calls) = support::counting_app();
    let addr = serve(app.layer(too_costly)).await;
    let reply = send(addr, "GET", "/other", &[]).await;
    assert_eq!(reply.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert!(reply.body.contains("burst"), "{}", reply.body);
    assert_eq!(get(addr, &[]).await.status, 200);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    // The operator reads it too.
    let said = logs.text();
    assert!(
        said.lines()
            .any(|l| l.contains("cannot be rate limited") && l.contains("burst")),
        "{said}"
    );
}

#[test]
fn duplicate_key_names_are_refused() {
    let clock = ManualClock::new();
    let err = RateLimitLayer::builder(per_ip(&clock, 1))
        .key("ip", PeerIp::new())
        .key("ip", ClientIp::behind([]))
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "two keys are named `ip`: give each key its own name"
    );
}

/// A layer reading a key the middleware never extracts would never apply: a typo must not
/// switch a limit off, so the middleware refuses to build, naming the layer, the key and the
/// keys it does extract. Keys registered as optional count; closures cannot be checked.
#[test]
fn a_layer_reading_an_unregistered_key_is_refused_at_build() {
    let clock = ManualClock::new();
    let typo = RateLimitLayer::builder(per_ip(&clock, 1))
        .key("client-ip", PeerIp::new())
        .key(
            "api-key",
            HeaderKey::new(HeaderName::from_static("x-api-key")),
        )
        .build()
        .unwrap_err();
    assert_eq!(
        typo,
        limiter_tower::ConfigError::UnknownKey {
            layer: "per-ip".to_owned(),
            name: "ip",
            known: "it extracts `client-ip`, `api-key`".to_owned(),
        }
    );
    assert!(
        typo.to_string().contains(r#".key("ip", extractor)"#),
        "{typo}"
    );

    let none = RateLimitLayer::builder(per_ip(&clock, 1))
        .build()
        .unwrap_err();
    assert!(none.to_string().contains("it extracts none"), "{none}");

    // The second of several layers, with plans, is checked too.
    let plans = Stack::builder()
        .layer(Layer::keyed("per-ip", by_key("ip")).limit(Kind::TokenBucket, Limit::per_second(5)))
        .layer(Layer::keyed("per-key", by_key("api_key")).plans(
            [
                limiter_stack::Plan::new("read").limit(Kind::TokenBucket, Limit::per_second(2)),
                limiter_stack::Plan::new("write").limit(Kind::TokenBucket, Limit::per_second(1)),
            ],
            |r: &HttpRequest| usize::from(r.method() != Method::GET),
        ))
        .clock(clock.clone())
        .build()
        .unwrap();
    let err = RateLimitLayer::builder(plans)
        .key("ip", PeerIp::new())
        .optional_key(
            "api-key",
            HeaderKey::new(HeaderName::from_static("x-api-key")),
        )
        .build()
        .unwrap_err();
    assert!(
        matches!(&err, limiter_tower::ConfigError::UnknownKey { layer, name: "api_key", .. } if layer == "per-key"),
        "{err:?}"
    );

    // Registered, optional or not, it builds; a closure keyer is the user's to check.
    RateLimitLayer::builder(per_ip(&clock, 1))
        .optional_key("ip", PeerIp::new())
        .build()
        .unwrap();
    let closure = Stack::builder()
        .layer(
            Layer::keyed("by-host", |r: &HttpRequest| {
                r.headers()
                    .get("host")
                    .map(|h| Key::from(h.to_str().unwrap_or("")))
            })
            .limit(Kind::TokenBucket, Limit::per_second(5)),
        )
        .clock(clock)
        .build()
        .unwrap();
    RateLimitLayer::builder(closure).build().unwrap();
}

/// Extractor settings take no `?` where they are written; a bad one is refused once, by
/// `build()`, with the fix.
#[test]
fn misconfigured_extractors_are_refused_at_build() {
    let clock = ManualClock::new();
    let prefix = RateLimitLayer::builder(per_ip(&clock, 1))
        .key("ip", PeerIp::new().ipv6_prefix(129))
        .build()
        .unwrap_err();
    assert_eq!(
        prefix,
        limiter_tower::ConfigError::Ipv6Prefix { prefix: 129 }
    );
    assert!(prefix.to_string().contains("use 0 to 128"), "{prefix}");
    let forwarded = RateLimitLayer::builder(per_ip(&clock, 1))
        .key("ip", ClientIp::behind([]).ipv6_prefix(130))
        .build()
        .unwrap_err();
    assert_eq!(
        forwarded,
        limiter_tower::ConfigError::Ipv6Prefix { prefix: 130 }
    );
    let header = RateLimitLayer::builder(per_ip(&clock, 1))
        .key("ip", PeerIp::new())
        .optional_key(
            "api-key",
            HeaderKey::new(HeaderName::from_static("x-api-key")).max_len(0),
        )
        .build()
        .unwrap_err();
    assert_eq!(header, limiter_tower::ConfigError::ZeroMaxLen);
    RateLimitLayer::builder(per_ip(&clock, 1))
        .key("ip", ClientIp::behind([]).ipv6_prefix(48))
        .optional_key(
            "api-key",
            HeaderKey::new(HeaderName::from_static("x-api-key")).max_len(64),
        )
        .build()
        .unwrap();
}

/// The middleware takes any `AsyncLimiter`: a direct limiter and a keyed one behind their keyer
/// serve it as a one-layer stack does, with the same headers and denials, and a keyed limiter
/// reading an unregistered key is refused at build like a stack layer.
#[tokio::test]
async fn direct_and_keyed_limiters_serve_the_middleware_like_a_stack() {
    use limiter_stack::KeyedBy;
    use limiter_token_bucket::{KeyedTokenBucket, TokenBucket};

    let clock = ManualClock::new();
    let direct = TokenBucket::with_clock(Limit::per_second(2), clock.clone()).unwrap();
    let limits = RateLimitLayer::builder(direct).build().unwrap();
    let (app, calls) = support::counting_app();
    let addr = serve(app.layer(limits)).await;
    for remaining in [1, 0] {
        let reply = get(addr, &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            items(reply.header("ratelimit-policy").unwrap()),
            vec![item("limit", &[("q", 2), ("w", 1)])]
        );
        assert_eq!(
            items(reply.header("ratelimit").unwrap()),
            vec![item("limit", &[("r", remaining), ("t", 1)])]
        );
    }
    let denied = get(addr, &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let api_key = || HeaderKey::new(HeaderName::from_static("x-api-key"));
    let keyed = || {
        KeyedBy::new(
            "per-key",
            KeyedTokenBucket::<Key, ManualClock>::with_clock(Limit::per_minute(1), clock.clone())
                .unwrap(),
            by_key("api"),
        )
    };
    let refused = RateLimitLayer::builder(keyed())
        .key("apikey", api_key())
        .build()
        .unwrap_err();
    assert!(refused.to_string().contains("`api`"), "{refused}");

    let limits = RateLimitLayer::builder(keyed())
        .key("api", api_key())
        .build()
        .unwrap();
    let (app, calls) = support::counting_app();
    let addr = serve(app.layer(limits)).await;
    for key in ["a", "b"] {
        let reply = get(addr, &[("x-api-key", key)]).await;
        assert_eq!(reply.status, StatusCode::OK, "{key}");
        assert_eq!(
            items(reply.header("ratelimit").unwrap()),
            vec![item("per-key", &[("r", 0), ("t", 60)])]
        );
    }
    let denied = get(addr, &[("x-api-key", "a")]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        denied.body,
        "too many requests (limit `per-key`): retry after 60 s\n"
    );
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

/// The shortcut: one call limits every client IP, with the IETF headers; a limit the token
/// bucket refuses is a clear error. (Its clock is the default one; a limit per hour does not
/// refill within the test.)
#[tokio::test]
async fn per_ip_limits_each_client_in_one_call() {
    let limits = RateLimitLayer::per_ip(Limit::per_hour(2)).unwrap();
    let (app, calls) = support::counting_app();
    let addr = serve(app.layer(limits)).await;
    for remaining in [1, 0] {
        let reply = get(addr, &[]).await;
        assert_eq!(reply.status, StatusCode::OK);
        assert_eq!(
            items(reply.header("ratelimit").unwrap())[0],
            item(
                "per-ip",
                &[
                    ("r", remaining),
                    ("t", if remaining == 1 { 1_800 } else { 3_600 })
                ]
            )
        );
    }
    let denied = get(addr, &[]).await;
    assert_eq!(denied.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let refused = RateLimitLayer::per_ip(Limit::per_second(1).with_burst(u64::MAX)).unwrap_err();
    assert!(refused.to_string().contains("per-ip"), "{refused}");
}
