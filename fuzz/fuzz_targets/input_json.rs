//! Fuzz target: arbitrary bytes read strictly (limiter-input) and by serde_json alone; the
//! strict reading agrees wherever objects are where structs belong and never panics. Failures
//! go in `fuzz/regressions/input_json/`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| limiter_input::fuzzing::json(bytes));
