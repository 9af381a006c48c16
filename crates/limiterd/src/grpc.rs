//! Envoy's gRPC protocol mounted on limiterd: the adapter (`limiter_envoy::grpc`) asks
//! [`Serving`], which decides on the serving configuration and counts the call's latency and
//! bad input in the metrics.

use std::sync::Arc;
use std::time::Instant;

use limiter_core::Clock;
use limiter_envoy::service::{EnvoyError, Request, Response};

use crate::ops::live::Live;

/// The gRPC adapter's handler: decides on the serving configuration, counting the call's
/// latency and bad input in the metrics.
#[derive(Debug)]
pub struct Serving<C>(pub Arc<Live<C>>);

impl<C: Clock + Clone + Send + Sync + 'static> limiter_envoy::grpc::Handler for Serving<C> {
    async fn should_rate_limit(
        &self,
        request: Result<Request, EnvoyError>,
    ) -> Result<Response, EnvoyError> {
        let started = Instant::now();
        let state = self.0.current();
        let result = match request {
            Ok(request) => state.envoy.decide(&state.engine, &request).await,
            Err(e) => Err(e),
        };
        state.metrics.observe(started.elapsed());
        if let Err(EnvoyError::Invalid(_) | EnvoyError::Empty(_)) = &result {
            state.metrics.invalid();
        }
        result
    }
}
