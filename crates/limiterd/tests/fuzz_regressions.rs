//! Replays every saved fuzz input in `fuzz/regressions/limiterd_{request,config}/` through the
//! fuzz targets' own bodies, so a fixed crash stays fixed without needing cargo-fuzz.

fn replay(target: &str, body: fn(&[u8])) {
    let dir = format!(
        "{}/../../fuzz/regressions/{target}",
        env!("CARGO_MANIFEST_DIR")
    );
    let mut replayed = 0;
    for entry in std::fs::read_dir(&dir).expect("the regressions folder is committed") {
        let path = entry.expect("readable").path();
        let bytes = std::fs::read(&path).expect("readable");
        eprintln!("replaying {}", path.display());
        body(&bytes);
        replayed += 1;
    }
    assert!(replayed > 0, "no saved inputs in {dir}");
}

#[test]
fn saved_request_inputs_still_pass() {
    replay("limiterd_request", limiterd::fuzzing::request);
}

#[test]
fn saved_config_inputs_still_pass() {
    replay("limiterd_config", limiterd::fuzzing::config);
}
