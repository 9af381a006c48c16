//! limiterd over loopback sockets, in the same run: envoy's gRPC `ShouldRateLimit` against the
//! HTTP floor, the least a request to the service costs (`GET /healthz` on a keep-alive
//! connection: parse, route, answer, no decision).
//!
//! - `floor`: `GET /healthz`, one request at a time on one HTTP/1.1 connection.
//! - `http_decision`: `POST /v1/ratelimit` for one identifier of the built-in `api` policy.
//! - `http_policy_rotating`: the same over 100,000 identifiers in turn.
//! - `http_adhoc_rotating`: an ad-hoc limit (`namespace`, `limit`, `duration_ms`) over
//!   100,000 identifiers in turn.
//! - `json_decision`: `POST /json`, envoy's request as JSON, one descriptor.
//! - `grpc_should_rate_limit`: `ShouldRateLimit` over one tonic channel (HTTP/2), one
//!   descriptor.
//!
//! Each is one round trip from a client on this process's runtime to the service on its own
//! runtime (2 worker threads), in memory with the default clock, as `limiterd` runs by
//! default. The limits never deny (a million per second), so every iteration decides.
//!
//! `limiterd_shared`: what every request reads and writes that cores could share, on two
//! threads at once (an iteration is one operation on each): the state serving now
//! (`Live::current`) and the request histogram as limiterd keeps them (a handle and counts
//! per shard of threads), beside one `RwLock<Arc<_>>` and `prometheus-client`'s `Histogram`,
//! as it kept them before; and the engine's decision alone (no HTTP) for a configured policy
//! and for an ad-hoc limit (a million a day: no key is full again, swept and inserted again,
//! before its next turn), over 100,000 identifiers; envoy's statistics of a descriptor (its
//! rule's and a detailed key's); and unkey's look for an identifier's override in a namespace
//! of 1,000 (none found).

use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::{Arc, Barrier, RwLock};
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use limiter_core::MonotonicClock;
use limiter_stack::Kind;
use limiterd::app::AppState;
use limiterd::config::Config;
use limiterd::engine::{Charge, Item, Target, decided_at_once};
use limiterd::envoy::Domains;
use limiterd::metrics::Metrics;
use limiterd::ops::files::Sources;
use limiterd::ops::live::Live;
use limiterd::ops::overrides::Overrides;
use limiterd::{Listeners, serve};
use prometheus_client::metrics::histogram::Histogram;

const CONFIG: &str = r#"
listen = "127.0.0.1:0"
[store]
kind = "memory"
[policies.api]
limits = [{ algorithm = "token_bucket", count = 1000000, period = "1s" }]
[policies.daily]
limits = [{ algorithm = "token_bucket", count = 1000000, period = "1d" }]
[envoy]
listen = "127.0.0.1:0"
files = ["bench.yaml"]
"#;

const DOMAIN: &str = "domain: bench
descriptors:
  - key: user
    rate_limit: { unit: second, requests_per_unit: 1000000 }
";

/// Starts limiterd on its own runtime; its HTTP and gRPC addresses.
fn start() -> (SocketAddr, SocketAddr) {
    let config = Config::parse(CONFIG).expect("the bench configuration");
    let domains = Domains::load([("bench.yaml", DOMAIN)]).expect("the bench domain");
    let http = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let grpc = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    let addrs = (
        http.local_addr().expect("bound"),
        grpc.local_addr().expect("bound"),
    );
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async move {
            for listener in [&http, &grpc] {
                listener.set_nonblocking(true).expect("non-blocking");
            }
            let listeners = Listeners {
                http: tokio::net::TcpListener::from_std(http).expect("tokio listener"),
                grpc: Some(tokio::net::TcpListener::from_std(grpc).expect("tokio listener")),
            };
            let never = std::future::pending::<()>();
            serve(Sources::default(), config, domains, listeners, never)
                .await
                .expect("serves");
        });
    });
    addrs
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn http_connection(addr: SocketAddr) -> Sender {
    let stream = loop {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(stream) => break stream,
            Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    };
    stream.set_nodelay(true).expect("nodelay");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

async fn round_trip(sender: &mut Sender, method: &str, path: &str, body: &'static str) -> u16 {
    send(sender, method, path, Bytes::from_static(body.as_bytes())).await
}

async fn send(sender: &mut Sender, method: &str, path: &str, body: Bytes) -> u16 {
    let request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "limiterd")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .expect("a request");
    let response = sender.send_request(request).await.expect("an answer");
    let status = response.status().as_u16();
    let _ = response.into_body().collect().await.expect("a body");
    status
}

