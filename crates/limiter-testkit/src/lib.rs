//! Test support shared by every algorithm crate, the fuzz targets and the benches: reference
//! models, a reference store that never forgets, an operation-sequence harness that checks an algorithm against a model, and the
//! conformance checks every algorithm must pass.
//!
//! An algorithm gets the whole battery by naming itself once (the token bucket's own
//! `tests/integration/conformance.rs` runs this; here it is only compiled):
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
#[cfg(feature = "logs")]
pub mod logs;
pub mod model;
pub mod ops;
#[cfg(feature = "redis-server")]
pub mod redis_server;
pub mod store;

/// The name the test harness knows test `test` of module `module` (its `module_path!()`) by:
/// what `--exact` takes to run that test alone in a child process of the test binary. The
/// harness leaves out the path's first segment, the test binary's own crate.
///
/// ```
/// assert_eq!(limiter_testkit::test_name("integration::fleet", "child"), "fleet::child");
/// assert_eq!(limiter_testkit::test_name("wait", "child"), "child");
/// ```
pub fn test_name(module: &str, test: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{test}"),
        None => test.to_owned(),
    }
}

/// A command that runs test `test` of module `module` (its `module_path!()`) alone in a child
/// process of this test binary, its output not captured: how a test stands up processes of its
/// own (a fleet sharing one Redis). The child finds its part in the environment the caller
/// sets, and the caller pipes or spawns it.
pub fn child_test(module: &str, test: &str) -> std::process::Command {
    let exe = std::env::current_exe().expect("the test binary's own path");
    let mut command = std::process::Command::new(exe);
    command.args([
        "--exact",
        &test_name(module, test),
        "--nocapture",
        "--test-threads=1",
    ]);
    command
}
