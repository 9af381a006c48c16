//! Replays every saved fuzz input in `fuzz/regressions/token_bucket/` through the fuzz target's
//! own body, so a fixed crash stays fixed without needing cargo-fuzz.

use limiter_testkit::fuzzing::run_bytes;
use limiter_testkit::model::GcraModel;
use limiter_token_bucket::Gcra;

#[test]
fn saved_fuzz_inputs_still_pass() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/regressions/token_bucket"
    );
    let mut replayed = 0;
    for entry in std::fs::read_dir(dir).expect("the regressions folder is committed") {
        let path = entry.expect("readable").path();
        let bytes = std::fs::read(&path).expect("readable");
        eprintln!("replaying {}", path.display());
        run_bytes::<Gcra, GcraModel>(&bytes);
        replayed += 1;
    }
    assert!(replayed > 0, "no saved inputs in {dir}");
}