fn envoy_request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "bench".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "user".into(),
                value: "alice".into(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 1,
    }
}

fn service(c: &mut Criterion) {
    let (http, grpc) = start();
    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut sender = client.block_on(http_connection(http));
    let mut channel = client.block_on(async {
        loop {
            match RateLimitServiceClient::connect(format!("http://{grpc}")).await {
                Ok(channel) => break channel,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    });
    // Every subject answers as expected before it is timed.
    assert_eq!(
        client.block_on(round_trip(&mut sender, "GET", "/healthz", "")),
        200
    );
    let decision = r#"{"policy":"api","identifier":"alice"}"#;
    let json = r#"{"domain":"bench","descriptors":[{"entries":[{"key":"user","value":"alice"}]}]}"#;
    assert_eq!(
        client.block_on(round_trip(&mut sender, "POST", "/v1/ratelimit", decision)),
        200
    );
    assert_eq!(
        client.block_on(round_trip(&mut sender, "POST", "/json", json)),
        200
    );
    let answer = client
        .block_on(channel.should_rate_limit(envoy_request()))
        .expect("an answer")
        .into_inner();
    assert_eq!(answer.overall_code, 1, "OK");

    // 100,000 identifiers in turn, for a configured policy and for an ad-hoc limit.
    let rotating = |body: &dyn Fn(usize) -> String| -> Vec<Bytes> {
        (0..100_000).map(|i| Bytes::from(body(i))).collect()
    };
    let policy_bodies = rotating(&|i| format!(r#"{{"policy":"api","identifier":"user-{i}"}}"#));
    let adhoc_bodies = rotating(&|i| {
        format!(
            r#"{{"namespace":"bench","identifier":"user-{i}","limit":1000000,"duration_ms":1000}}"#
        )
    });
    for bodies in [&policy_bodies, &adhoc_bodies] {
        assert_eq!(
            client.block_on(send(
                &mut sender,
                "POST",
                "/v1/ratelimit",
                bodies[0].clone()
            )),
            200
        );
    }

    let mut group = c.benchmark_group("limiterd");
    group.throughput(Throughput::Elements(1));
    group.bench_function("floor", |b| {
        b.iter(|| client.block_on(round_trip(&mut sender, "GET", "/healthz", "")));
    });
    group.bench_function("http_decision", |b| {
        b.iter(|| client.block_on(round_trip(&mut sender, "POST", "/v1/ratelimit", decision)));
    });
    for (name, bodies) in [
        ("http_policy_rotating", &policy_bodies),
        ("http_adhoc_rotating", &adhoc_bodies),
    ] {
        let mut next = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                next = (next + 1) % bodies.len();
                let body = bodies[next].clone();
                client.block_on(send(&mut sender, "POST", "/v1/ratelimit", body))
            });
        });
    }
    group.bench_function("json_decision", |b| {
        b.iter(|| client.block_on(round_trip(&mut sender, "POST", "/json", json)));
    });
    group.bench_function("grpc_should_rate_limit", |b| {
        b.iter(|| {
            client
                .block_on(channel.should_rate_limit(envoy_request()))
                .expect("an answer")
        });
    });
    group.finish();
}

/// Runs `op` `iters` times on each of two threads started together; the time until both end.
fn on_two_threads(iters: u64, op: &(dyn Fn(u64) + Sync)) -> Duration {
    let start = Barrier::new(3);
    std::thread::scope(|scope| {
        for _ in 0..2 {
            scope.spawn(|| {
                start.wait();
                for i in 0..iters {
                    op(i);
                }
            });
        }
        start.wait();
        let began = Instant::now();
        // The scope joins both threads before it returns.
        began
    })
    .elapsed()
}

/// A request's duration: 30 µs and some, as a decision over loopback takes.
fn took(i: u64) -> Duration {
    Duration::from_nanos(30_000 + (i & 1023))
}

