//! A load generator for a running limiterd: N keep-alive connections, each sending decision
//! requests back to back for a fixed time, then decisions per second (allowed and denied
//! alike) and latency percentiles. It speaks the HTTP API (HTTP/1.1), or envoy's gRPC
//! `ShouldRateLimit` (HTTP/2) with `--grpc`.
//!
//! ```sh
//! cargo run --release -p limiterd &                       # the service, built-in policies
//! cargo run --release -p limiterd --example load -- --connections 64 --seconds 10
//! cargo run --release -p limiterd -- --envoy crates/limiterd/tests/envoy/messaging.yaml &
//! cargo run --release -p limiterd --example load -- --grpc http://127.0.0.1:8081 \
//!     --domain messaging --key to_number
//! ```
//!
//! `--help` lists the options: `--url http://127.0.0.1:8080` (loopback only), `--connections
//! N` (default 32), `--seconds S` (default 5, at most 300), `--policy NAME` (default `api`),
//! `--identifiers K` (default 10000: requests spread over K identifiers); with `--grpc URL`,
//! `--domain` and `--key` name the descriptor (its value is the identifier).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// Sends decision requests to a running limiterd for a fixed time, then prints decisions per
/// second and latency percentiles.
#[derive(Debug, clap::Parser)]
#[command(
    name = "load",
    override_usage = "cargo run --release -p limiterd --example load -- [OPTIONS]"
)]
struct Options {
    /// Where limiterd listens (loopback only).
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:8080", value_parser = loopback_url)]
    url: SocketAddr,
    /// Keep-alive connections.
    #[arg(long, value_name = "N", default_value_t = 32, value_parser = clap::value_parser!(u16).range(1..=1024))]
    connections: u16,
    /// How long to send, in seconds.
    #[arg(long, value_name = "S", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
    seconds: u64,
    /// The policy to ask.
    #[arg(long, value_name = "NAME", default_value = "api")]
    policy: String,
    /// Spread requests over this many identifiers.
    #[arg(long, value_name = "K", default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    identifiers: u64,
    /// Ask envoy's gRPC `ShouldRateLimit` at this address instead of the HTTP API.
    #[arg(long, value_name = "URL", value_parser = loopback_url)]
    grpc: Option<SocketAddr>,
    /// With `--grpc`: the descriptors' domain.
    #[arg(long, value_name = "DOMAIN", default_value = "messaging")]
    domain: String,
    /// With `--grpc`: the descriptor's key (its value is the identifier).
    #[arg(long, value_name = "KEY", default_value = "to_number")]
    key: String,
}

/// `http://IP:PORT` on a loopback address.
fn loopback_url(value: &str) -> Result<SocketAddr, String> {
    let rest = value
        .strip_prefix("http://")
        .ok_or("it must start with http://")?;
    let addr: SocketAddr = rest
        .trim_end_matches('/')
        .parse()
        .map_err(|_| "give an IP address and port, such as http://127.0.0.1:8080".to_owned())?;
    if !addr.ip().is_loopback() {
        return Err("it must be a loopback address".into());
    }
    Ok(addr)
}

/// Per gRPC channel: latencies in microseconds, allowed, denied, errors.
async fn grpc_connection(
    o: &Options,
    addr: SocketAddr,
    first_id: u64,
    until: Instant,
) -> Result<(Vec<u32>, u64, u64, u64), String> {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let mut client = RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| {
            format!("cannot connect to {addr}: {e} (is limiterd serving envoy's protocol?)")
        })?;
    let (mut latencies, mut allowed, mut denied, mut errors) = (Vec::new(), 0, 0, 0);
    let mut id = first_id;
    while Instant::now() < until {
        id = (id + 7919) % o.identifiers;
        let request = RateLimitRequest {
            domain: o.domain.clone(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: o.key.clone(),
                    value: format!("user-{id}"),
                }],
                ..RateLimitDescriptor::default()
            }],
            hits_addend: 1,
        };
        let started = Instant::now();
        let answer = client.should_rate_limit(request).await;
        latencies.push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
        match answer {
            Ok(answer) if answer.get_ref().overall_code == 1 => allowed += 1,
            Ok(_) => denied += 1,
            Err(_) => errors += 1,
        }
    }
    Ok((latencies, allowed, denied, errors))
}

/// Per connection: latencies in microseconds, allowed, denied, errors.
async fn connection(
    o: &Options,
    first_id: u64,
    until: Instant,
) -> Result<(Vec<u32>, u64, u64, u64), String> {
    let stream = tokio::net::TcpStream::connect(o.url)
        .await
        .map_err(|e| format!("cannot connect to {}: {e} (is limiterd running?)", o.url))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let (mut latencies, mut allowed, mut denied, mut errors) = (Vec::new(), 0, 0, 0);
    let mut id = first_id;
    while Instant::now() < until {
        id = (id + 7919) % o.identifiers;
        let body = format!(r#"{{"policy":"{}","identifier":"user-{id}"}}"#, o.policy);
        let request = hyper::Request::post("/v1/ratelimit")
            .header("host", "limiterd")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| e.to_string())?;
        let started = Instant::now();
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let ok = response.status().is_success();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        latencies.push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
        if !ok {
            errors += 1;
        } else if body.windows(14).any(|w| w == b"\"success\":true") {
            allowed += 1;
        } else {
            denied += 1;
        }
    }
    Ok((latencies, allowed, denied, errors))
}

fn percentile(sorted: &[u32], p: usize) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), String> {
    let o = std::sync::Arc::new(<Options as clap::Parser>::parse());
    match o.grpc {
        Some(addr) => println!(
            "{} gRPC channels for {} s against http://{addr} (domain {}, key {}, {} identifiers)",
            o.connections, o.seconds, o.domain, o.key, o.identifiers
        ),
        None => println!(
            "{} connections for {} s against http://{} (policy {}, {} identifiers)",
            o.connections, o.seconds, o.url, o.policy, o.identifiers
        ),
    }
    let started = Instant::now();
    let until = started + Duration::from_secs(o.seconds);
    let tasks: Vec<_> = (0..o.connections)
        .map(|i| {
            let o = std::sync::Arc::clone(&o);
            tokio::spawn(async move {
                match o.grpc {
                    Some(addr) => grpc_connection(&o, addr, u64::from(i), until).await,
                    None => connection(&o, u64::from(i), until).await,
                }
            })
        })
        .collect();
    let (mut all, mut allowed, mut denied, mut errors) = (Vec::new(), 0, 0, 0);
    for task in tasks {
        let (l, a, d, e) = task.await.map_err(|e| e.to_string())??;
        all.extend(l);
        allowed += a;
        denied += d;
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort_unstable();
    println!(
        "{} decisions in {elapsed:.1} s: {:.0} per second ({allowed} allowed, {denied} denied, {errors} errors)",
        all.len(),
        all.len() as f64 / elapsed
    );
    println!(
        "latency: p50 {} us, p90 {} us, p99 {} us, p99.9 {} us, max {} us",
        percentile(&all, 50),
        percentile(&all, 90),
        percentile(&all, 99),
        all.get((all.len() * 999 / 1000).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0),
        all.last().copied().unwrap_or(0)
    );
    Ok(())
}
