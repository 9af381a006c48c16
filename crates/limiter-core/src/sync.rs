//! The one place that names atomic types, so loom can swap them in under `--cfg limiter_loom`.
//!
//! `limiter_loom` is our own namespaced cfg rather than the common `loom`, so building the loom
//! models never switches a dependency into its own loom mode.

#[cfg(not(limiter_loom))]
pub(crate) use std::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};

#[cfg(limiter_loom)]
pub(crate) use loom::sync::{
    Arc,
    atomic::{AtomicU64, Ordering},
};
