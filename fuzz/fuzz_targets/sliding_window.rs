//! Fuzz target: random limits and operation sequences on the sliding-window counter, checked against
//! its reference model and the admission bound. Crashers go in `fuzz/regressions/sliding_window/`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use limiter_sliding_window::SlidingCounter;
use limiter_testkit::fuzzing::run_bytes;
use limiter_testkit::model::SlidingWindowModel;

fuzz_target!(|bytes: &[u8]| run_bytes::<SlidingCounter, SlidingWindowModel>(bytes));
