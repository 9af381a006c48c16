//! The body of the HTTP middleware's fuzz target (feature `http`), shared with the plain test
//! that replays saved inputs: bytes become a layer name, a peer address, a forwarded-hops
//! header, an API key, a header mode and a burst of calls through `limiter_tower::RateLimit`,
//! and every response is checked.
//!
//! What must hold for any input: no panic; a peer outside the trusted ranges is its own key
//! whatever headers it sends (no spoofing); only a trusted peer's hop list can be refused
//! (400); every `RateLimit` and `RateLimit-Policy` value parses as a Structured Field List of
//! String items with the draft's Integer parameters, one `RateLimit` item per policy; a 429
//! carries a `Retry-After` of at least 1 second; legacy headers are decimal integers.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::IpAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body_util::Full;
use limiter_core::{Limit, ManualClock};
use limiter_stack::Kind;
use limiter_stack::{Layer, Stack};
use limiter_tower::{
    ClientIp, ForwardedHeader, HeaderKey, HeaderMode, HttpRequest, IpNet, Key, PeerAddr,
    RateLimitLayer, RejectionBody, by_key,
};
use tower_layer::Layer as _;
use tower_service::Service;

/// The ranges the fuzzed middleware trusts as proxies.
const TRUSTED: [&str; 2] = ["10.0.0.0/8", "fd00::/8"];

/// The response body of [`Ok200`] and of the middleware in front of it.
pub type Body = Full<Bytes>;

/// An inner service that answers 200 with an empty body, at once (for the fuzz body and the
/// middleware's benchmark).
#[derive(Clone, Copy, Debug)]
pub struct Ok200;

impl Service<Request<()>> for Ok200 {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(Body::default())))
    }
}

/// Runs one fuzz input, panicking on any violation.
///
/// Layout: byte 0 holds flags (bit 0 legacy headers, bit 1 `Forwarded` instead of
/// `X-Forwarded-For`, bit 2 problem+json bodies, bit 3 a trusted default peer), byte 1 the
/// cost (0 to 3), byte 2 how many calls (1 to 8); the rest splits at `0xFF` bytes into the
/// layer name, the hops header value, the API key value and the peer (4 or 16 bytes; else
/// the default peer).
pub fn run_bytes(bytes: &[u8]) {
    let Some((&[flags, cost, calls], rest)) = bytes.split_first_chunk::<3>() else {
        return;
    };
    let mut parts = rest.split(|b| *b == 0xFF);
    let name = String::from_utf8_lossy(parts.next().unwrap_or_default()).into_owned();
    let hops = parts.next().unwrap_or_default();
    let api_key = parts.next().unwrap_or_default();
    let peer = peer_of(parts.next().unwrap_or_default(), flags);
    let header = if flags & 2 != 0 {
        ForwardedHeader::Forwarded
    } else {
        ForwardedHeader::XForwardedFor
    };
    let mode = if flags & 1 != 0 {
        HeaderMode::Legacy
    } else {
        HeaderMode::Ietf
    };
    let trusted: Vec<IpNet> = TRUSTED
        .iter()
        .map(|r| r.parse().expect("valid range"))
        .collect();
    let client = ClientIp::behind(trusted.clone()).header(header);

    let mut head = Request::get("/");
    if let Ok(value) = HeaderValue::from_bytes(hops) {
        head = head.header(header.name(), value);
    }
    if let Ok(value) = HeaderValue::from_bytes(api_key) {
        head = head.header("x-api-key", value);
    }
    let Ok(template) = head.body(()) else {
        return;
    };

    // No spoofing: an untrusted peer is its own client whatever it wrote.
    let resolved = client.resolve(peer, template.headers());
    let peer_trusted = trusted.iter().any(|net| net.contains(peer));
    if !peer_trusted {
        assert_eq!(
            resolved,
            Ok(peer.to_canonical()),
            "an untrusted peer spoofed its key"
        );
    }

    let Some(stack) = stack_named(&name) else {
        return;
    };
    let body = if flags & 4 != 0 {
        RejectionBody::ProblemJson
    } else {
        RejectionBody::PlainText
    };
    let layer = RateLimitLayer::builder(stack)
        .key("client", client)
        .optional_key(
            "api-key",
            HeaderKey::new(http::header::HeaderName::from_static("x-api-key")),
        )
        .cost(move |_| u64::from(cost % 4))
        .headers(mode)
        .body(body)
        .build()
        .expect("distinct key names, each layer's key registered");
    let mut service = layer.layer(Ok200);
    for _ in 0..=(calls % 8) {
        let mut request = Request::get("/").body(()).expect("valid");
        *request.headers_mut() = template.headers().clone();
        request
            .extensions_mut()
            .insert(PeerAddr((peer, 4000).into()));
        check(&call(&mut service, request), mode, peer_trusted);
    }
}

