//! Replays every saved fuzz input for the window counters through the fuzz targets' own body.

use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_testkit::fuzzing::{replay_saved, run_bytes};
use limiter_testkit::model::{FixedWindowModel, SlidingWindowModel};

#[test]
fn saved_sliding_window_inputs_still_pass() {
    replay_saved(
        "sliding_window",
        run_bytes::<SlidingCounter, SlidingWindowModel>,
    );
}

#[test]
fn saved_fixed_window_inputs_still_pass() {
    replay_saved("fixed_window", run_bytes::<FixedCounter, FixedWindowModel>);
}
