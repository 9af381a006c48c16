//! [`AppState`]: what the adapters share (the HTTP API in [`crate::api`], envoy's gRPC protocol
//! in [`crate::grpc`]): the engine, envoy's domains over it, and the metrics. The adapters
//! depend on it and on the layers below (engine, envoy, metrics); nothing below depends on an
//! adapter.

use std::sync::Arc;

use crate::engine::Engine;
use crate::envoy::Envoy;
use crate::metrics::Metrics;

/// What the handlers share.
#[derive(Debug)]
pub struct AppState<C> {
    /// The policies' stacks.
    pub engine: Engine<C>,
    /// Envoy's domains, whose limits are policies of `engine`.
    pub envoy: Envoy,
    /// The counters.
    pub metrics: Arc<Metrics>,
}
