//! Fuzz target: random limits and operation sequences on the token bucket, checked against the
//! GCRA reference model and the admission bound. Crashers go in `fuzz/regressions/token_bucket/`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use limiter_testkit::fuzzing::run_bytes;
use limiter_testkit::model::GcraModel;
use limiter_token_bucket::Gcra;

fuzz_target!(|bytes: &[u8]| run_bytes::<Gcra, GcraModel>(bytes));