fn shared(c: &mut Criterion) {
    let config = Config::parse(CONFIG).expect("the bench configuration");
    let state = || {
        let domains = Domains::load([("bench.yaml", DOMAIN)]).expect("the bench domain");
        AppState::build(&config, domains, MonotonicClock::new(), None).expect("builds")
    };
    let live = Live::new(state());
    let metrics = Metrics::new();
    let locked = RwLock::new(Arc::new(state()));
    let histogram = Histogram::new([
        0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.1,
        1.0,
    ]);
    let mut group = c.benchmark_group("limiterd_shared");
    group.bench_function("state_and_histogram_2_threads", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, &|i| {
                let state = live.current();
                black_box(&state.config);
                metrics.observe(took(i));
            })
        })
    });
    group.bench_function("rwlock_arc_and_prometheus_histogram_2_threads", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, &|i| {
                let state = Arc::clone(&locked.read().expect("unpoisoned"));
                black_box(&state.config);
                histogram.observe(took(i).as_secs_f64());
            })
        })
    });
    decisions_on_two_threads(&mut group, &live);
    // unkey's ratelimit reads a namespace's overrides at every request: 1,000 set in it, none
    // for the identifiers asked (each request finds no override); in another namespace, 100
    // patterns (`team-{i}-*`), none matching the teams asked, so each request tries every one.
    let overrides = Overrides::in_memory();
    for i in 0..1_000 {
        let customer = format!("customer-{i}");
        decided_at_once(overrides.set("api", &customer, (10, 1_000), 1_000)).expect("set");
    }
    for i in 0..100 {
        let team = format!("team-{i}-*");
        decided_at_once(overrides.set("teams", &team, (10, 1_000), 1_000)).expect("set");
    }
    // envoy's statistics for one descriptor: its configured rule's and, per value
    // (`detailed_metric`), a key the request brings.
    let rule = metrics.envoy_rule("bench.user");
    group.bench_function("envoy_stats_2_threads", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, &|i| {
                rule.add("total_hits", 1);
                let key = if i & 1 == 0 {
                    "bench.user_a"
                } else {
                    "bench.user_b"
                };
                metrics.envoy_stat(key, "total_hits", 1);
            })
        })
    });
    group.bench_function("overrides_find_2_threads", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, &|i| {
                let asked = if i & 1 == 0 { "user-1" } else { "user-2" };
                assert!(overrides.find("api", black_box(asked)).is_none());
            })
        })
    });
    group.bench_function("overrides_find_100_patterns_2_threads", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, &|i| {
                let asked = if i & 1 == 0 { "team-x-1" } else { "team-y-2" };
                assert!(overrides.find("teams", black_box(asked)).is_none());
            })
        })
    });
    group.finish();
}

/// The engine's decision alone (no HTTP), for a configured policy and for an ad-hoc limit,
/// over 100,000 identifiers, on two threads at once: what each finds and touches per request.
fn decisions_on_two_threads(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    live: &Live<MonotonicClock>,
) {
    let state = live.current();
    // A million a day: over 100,000 identifiers no key is full again before its next turn, so
    // none is swept and inserted again; what is timed is the decision on a key held.
    let daily = state.engine.policy_id("daily").expect("configured");
    let items = |target: Target| -> Vec<Item> {
        (0..100_000)
            .map(|i| Item {
                target: target.clone(),
                identifier: format!("user-{i}").into(),
                cost: 1,
                shadow: false,
                charge: Charge::Take,
            })
            .collect()
    };
    let ad_hoc = Target::AdHoc {
        kind: Kind::TokenBucket,
        limit: 1_000_000,
        duration_ms: 86_400_000,
        namespace: "bench".into(),
    };
    for (name, items) in [
        ("decide_policy_2_threads", items(Target::Policy(daily))),
        ("decide_adhoc_2_threads", items(ad_hoc)),
    ] {
        let decide = |i: u64| {
            let item = &items[i as usize % items.len()];
            let answered = decided_at_once(state.engine.decide_one(item, None));
            assert!(answered.expect("decided").0.decision.is_allowed());
        };
        decide(0);
        group.bench_function(name, |b| {
            b.iter_custom(|iters| on_two_threads(iters, &decide))
        });
    }
}

criterion_group!(benches, service, shared);
criterion_main!(benches);
