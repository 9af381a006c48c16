//! Envoy's rate-limit service protocol, so Envoy, Envoy Gateway, Istio and Emissary can call
//! limiterd as they call envoy's reference server, with every limiterd algorithm and with all
//! or nothing across a request's descriptors.
//!
//! - [`yaml`]: YAML as a tree of nodes that remember their lines.
//! - [`rules`]: the descriptor files (the reference server's shape), checked with lines.
//! - [`service`]: matching and deciding, protocol-free.
//! - [`json`]: `POST /json`, the same requests over HTTP for debugging.
//!
//! The transports are adapters above this module: `crate::grpc` (`ShouldRateLimit` over
//! tonic) and `crate::api` (`POST /json`).

pub mod json;
pub mod rules;
pub mod service;
pub mod yaml;

pub use rules::{Domain, Domains, RulesError};
pub use service::Envoy;
