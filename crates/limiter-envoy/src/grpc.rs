//! The gRPC face: `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` (types from
//! the `envoy-types` crate, so no protoc at build time), translated to and from
//! [`crate::service`] and answered by the mounting service's [`Handler`]. A malformed request
//! is `INVALID_ARGUMENT` naming the field; a store that fails closed is `UNAVAILABLE` (envoy
//! then applies its own `failure_mode_deny`).

use std::future::Future;

use crate::service::{Descriptor, EnvoyError, Override, Request, Response};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    DescriptorStatus, RateLimit as WireLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{
    Duration as WireDuration, ListValue, Struct, Value as WireValue,
};

/// The largest request message accepted.
pub const MAX_MESSAGE_BYTES: usize = 256 * 1024;

/// What answers a `ShouldRateLimit` call: the mounting service (which picks the serving
/// configuration, decides on its [`Decider`](crate::Decider) and counts its own metrics).
pub trait Handler: Send + Sync + 'static {
    /// Decides `request` (or refuses one that could not be read, `Err` in `request`, counting
    /// it as the service counts bad input).
    fn should_rate_limit(
        &self,
        request: Result<Request, EnvoyError>,
    ) -> impl Future<Output = Result<Response, EnvoyError>> + Send;
}

/// The rate-limit service over a [`Handler`].
#[derive(Debug)]
pub struct Grpc<H> {
    handler: H,
}

impl<H: Handler> Grpc<H> {
    /// The tonic service for `handler`.
    pub fn service(handler: H) -> RateLimitServiceServer<Self> {
        RateLimitServiceServer::new(Self { handler }).max_decoding_message_size(MAX_MESSAGE_BYTES)
    }
}

/// The protocol's request as [`Request`].
pub fn from_wire(request: RateLimitRequest) -> Result<Request, EnvoyError> {
    let descriptors = request
        .descriptors
        .into_iter()
        .map(|d| {
            Ok(Descriptor {
                negative_hits: d.is_negative_hits,
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit: d.limit.map(|l| Override {
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit,
                }),
                hits_addend: d.hits_addend.map(|h| h.value),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Request {
        domain: request.domain,
        descriptors,
        hits_addend: request.hits_addend,
    })
}

/// [`Response`] in the protocol's form.
pub fn to_wire(response: &Response) -> RateLimitResponse {
    RateLimitResponse {
        overall_code: response.overall.number(),
        statuses: response
            .statuses
            .iter()
            .map(|s| DescriptorStatus {
                code: s.code.number(),
                current_limit: s.current_limit.as_ref().map(|l| WireLimit {
                    name: l.name.clone(),
                    requests_per_unit: l.requests_per_unit,
                    unit: l.unit.number(),
                }),
                limit_remaining: s.limit_remaining,
                duration_until_reset: s.duration_until_reset.map(|d| WireDuration {
                    seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
                    nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
                }),
                quota: None,
            })
            .collect(),
        response_headers_to_add: response
            .headers
            .iter()
            .map(|(key, value)| HeaderValue {
                key: key.clone(),
                value: value.clone(),
                ..HeaderValue::default()
            })
            .collect(),
        dynamic_metadata: response.dynamic_metadata.as_ref().map(|fields| Struct {
            fields: fields
                .iter()
                .map(|(k, v)| (k.clone(), wire_value(v)))
                .collect(),
        }),
        ..RateLimitResponse::default()
    }
}

/// A JSON value as a `google.protobuf.Value`.
fn wire_value(value: &serde_json::Value) -> WireValue {
    use serde_json::Value as J;
    let kind = match value {
        J::Null => Kind::NullValue(0),
        J::Bool(b) => Kind::BoolValue(*b),
        J::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        J::String(s) => Kind::StringValue(s.clone()),
        J::Array(items) => Kind::ListValue(ListValue {
            values: items.iter().map(wire_value).collect(),
        }),
        J::Object(fields) => Kind::StructValue(Struct {
            fields: fields
                .iter()
                .map(|(k, v)| (k.clone(), wire_value(v)))
                .collect(),
        }),
    };
    WireValue { kind: Some(kind) }
}

#[tonic::async_trait]
impl<H: Handler> RateLimitService for Grpc<H> {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let request = from_wire(request.into_inner());
        match self.handler.should_rate_limit(request).await {
            Ok(response) => Ok(tonic::Response::new(to_wire(&response))),
            Err(EnvoyError::Invalid(message)) => Err(tonic::Status::invalid_argument(message)),
            Err(EnvoyError::Empty(message)) => Err(tonic::Status::unknown(message)),
            Err(EnvoyError::Unavailable(message)) => Err(tonic::Status::unavailable(message)),
        }
    }
}
