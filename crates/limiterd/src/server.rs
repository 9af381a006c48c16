//! Serving (feature `server`): the HTTP API on its own accept loop (hyper's HTTP/1.1 with a
//! header read timeout; the handlers time the body), envoy's gRPC protocol and
//! `grpc.health.v1.Health` over tonic, the readiness probe of the store, reloads (SIGHUP and
//! a check of the files every `reload_check_ms`), and a shutdown with a deadline.
//!
//! On a shutdown signal the service reports not ready (HTTP and gRPC health), stops
//! accepting, lets requests in flight finish and closes idle connections; whatever is still
//! open after `shutdown_timeout_ms` (a client that stalls mid-request, a stream that never
//! ends) is cut, so a stalled client never keeps the process alive.

use std::collections::hash_map::DefaultHasher;
use std::future::Future;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::store::RedisBackend;
use crate::store::overrides::records_on;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use limiter_core::MonotonicClock;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::accept::Acceptor;
use crate::app::AppState;
use crate::config::{Config, ServerSettings, Store};
use crate::envoy::Domains;
use crate::grpc::Serving;
use crate::http;
use crate::ops::files::Sources;
use crate::ops::live::{Live, Reloaded};
use crate::ops::overrides::{Overrides, REFRESH_EVERY};
use limiter_envoy::grpc::Grpc;

/// The service's clock: the OS's monotonic clock, not the library's default (the time-stamp
/// counter). A daemon reports Unix times (`reset_at_ms`), reads its callers' (`time`), ends
/// calendar windows at local midnight and counts fixed windows where Redis does, for days on
/// end: the counter runs at quanta's calibration of its rate, which measured 16 ppm off the
/// OS clock on the development VM (1.4 s a day, 10 s a week: a client's exact `time` would be
/// refused as ahead after days). The monotonic clock runs at the system clock's rate (NTP
/// slews both alike); a reading costs about 16 ns more, against the 15 µs a request takes.
pub type ServiceClock = MonotonicClock;

/// How often the store's readiness is probed.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Where to serve: the HTTP API, and envoy's gRPC protocol if wanted.
#[derive(Debug)]
pub struct Listeners {
    /// The HTTP API.
    pub http: TcpListener,
    /// `ShouldRateLimit` and `grpc.health.v1.Health`.
    pub grpc: Option<TcpListener>,
}

/// Builds the service for `config` and the envoy `domains` (read from `sources`, which reloads
/// read again), connecting to Redis if the store says so, and serves until `shutdown`
/// completes (see the module docs).
pub async fn serve(
    sources: Sources,
    config: Config,
    domains: Domains,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let backend = connect_store(&config).await?;
    let settings = config.server;
    let state = AppState::build(&config, domains, ServiceClock::new(), backend.clone())
        .map_err(|e| e.to_string())?;
    let overrides = open_overrides(backend.as_ref(), &sources).await?;
    warn_if_open(&config, &state);
    let live = Arc::new(Live::with_overrides(state, overrides));
    if backend.is_some() {
        live.health.await_first_probe();
        tokio::spawn(refresh_overrides(Arc::clone(&live)));
    }
    let (stop, stopped) = watch::channel(false);

    let (reporter, health_service) = tonic_health::server::health_reporter();
    // The first probe before the first request is served: readiness is what Redis answered
    // (a wrong password or certificate is logged now), never a guess.
    let first = probe_round(&live, backend.as_ref(), &reporter, None).await;
    tokio::spawn(probe(
        Arc::clone(&live),
        backend,
        reporter.clone(),
        stopped.clone(),
        first,
    ));
    tokio::spawn(reloads(Arc::clone(&live), sources, config, stopped.clone()));

    let grpc = listeners.grpc.map(|listener| {
        let service = Grpc::service(Serving(Arc::clone(&live)));
        let incoming = Acceptor::new(listener, "grpc").into_stream();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(health_service)
                .add_service(service)
                .serve_with_incoming_shutdown(incoming, signalled(stopped.clone())),
        )
    });
    let draining = Arc::clone(&live);
    tokio::spawn(async move {
        shutdown.await;
        tracing::info!("shutting down: not ready, finishing requests in flight");
        draining.health.drain();
        reporter
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let _ = stop.send(true);
    });

    let releasing = Arc::clone(&live);
    let http = serve_http(
        listeners.http,
        http::router(live),
        settings,
        stopped.clone(),
    )
    .await;
    if let Some(grpc) = grpc {
        match tokio::time::timeout(settings.shutdown_timeout, grpc).await {
            Err(_) => tracing::warn!("gRPC streams still open at the shutdown deadline were cut"),
            Ok(Err(e)) => return Err(format!("the gRPC server failed: {e}")),
            Ok(Ok(Err(e))) => return Err(format!("the gRPC server stopped: {e}")),
            Ok(Ok(Ok(()))) => {}
        }
    }
    // Requests are done: refund what leased policies hold, so the fleet can use it.
    let refunded = releasing.current().engine.refund_leases().await;
    if refunded > 0 {
        tracing::info!(units = refunded, "refunded the leases this process held");
    }
    http
}

