//! limiterd: a rate-limit service any language can call over HTTP, deciding named policies
//! (stacks of token buckets, sliding and fixed windows, per identifier or global) and ad-hoc
//! limits, in memory by default or on Redis for a fleet; and a drop-in for envoy's reference
//! rate-limit service over gRPC.
//!
//! - [`config`]: the TOML file, checked with line numbers ([`config::BUILT_IN`] when none).
//! - [`engine`]: the stacks, batches all or nothing.
//! - [`request`]: the HTTP API's request parser.
//! - [`envoy`]: envoy's descriptor files and `ShouldRateLimit`, protocol-free.
//! - [`metrics`]: the Prometheus counters.
//! - [`app`]: the composition root: metrics, then the engine, then envoy's domains attached
//!   to it, as the state the adapters share.
//! - Adapters (feature `server`): `api` (the HTTP JSON API and `POST /json`), `grpc` (envoy's
//!   protocol over tonic), served by `serve`.
//!
//! Dependencies point one way: metrics ← config ← engine ← envoy ← app ← adapters; no module
//! imports one that imports it.
//!
//! `serve` (feature `server`) runs the HTTP API, and the gRPC service if envoy domains are
//! configured, until a shutdown signal, letting requests in flight finish.

#[cfg(feature = "server")]
pub mod api;
pub mod app;
pub mod config;
pub mod engine;
pub mod envoy;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "server")]
pub mod grpc;
pub mod metrics;
pub mod request;

#[cfg(feature = "server")]
pub use server::{Listeners, serve};

#[cfg(feature = "server")]
mod server {
    use std::future::Future;
    use std::sync::Arc;

    use limiter_core::DefaultClock;
    use limiter_redis::RedisBackend;
    use tokio::net::TcpListener;

    use crate::api;
    use crate::app::AppState;
    use crate::config::{Config, Store};
    use crate::envoy::Domains;
    use crate::grpc::Grpc;

    /// Where to serve: the HTTP API, and envoy's gRPC protocol if wanted.
    #[derive(Debug)]
    pub struct Listeners {
        /// The HTTP API.
        pub http: TcpListener,
        /// `ShouldRateLimit`.
        pub grpc: Option<TcpListener>,
    }

    /// Builds the engine for `config` and the envoy `domains` (connecting to Redis if the
    /// store says so) and serves until `shutdown` completes; requests in flight then finish.
    pub async fn serve(
        config: &Config,
        domains: Domains,
        listeners: Listeners,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), String> {
        let backend = match &config.store {
            Store::Memory { .. } => None,
            Store::Redis { url, timeout, .. } => Some(
                RedisBackend::builder(url.clone())
                    .timeout(*timeout)
                    .connect()
                    .await
                    .map_err(|e| format!("cannot use Redis at {url}: {e}"))?,
            ),
        };
        let state = Arc::new(
            AppState::build(config, domains, DefaultClock::new(), backend)
                .map_err(|e| e.to_string())?,
        );
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let signal = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let grpc = listeners.grpc.map(|listener| {
            let service = Grpc::service(Arc::clone(&state));
            let incoming = tonic::transport::server::TcpIncoming::from(listener);
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, signal(stopped.clone())),
            )
        });
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop.send(true);
        });
        let http = axum::serve(listeners.http, api::router(state))
            .with_graceful_shutdown(signal(stopped))
            .await
            .map_err(|e| format!("the HTTP server stopped: {e}"));
        if let Some(grpc) = grpc {
            grpc.await
                .map_err(|e| format!("the gRPC server failed: {e}"))?
                .map_err(|e| format!("the gRPC server stopped: {e}"))?;
        }
        http
    }
}
