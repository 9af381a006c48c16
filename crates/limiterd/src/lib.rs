//! limiterd: a rate-limit service any language can call over HTTP, deciding named policies
//! (stacks of token buckets, sliding and fixed windows, per identifier or global) and ad-hoc
//! limits, in memory by default or on Redis for a fleet; and a drop-in for envoy's reference
//! rate-limit service over gRPC.
//!
//! - [`store`]: the store room: the one door to the store crate (every limiter-redis type
//!   limiterd uses), policies' permits and calendar quotas on either store, how limits are
//!   keyed.
//! - [`metrics`]: the Prometheus counters.
//! - [`config`]: the TOML file, checked with line numbers ([`config::BUILT_IN`] when none).
//! - [`stacks`]: each policy's stack built for the store.
//! - [`engine`]: the policies behind the seam, requests decided all or nothing.
//! - [`envoy`]: envoy's protocol (the `limiter-envoy` crate) mounted: the engine as its decider.
//! - [`app`]: the composition root: metrics, then the engine, then envoy's domains attached
//!   to it, as the state the adapters share.
//! - [`ops`]: configuration files, the live state and its reloads, the debug views.
//! - Adapters (feature `server`): `http` (the HTTP JSON API, its request parser, and
//!   `POST /json`), `grpc` (envoy's protocol over tonic), served by `serve`.
//!
//! Dependencies point one way: shards, store ← metrics ← config ← stacks ← engine ← envoy ← app
//! ← ops ← http, grpc ← server; no module imports one that imports it (`cargo xtask lint`).
//!
//! `serve` (feature `server`) runs the HTTP API, and the gRPC service with gRPC health if
//! envoy domains are configured, reloading on SIGHUP and file changes, until a shutdown
//! signal; requests in flight then finish, within a deadline.

#[cfg(feature = "server")]
mod accept;
pub mod app;
pub mod config;
pub mod engine;
pub mod envoy;
#[doc(hidden)]
pub mod fuzzing;
#[cfg(feature = "server")]
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod ops;
mod shards;
pub mod stacks;
pub mod store;

#[cfg(feature = "server")]
mod server;
#[cfg(feature = "server")]
pub use server::{Listeners, ServiceClock, serve};
pub use shards::Current;
