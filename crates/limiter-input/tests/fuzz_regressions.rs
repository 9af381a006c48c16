//! Replays every saved fuzz input in `fuzz/regressions/input_json/` through the fuzz target's
//! own body (`limiter_input::fuzzing::json`), so a fixed failure stays fixed without needing
//! cargo-fuzz.

#[test]
fn saved_input_json_inputs_still_pass() {
    limiter_testkit::fuzzing::replay_saved("input_json", limiter_input::fuzzing::json);
}
