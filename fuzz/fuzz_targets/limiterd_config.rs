//! Fuzz target: arbitrary bytes through limiterd's configuration parser; it must refuse
//! clearly or accept only what the engine can decide. Crashers go in `fuzz/regressions/limiterd_config/`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| limiterd::fuzzing::config(bytes));
