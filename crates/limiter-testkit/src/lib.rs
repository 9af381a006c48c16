//! Test support shared by every algorithm crate, the fuzz targets and the benches: reference
//! models, a reference store that never forgets, an operation-sequence harness that checks an algorithm against a model, and the
//! conformance checks every algorithm must pass.
//!
//! An algorithm gets the whole battery by naming itself once (the token bucket's own
//! `tests/conformance.rs` runs this; here it is only compiled):
//!
//! ```no_run
//! use limiter_testkit::{conformance, model::GcraModel};
//! use limiter_token_bucket::Gcra;
//!
//! // A drained token bucket admits one more unit after one interval.
//! conformance::run_all::<Gcra, GcraModel>(|limit| conformance::Refill::OneUnit(limit.interval()));
//! ```
#![forbid(unsafe_code)]

pub mod conformance;
pub mod fuzzing;
pub mod harness;
#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "http-client")]
pub mod http_client;
pub mod model;
pub mod ops;
#[cfg(feature = "redis-server")]
pub mod redis_server;
pub mod store;
