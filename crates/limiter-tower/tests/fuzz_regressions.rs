//! Replays every saved fuzz input in `fuzz/regressions/http_middleware/` through the fuzz
//! target's own body (`limiter_testkit::http`), so a fixed crash stays fixed without needing
//! cargo-fuzz.

#[test]
fn saved_fuzz_inputs_still_pass() {
    limiter_testkit::fuzzing::replay_saved("http_middleware", limiter_testkit::http::run_bytes);
}
