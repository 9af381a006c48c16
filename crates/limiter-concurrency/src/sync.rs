//! The atomic the keyed limiter publishes its newest insert's clock reading in: std's, or
//! loom's when built with `--cfg limiter_loom`, so the loom models run it with the rest.

#[cfg(limiter_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(limiter_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
