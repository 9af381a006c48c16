//! Fuzz target: arbitrary bytes through envoy's descriptor-file loader (YAML); it must refuse
//! with the file, line and field, or accept only limits the engine can decide, and match
//! without panicking. Crashers go in `fuzz/regressions/envoy_rules/`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|bytes: &[u8]| limiter_envoy::fuzzing::rules(bytes));
