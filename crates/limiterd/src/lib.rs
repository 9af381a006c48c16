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
//! - [`live`]: the state serving now, swapped whole by a reload; readiness.
//! - [`files`]: where a configuration is read from (files and command-line overrides), at
//!   start and on reload.
//! - [`debug`]: the configuration and status views, and the status page.
//! - Adapters (feature `server`): `api` (the HTTP JSON API and `POST /json`), `grpc` (envoy's
//!   protocol over tonic), served by `serve`.
//!
//! Dependencies point one way: metrics ← config ← engine ← envoy ← app ← live ← debug ←
//! adapters ← server; no module imports one that imports it.
//!
//! `serve` (feature `server`) runs the HTTP API, and the gRPC service with gRPC health if
//! envoy domains are configured, reloading on SIGHUP and file changes, until a shutdown
//! signal; requests in flight then finish, within a deadline.

#[cfg(feature = "server")]
pub mod api;
pub mod app;
pub mod config;
pub mod debug;
pub mod engine;
pub mod envoy;
pub mod files;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "server")]
pub mod grpc;
pub mod live;
pub mod metrics;
pub mod request;
pub mod stacks;

#[cfg(feature = "server")]
mod server;
#[cfg(feature = "server")]
pub use server::{Listeners, serve};
