//! Operation sequences: what the property tests generate and the fuzz targets decode from bytes.

use proptest::prelude::*;

/// One step of a scenario against one limiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Move the clock forward by this many nanoseconds (saturating).
    Advance(u64),
    /// Move the clock back by this many nanoseconds (saturating at 0).
    Back(u64),
    /// Ask for this many units (0 is a peek).
    Check(u64),
    /// Record this many units of usage that already happened (never refused).
    Record(u64),
}

/// Scenarios biased towards the interesting: small steps near the refill interval, zero steps,
/// huge jumps, backwards steps, costs around the burst, peeks, and `u64::MAX`.
pub fn ops(interval_ns: u64, burst: u64) -> impl Strategy<Value = Vec<Op>> {
    let step = prop_oneof![
        4 => 0..=interval_ns.saturating_mul(2),
        2 => Just(0u64),
        1 => any::<u64>(),
        1 => Just(u64::MAX),
    ];
    let cost = prop_oneof![
        6 => Just(1u64),
        2 => 0..=burst,
        1 => burst.saturating_sub(1)..=burst.saturating_add(1),
        1 => Just(u64::MAX),
    ];
    let op = prop_oneof![
        6 => cost.clone().prop_map(Op::Check),
        2 => cost.prop_map(Op::Record),
        3 => step.clone().prop_map(Op::Advance),
        1 => step.prop_map(Op::Back),
    ];
    proptest::collection::vec(op, 0..200)
}

/// Decodes fuzzer bytes into operations, 9 bytes each: a tag then a little-endian `u64`.
/// Costs and steps are folded towards the interesting range so most inputs exercise decisions.
pub fn decode(bytes: &[u8], interval_ns: u64, burst: u64) -> Vec<Op> {
    bytes
        .chunks_exact(9)
        .map(|chunk| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&chunk[1..]);
            let value = u64::from_le_bytes(word);
            let cost = if chunk[0] & 0x80 == 0 {
                value % burst.saturating_add(2)
            } else {
                value
            };
            match chunk[0] % 8 {
                0..=2 => Op::Check(cost),
                3 => Op::Record(cost),
                4 | 5 => Op::Advance(if chunk[0] & 0x80 == 0 {
                    value % interval_ns.saturating_mul(3).max(1)
                } else {
                    value
                }),
                6 => Op::Back(value % interval_ns.saturating_mul(3).max(1)),
                _ => Op::Back(value),
            }
        })
        .collect()
}
