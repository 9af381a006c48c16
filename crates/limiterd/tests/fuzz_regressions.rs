//! Replays every saved fuzz input in `fuzz/regressions/{limiterd_request,limiterd_config}/` through the
//! fuzz targets' own bodies, so a fixed crash stays fixed without needing cargo-fuzz.

use limiter_testkit::fuzzing::replay_saved;

#[test]
fn saved_request_inputs_still_pass() {
    replay_saved("limiterd_request", limiterd::fuzzing::request);
}

#[test]
fn saved_config_inputs_still_pass() {
    replay_saved("limiterd_config", limiterd::fuzzing::config);
}
