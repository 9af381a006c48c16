//! The body of every algorithm's fuzz target, shared with the plain test that replays saved
//! fuzz inputs: bytes become a limit, a start time and an operation sequence, run through the
//! [`harness`] against the algorithm's reference model.

use limiter_core::{Algorithm, Limit, LimitError};

use crate::harness;
use crate::model::Model;
use crate::ops::decode;

/// Runs one fuzz input against algorithm `A` and model `M`, panicking on any violation.
///
/// Layout: bytes 0..8 pick the period, 8..16 the count, 16..18 the burst, 18..26 the start
/// reading; the rest are operations ([`decode`]). Short inputs are ignored.
pub fn run_bytes<A: Algorithm, M: Model>(bytes: &[u8]) {
    let Some((header, rest)) = bytes.split_first_chunk::<26>() else {
        return;
    };
    let word = |at: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&header[at..at + 8]);
        u64::from_le_bytes(b)
    };
    let period_seed = word(0);
    // Half the inputs use a period within a day, the others any period at all.
    let period = if period_seed & 1 == 0 {
        period_seed % 86_400_000_000_000 + 1
    } else {
        period_seed
    };
    let count = word(8) % period.min(1_000_000) + 1;
    // An odd first burst byte keeps the default burst (= count), which window counters need.
    let burst = if header[16] & 1 == 1 {
        0
    } else {
        u64::from(u16::from_le_bytes([header[16], header[17]]))
    };
    let start = word(18);
    let limit = match burst {
        0 => Limit::from_nanos(count, period),
        burst => Limit::from_nanos(count, period).with_burst(burst),
    };
    if let Err(e) = limit.check() {
        panic!("count {count} per {period} ns was built to be valid: {e}");
    }
    match A::new(limit) {
        Ok(_) => {}
        Err(LimitError::Unsupported { .. }) => return,
        Err(e) => panic!("{limit}: a valid limit was refused with the wrong error: {e}"),
    }
    let ops = decode(rest, limit.period_nanos() / limit.count(), limit.burst());
    if let Err(violation) = harness::run_conservative::<A, M>(limit, start, &ops) {
        panic!("{violation}");
    }
}

/// Runs `body` on every input saved in `fuzz/regressions/<target>/` (crashers once found,
/// and seeds), so a fixed crash stays fixed without cargo-fuzz. Panics if there is none.
pub fn replay_saved(target: &str, body: impl Fn(&[u8])) {
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
