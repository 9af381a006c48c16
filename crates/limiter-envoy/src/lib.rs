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
//!
//! # Example
//!
//! A decider counting each configured limit on an in-process stack, its batches all or
//! nothing through the workspace's seam (limiterd's does the same on its engine, in memory or
//! on Redis):
//!
//! ```
//! use limiter_envoy::service::{Code, Descriptor, EnvoyError, Request};
//! use limiter_envoy::{
//!     AddLimitError, Answer, Decider, Domains, Envoy, Item, LimitSpec, RuleStats, Target,
//! };
//! use limiter_stack::{BatchItem, Layer, Outcome, Stack, decide_all};
//!
//! #[derive(Clone, Debug)]
//! struct NoStats;
//! impl RuleStats for NoStats {
//!     fn add(&self, _: &str, _: u64) {}
//! }
//!
//! #[derive(Default)]
//! struct InMemory(Vec<Stack<String, String>>);
//!
//! impl Decider for InMemory {
//!     type Limit = usize;
//!     type Stats = NoStats;
//!
//!     fn add_limit(&mut self, _: &str, _: &str, spec: &LimitSpec) -> Result<usize, AddLimitError> {
//!         let layer = Layer::keyed("descriptor", |id: &String| Some(id.clone()))
//!             .limit(spec.kind, spec.limit);
//!         let stack = Stack::builder().layer(layer).build();
//!         self.0.push(stack.map_err(|e| AddLimitError::Refused(Box::new(e)))?);
//!         Ok(self.0.len() - 1)
//!     }
//!
//!     async fn decide(&self, items: &[Item<usize>]) -> Result<(bool, Vec<Answer>), EnvoyError> {
//!         let mut batch = Vec::new();
//!         for item in items {
//!             let Target::Limit(limit) = item.target else {
//!                 return Err(EnvoyError::Invalid("this decider counts configured limits only".into()));
//!             };
//!             let (request, cost, charge, shadow) =
//!                 (&item.identifier, item.cost, item.charge, item.shadow);
//!             batch.push(BatchItem { limiter: &self.0[limit], request, cost, charge, shadow });
//!         }
//!         let decided = decide_all(&batch, None).await;
//!         let decided = decided.map_err(|e| EnvoyError::Invalid(e.to_string()))?;
//!         let answers = decided.outcomes.into_iter().map(|outcome| match outcome {
//!             Outcome::Decided { decision, .. } => Ok(Answer { decision: decision.decision() }),
//!             _ => Err(EnvoyError::Unavailable("the store failed".into())),
//!         });
//!         Ok((decided.admitted, answers.collect::<Result<_, _>>()?))
//!     }
//!
//!     fn rule_stats(&self, _: &str) -> NoStats {
//!         NoStats
//!     }
//!
//!     fn stat(&self, _: &str, _: &'static str, _: u64) {}
//! }
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let file = "domain: web\ndescriptors:\n  - key: user\n    rate_limit: { unit: minute, requests_per_unit: 2 }\n";
//! let mut decider = InMemory::default();
//! let envoy = Envoy::attach(Domains::load([("web.yaml", file)])?, &mut decider)?;
//! let ada = Descriptor { entries: vec![("user".into(), "ada".into())], ..Default::default() };
//! let request = Request { domain: "web".into(), descriptors: vec![ada], hits_addend: 1 };
//! let codes: Vec<Code> = (0..3)
//!     .map(|_| at_once(envoy.decide(&decider, &request)).map(|r| r.overall))
//!     .collect::<Result<_, _>>()?;
//! assert_eq!(codes, [Code::Ok, Code::Ok, Code::OverLimit]);
//! # Ok(()) }
//! # // In process every answer is ready when first polled.
//! # fn at_once<T>(f: impl std::future::Future<Output = T>) -> T {
//! #     let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
//! #     match std::pin::pin!(f).poll(&mut cx) { std::task::Poll::Ready(v) => v, _ => unreachable!() }
//! # }
//! ```

#![forbid(unsafe_code)]

pub mod decider;
#[doc(hidden)]
pub mod fuzzing;
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