/// The Redis backend the store names, connected; `None` in memory.
async fn connect_store(config: &Config) -> Result<Option<RedisBackend>, String> {
    let Store::Redis { connection, .. } = &config.store else {
        return Ok(None);
    };
    let backend = connection
        .builder()?
        .connect()
        .await
        .map_err(|e| format!("cannot use Redis at {}: {e}", connection.at))?;
    Ok(Some(backend))
}

/// unkey's overrides: on Redis beside the limits, else in their file, else (with a warning)
/// in memory only.
async fn open_overrides(
    backend: Option<&RedisBackend>,
    sources: &Sources,
) -> Result<Overrides, String> {
    Ok(match (backend, sources.overrides_file()) {
        (Some(backend), _) => Overrides::on_redis(records_on(backend)?).await,
        (None, Some(path)) => Overrides::load(&path)?,
        (None, None) => {
            tracing::warn!(
                "unkey's overrides are kept in memory only and lost at exit: give --overrides FILE or --config FILE to keep them"
            );
            Overrides::in_memory()
        }
    })
}

/// Warns when the service listens beyond loopback with its native API open.
fn warn_if_open(config: &Config, state: &AppState<ServiceClock>) {
    if config.listen.ip().is_loopback() {
        return;
    }
    if state.keys.is_empty() {
        tracing::warn!(
            listen = %config.listen,
            "listening beyond loopback without keys: /v1, /json, /debug, /metrics and the status page are open to anyone who can reach this address; add `[auth] keys` (unkey's v2 API stays closed without a key)"
        );
    } else if !config.protects_native(true) {
        tracing::warn!(
            listen = %config.listen,
            "listening beyond loopback with `[auth] protect_native = false`: the native API is open to anyone who can reach this address"
        );
    }
}

/// Reads the overrides from Redis every interval, so a change another instance made applies
/// here within one (each poll's failure logged and kept as [`Overrides::poll`] says).
///
/// [`Overrides::poll`]: crate::ops::overrides::Overrides::poll
async fn refresh_overrides(live: Arc<Live<ServiceClock>>) {
    loop {
        tokio::time::sleep(REFRESH_EVERY).await;
        live.overrides.poll().await;
    }
}

/// Completes once `stopped` turns true.
async fn signalled(mut stopped: watch::Receiver<bool>) {
    let _ = stopped.wait_for(|stop| *stop).await;
}

