//! A load generator for a running limiterd: N keep-alive HTTP/1.1 connections, each sending
//! decision requests back to back for a fixed time, then decisions per second (allowed and
//! denied alike) and latency percentiles.
//!
//! ```sh
//! cargo run --release -p limiterd &                       # the service, built-in policies
//! cargo run --release -p limiterd --example load -- --connections 64 --seconds 10
//! ```
//!
//! Flags: `--url http://127.0.0.1:8080` (loopback only), `--connections N` (default 32),
//! `--seconds S` (default 5, at most 300), `--policy NAME` (default `api`),
//! `--identifiers K` (default 10000: requests spread over K identifiers).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

const USAGE: &str = "\
Usage: cargo run --release -p limiterd --example load -- [FLAGS]

Sends decision requests to a running limiterd for a fixed time, then prints decisions per
second and latency percentiles.

Flags (each takes a value):
  --url URL            where limiterd listens, loopback only (default http://127.0.0.1:8080)
  --connections N      keep-alive connections, 1 to 1024 (default 32)
  --seconds S          how long to send, 1 to 300 (default 5)
  --policy NAME        the policy to ask (default api)
  --identifiers K      spread requests over K identifiers (default 10000)
  --help               print this";

/// What `options` found: the options to run with, or a request for the usage.
enum Parsed {
    Run(Options),
    Help,
}

struct Options {
    addr: SocketAddr,
    connections: usize,
    seconds: u64,
    policy: String,
    identifiers: u64,
}

fn options() -> Result<Parsed, String> {
    let mut o = Options {
        addr: SocketAddr::from(([127, 0, 0, 1], 8080)),
        connections: 32,
        seconds: 5,
        policy: "api".into(),
        identifiers: 10_000,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        return Ok(Parsed::Help);
    }
    let mut pairs = args.chunks(2);
    for pair in &mut pairs {
        let [flag, value] = pair else {
            return Err(format!(
                "{} needs a value (every flag takes one; see --help)",
                pair.first().map_or("a flag", String::as_str)
            ));
        };
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag} takes a whole number, not {value:?}"))
        };
        match flag.as_str() {
            "--url" => {
                let rest = value
                    .strip_prefix("http://")
                    .ok_or("--url must start with http://")?;
                o.addr = rest.trim_end_matches('/').parse().map_err(|_| {
                    format!("--url {value:?}: give an IP address and port, such as http://127.0.0.1:8080")
                })?;
                if !o.addr.ip().is_loopback() {
                    return Err("--url must be a loopback address".into());
                }
            }
            "--connections" => {
                o.connections = usize::try_from(number()?.clamp(1, 1024)).unwrap_or(1)
            }
            "--seconds" => o.seconds = number()?.clamp(1, 300),
            "--policy" => o.policy = value.clone(),
            "--identifiers" => o.identifiers = number()?.max(1),
            other => {
                return Err(format!("unknown flag {other}\n\n{USAGE}"));
            }
        }
    }
    Ok(Parsed::Run(o))
}

/// Per connection: latencies in microseconds, allowed, denied, errors.
async fn connection(
    o: &Options,
    first_id: u64,
    until: Instant,
) -> Result<(Vec<u32>, u64, u64, u64), String> {
    let stream = tokio::net::TcpStream::connect(o.addr)
        .await
        .map_err(|e| format!("cannot connect to {}: {e} (is limiterd running?)", o.addr))?;
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
    let o = match options()? {
        Parsed::Run(o) => std::sync::Arc::new(o),
        Parsed::Help => {
            println!("{USAGE}");
            return Ok(());
        }
    };
    println!(
        "{} connections for {} s against http://{} (policy {}, {} identifiers)",
        o.connections, o.seconds, o.addr, o.policy, o.identifiers
    );
    let started = Instant::now();
    let until = started + Duration::from_secs(o.seconds);
    let tasks: Vec<_> = (0..o.connections)
        .map(|i| {
            let o = std::sync::Arc::clone(&o);
            tokio::spawn(async move { connection(&o, i as u64, until).await })
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