/// The peer the input names (4 or 16 bytes), else the default: a trusted proxy's address
/// with flag bit 3, an untrusted one without.
fn peer_of(bytes: &[u8], flags: u8) -> IpAddr {
    match bytes {
        &[a, b, c, d] => IpAddr::from([a, b, c, d]),
        p if p.len() == 16 => IpAddr::from(<[u8; 16]>::try_from(p).expect("16 bytes")),
        _ if flags & 8 != 0 => IpAddr::from([10, 0, 0, 1]),
        _ => IpAddr::from([203, 0, 113, 1]),
    }
}

/// Per client (the layer named `name`: `None` when the name is refused), per API key and a
/// global cap: two keys and a global layer, the fixed-plan path on several keys.
fn stack_named(name: &str) -> Option<Stack<HttpRequest, Key, ManualClock>> {
    Stack::builder()
        .layer(single(name, by_key("client")))
        .layer(single("per-key", by_key("api-key")))
        .layer(Layer::global("global").limit(Kind::TokenBucket, limit(50)))
        .clock(ManualClock::new())
        .build()
        .ok()
}

fn limit(count: u64) -> Limit {
    Limit::per_second(count)
}

fn single(
    name: &str,
    keyer: impl limiter_stack::Keyer<HttpRequest, Key> + 'static,
) -> Layer<HttpRequest, Key> {
    Layer::keyed(name, keyer).limit(Kind::TokenBucket, limit(5))
}

/// Calls `service` once and polls the future once: an in-memory stack decides at once, so
/// the answer is there without a runtime.
pub fn call<S>(service: &mut S, request: Request<()>) -> Response<Body>
where
    S: Service<Request<()>, Response = Response<Body>, Error = Infallible>,
{
    let mut cx = Context::from_waker(Waker::noop());
    let mut future = pin!(service.call(request));
    match future.as_mut().poll(&mut cx) {
        Poll::Ready(Ok(response)) => response,
        Poll::Ready(Err(never)) => match never {},
        Poll::Pending => panic!("an in-memory stack decides at once"),
    }
}

fn check(response: &Response<Body>, mode: HeaderMode, peer_trusted: bool) {
    let status = response.status().as_u16();
    let headers = response.headers();
    match status {
        200 | 429 => {}
        400 => {
            assert!(
                peer_trusted,
                "only a trusted proxy's hop list can be refused"
            );
            return;
        }
        other => panic!("unexpected status {other}"),
    }
    if status == 429 {
        let retry = headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        assert!(retry.is_some_and(|s| s >= 1), "a 429 says when: {retry:?}");
    }
    match mode {
        HeaderMode::Ietf => {
            let policy = list(headers, "ratelimit-policy", &["q", "w", "burst"]);
            let state = list(headers, "ratelimit", &["r", "t"]);
            assert_eq!(
                policy, state,
                "one RateLimit item per policy, in the same order"
            );
            assert!(!policy.is_empty());
        }
        HeaderMode::Legacy => {
            for name in [
                "x-ratelimit-limit",
                "x-ratelimit-remaining",
                "x-ratelimit-reset",
            ] {
                let value = headers.get(name).map(HeaderValue::to_str);
                assert!(
                    matches!(value, Some(Ok(v)) if v.parse::<u64>().is_ok()),
                    "{name}: {value:?}"
                );
            }
        }
        HeaderMode::Off => {}
    }
}

/// The item names of a Structured Field List whose items are Strings carrying non-negative
/// Integer parameters from `params` only.
fn list(headers: &http::HeaderMap, name: &str, params: &[&str]) -> Vec<String> {
    let value = headers.get(name).unwrap_or_else(|| panic!("no {name}"));
    let list: sfv::List = sfv::Parser::new(value.as_bytes())
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {value:?} is not a Structured Field List: {e}"));
    list.into_iter()
        .map(|entry| {
            let sfv::ListEntry::Item(item) = entry else {
                panic!("{name}: {value:?} has an inner list");
            };
            for (key, v) in &item.params {
                assert!(params.contains(&key.as_str()), "{name}: parameter {key:?}");
                assert!(
                    v.as_integer().is_some_and(|n| i64::from(n) >= 0),
                    "{name}: {key:?} is not a non-negative Integer"
                );
            }
            item.bare_item
                .as_string()
                .unwrap_or_else(|| panic!("{name}: {value:?}: a name is a String"))
                .as_str()
                .to_owned()
        })
        .collect()
}