/// The HTTP accept loop: each connection on its own task, with the header read timeout; on
/// shutdown, idle connections close, busy ones finish their request, and what is left at the
/// deadline is cut.
async fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    settings: ServerSettings,
    stopped: watch::Receiver<bool>,
) -> Result<(), String> {
    let mut connections = JoinSet::new();
    let stop = stopped.clone();
    let acceptor = Acceptor::new(listener, "http");
    loop {
        let stream = tokio::select! {
            stream = acceptor.next() => stream,
            () = signalled(stop.clone()) => break,
        };
        while connections.try_join_next().is_some() {}
        let service = TowerToHyperService::new(router.clone());
        let conn_stop = stopped.clone();
        connections.spawn(async move {
            let mut builder = hyper::server::conn::http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(settings.header_timeout);
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            let mut conn = std::pin::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = signalled(conn_stop) => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    drop(acceptor);
    let finished = tokio::time::timeout(settings.shutdown_timeout, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if finished.is_err() {
        tracing::warn!(
            connections = connections.len(),
            "connections still open at the shutdown deadline were cut"
        );
        connections.shutdown().await;
    }
    Ok(())
}

/// Probes the store every [`PROBE_EVERY`] (every master, on a cluster) and reports it: HTTP
/// readiness and gRPC health, and a log line when what it finds changes (an error at the first
/// probe: a wrong password or certificate is named at start).
async fn probe(
    live: Arc<Live<ServiceClock>>,
    backend: Option<RedisBackend>,
    reporter: tonic_health::server::HealthReporter,
    stopped: watch::Receiver<bool>,
    first: Found,
) {
    let mut last = first;
    loop {
        tokio::select! {
            () = tokio::time::sleep(PROBE_EVERY) => {}
            () = signalled(stopped.clone()) => return,
        }
        last = probe_round(&live, backend.as_ref(), &reporter, Some(last)).await;
    }
}

/// What a probe found: whether the store can decide, and what is wrong if anything.
type Found = (bool, Option<String>);

/// One probe: readiness, gRPC health and a log line when they change from `last`.
async fn probe_round(
    live: &Live<ServiceClock>,
    backend: Option<&RedisBackend>,
    reporter: &tonic_health::server::HealthReporter,
    last: Option<Found>,
) -> Found {
    let (reachable, problem) = match backend {
        None => (true, None),
        Some(backend) => {
            let health = backend.health().await;
            let found = (health.is_ready(), health.problem());
            live.health.record(
                found.0,
                found.1.clone(),
                Some(crate::ops::live::StoreStatus::of(&health)),
            );
            found
        }
    };
    if last.as_ref().map(|l| l.0) != Some(reachable) && !live.health.is_draining() {
        let status = if reachable {
            tonic_health::ServingStatus::Serving
        } else {
            tonic_health::ServingStatus::NotServing
        };
        reporter.set_service_status("", status).await;
        reporter
            .set_service_status("envoy.service.ratelimit.v3.RateLimitService", status)
            .await;
    }
    if backend.is_some() && last.as_ref() != Some(&(reachable, problem.clone())) {
        log_probe(last.as_ref(), reachable, problem.as_deref());
    }
    (reachable, problem)
}

/// One log line for what a probe found, when it differs from the last.
fn log_probe(last: Option<&(bool, Option<String>)>, reachable: bool, problem: Option<&str>) {
    match (last, reachable, problem) {
        (None, true, None) => tracing::info!("the store answered: ready"),
        (Some(_), true, None) => tracing::info!("the store is reachable again: ready"),
        (None, false, Some(e)) => {
            tracing::error!(error = %e, "the store cannot be used: not ready");
        }
        (_, false, e) => tracing::warn!(
            error = e.unwrap_or("unknown"),
            "the store is unreachable: not ready"
        ),
        (_, true, Some(e)) => tracing::warn!(
            error = %e,
            "the store is reachable but part of it fails: its keys follow the failure policy"
        ),
    }
}

/// What the files hold now, to notice a change: each one's contents hashed (or its read
/// error).
fn fingerprint(files: &[PathBuf]) -> u64 {
    let mut hasher = DefaultHasher::new();
    for file in files {
        file.hash(&mut hasher);
        match std::fs::read(file) {
            Ok(bytes) => bytes.hash(&mut hasher),
            Err(e) => e.kind().hash(&mut hasher),
        }
    }
    hasher.finish()
}

/// Reloads on SIGHUP and when a file changes (checked every `reload_check_ms`), logging each
/// result and counting it in the metrics.
async fn reloads(
    live: Arc<Live<ServiceClock>>,
    sources: Sources,
    config: Config,
    stopped: watch::Receiver<bool>,
) {
    let check = config.server.reload_check;
    let mut files = sources.files(&config);
    let mut seen = fingerprint(&files);
    #[cfg(unix)]
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    loop {
        let hup = async {
            #[cfg(unix)]
            if let Some(signal) = hangup.as_mut() {
                signal.recv().await;
                return;
            }
            std::future::pending::<()>().await;
        };
        let tick = async {
            if check.is_zero() {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(check).await;
        };
        // The fingerprint is taken before the files are read, so a write that lands while they
        // are read differs from it and is reloaded at the next check, never missed.
        let why = tokio::select! {
            () = hup => {
                seen = fingerprint(&files);
                "SIGHUP"
            }
            () = tick => {
                let now = fingerprint(&files);
                if now == seen {
                    continue;
                }
                seen = now;
                "a file changed"
            }
            () = signalled(stopped.clone()) => return,
        };
        let loaded = sources.load();
        let metrics = Arc::clone(&live.current().metrics);
        match loaded.and_then(|(config, domains)| {
            let reloaded = live.reload(&config, domains)?;
            Ok((config, reloaded))
        }) {
            Ok((_, Reloaded::Unchanged)) => {
                metrics.reload("unchanged");
                tracing::info!(trigger = why, "reload: the configuration is unchanged");
            }
            Ok((config, Reloaded::Applied(carried))) => {
                metrics.reload("applied");
                let watched = sources.files(&config);
                if watched != files {
                    // Another set of files from now on (an edited `[envoy] files`).
                    seen = fingerprint(&watched);
                    files = watched;
                }
                tracing::info!(
                    trigger = why,
                    kept = ?carried.kept,
                    rescaled = ?carried.rescaled,
                    fresh = ?carried.fresh,
                    "reloaded: policies with unchanged limits kept their counters, changed ones were rescaled"
                );
            }
            Err(message) => {
                metrics.reload("refused");
                tracing::error!(trigger = why, "reload refused: {message}");
            }
        }
    }
}
