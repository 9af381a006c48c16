//! The atomics the entry lock is built from: std's, or loom's under `--cfg limiter_loom`.

#[cfg(limiter_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};
#[cfg(not(limiter_loom))]
pub(crate) use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Waits a little for another thread to release an entry: spins first, then yields the core
/// (the holder may have been preempted; it never blocks while holding an entry).
pub(crate) fn back_off(spins: &mut u32) {
    #[cfg(limiter_loom)]
    {
        let _ = spins;
        loom::thread::yield_now();
    }
    #[cfg(not(limiter_loom))]
    {
        if *spins < 64 {
            *spins = spins.saturating_add(1);
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

/// The hasher keyed entries are placed with: foldhash, randomly seeded, or under loom a fixed
/// seed, so every execution of a model walks the tables in the same order (loom replays each
/// execution and requires the same operations every time).
#[cfg(not(limiter_loom))]
pub(crate) type EntryHasher = limiter_store::DefaultHasher;
#[cfg(limiter_loom)]
pub(crate) type EntryHasher = foldhash::fast::FixedState;
