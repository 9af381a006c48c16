//! Envoy's rate-limit service protocol, so Envoy, Envoy Gateway, Istio and Emissary can call a
//! service built on this workspace as they call envoy's reference server, with every
//! algorithm of the workspace and with all or nothing across a request's descriptors.
//!
//! The crate knows no service: what counts the limits is a [`Decider`] the mounting service
//! implements (limiterd, on its engine), and the gRPC adapter serves any [`grpc::Handler`].
//!
//! - [`yaml`]: YAML as a tree of nodes that remember their lines and columns (on
//!   saphyr-parser's events).
//! - [`rules`]: the descriptor files (the reference server's shape), checked with lines.
//! - [`decider`]: what the service decides on.
//! - [`service`]: matching and deciding, protocol-free, with the reference's statistics.
//! - [`settings`]: the service-wide switches and their reference environment variables.
//! - [`json`]: the same requests as JSON (`POST /json` of the mounting service).
//! - `grpc` (feature `grpc`): `ShouldRateLimit` over tonic.

#![forbid(unsafe_code)]

pub mod decider;
#[cfg(feature = "grpc")]
pub mod grpc;
pub mod json;
pub mod rules;
pub mod service;
pub mod settings;
pub mod yaml;

pub use decider::{AddLimitError, Answer, Charge, Decider, Item, LimitSpec, RuleStats, Target};
pub use rules::{Domain, Domains, RulesError};
pub use service::Envoy;
