//! limiterd: a rate-limit service any language can call over HTTP, deciding named policies
//! (stacks of token buckets, sliding and fixed windows, per identifier or global) and ad-hoc
//! limits, in memory by default or on Redis for a fleet.
//!
//! - [`config`]: the TOML file, checked with line numbers ([`config::BUILT_IN`] when none).
//! - [`engine`]: the stacks, batches all or nothing.
//! - [`api`]: the HTTP JSON API and its request parser.
//! - [`metrics`]: the Prometheus counters.
//!
//! [`serve`] runs the API on a listener until a shutdown signal, letting requests in flight
//! finish.

pub mod api;
pub mod config;
pub mod engine;
#[doc(hidden)]
pub mod fuzzing;
pub mod metrics;

use std::future::Future;
use std::sync::Arc;

use limiter_core::MonotonicClock;
use limiter_redis::RedisBackend;
use tokio::net::TcpListener;

use crate::api::AppState;
use crate::config::{Config, Store};
use crate::engine::Engine;
use crate::metrics::Metrics;

/// Builds the engine for `config` (connecting to Redis if it says so) and serves the API on
/// `listener` until `shutdown` completes; requests in flight then finish.
pub async fn serve(
    config: &Config,
    listener: TcpListener,
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
    let metrics = Arc::new(Metrics::new(config.policies.keys().cloned()));
    let engine = Engine::new(config, MonotonicClock::new(), backend, Arc::clone(&metrics))?;
    let app = api::router(Arc::new(AppState { engine, metrics }));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|e| format!("the server stopped: {e}"))
}
