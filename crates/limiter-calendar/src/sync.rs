//! The atomics the window cache is made of: std's, or loom's when built with
//! `--cfg limiter_loom`, so the loom models explore every interleaving of its readers and
//! writers.

#[cfg(limiter_loom)]
pub(crate) use loom::sync::atomic::{AtomicU64, Ordering, fence};
#[cfg(not(limiter_loom))]
pub(crate) use std::sync::atomic::{AtomicU64, Ordering, fence};
