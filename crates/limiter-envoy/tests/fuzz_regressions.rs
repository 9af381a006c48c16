//! Replays every saved fuzz input in `fuzz/regressions/envoy_rules/` through the fuzz target's
//! own body (`limiter_envoy::fuzzing::rules`), so a fixed crash stays fixed without needing
//! cargo-fuzz.

#[test]
fn saved_envoy_rules_inputs_still_pass() {
    limiter_testkit::fuzzing::replay_saved("envoy_rules", limiter_envoy::fuzzing::rules);
}
