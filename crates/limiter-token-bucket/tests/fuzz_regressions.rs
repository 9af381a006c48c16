//! Replays every saved fuzz input in `fuzz/regressions/token_bucket/` through the fuzz target's
//! own body, so a fixed crash stays fixed without needing cargo-fuzz.

use limiter_testkit::fuzzing::{replay_saved, run_bytes};
use limiter_testkit::model::GcraModel;
use limiter_token_bucket::Gcra;

#[test]
fn saved_fuzz_inputs_still_pass() {
    replay_saved("token_bucket", run_bytes::<Gcra, GcraModel>);
}
