//! Replays every saved fuzz input for the window counters through the fuzz targets' own body.

use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_testkit::fuzzing::run_bytes;
use limiter_testkit::model::{FixedWindowModel, SlidingWindowModel};

fn replay(target: &str, run: fn(&[u8])) {
    let dir = format!(
        "{}/../../fuzz/regressions/{target}",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("the regressions folder is committed") {
        let path = entry.expect("readable").path();
        eprintln!("replaying {}", path.display());
        run(&std::fs::read(&path).expect("readable"));
        replayed += 1;
    }
    assert!(replayed > 0, "no saved inputs in {dir}");
}

#[test]
fn saved_sliding_window_inputs_still_pass() {
    replay(
        "sliding_window",
        run_bytes::<SlidingCounter, SlidingWindowModel>,
    );
}

#[test]
fn saved_fixed_window_inputs_still_pass() {
    replay("fixed_window", run_bytes::<FixedCounter, FixedWindowModel>);
}
