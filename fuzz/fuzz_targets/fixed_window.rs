//! Fuzz target: random limits and operation sequences on the fixed-window counter, checked against
//! its reference model and the admission bound. Crashers go in `fuzz/regressions/fixed_window/`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use limiter_sliding_window::FixedCounter;
use limiter_testkit::fuzzing::run_bytes;
use limiter_testkit::model::FixedWindowModel;

fuzz_target!(|bytes: &[u8]| run_bytes::<FixedCounter, FixedWindowModel>(bytes));
