//! Replays every saved fuzz input in `fuzz/regressions/http_middleware/` through the fuzz
//! target's own body (`limiter_testkit::http`), so a fixed crash stays fixed without needing
//! cargo-fuzz.

#[test]
fn saved_fuzz_inputs_still_pass() {
    let dir = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fuzz/regressions/http_middleware"
    );
    let mut replayed = 0;
    for entry in std::fs::read_dir(dir).expect("the regressions folder is committed") {
        let path = entry.expect("readable").path();
        let bytes = std::fs::read(&path).expect("readable");
        eprintln!("replaying {}", path.display());
        limiter_testkit::http::run_bytes(&bytes);
        replayed += 1;
    }
    assert!(replayed > 0, "no saved inputs in {dir}");
}
