//! The lock the sharded store uses: std's, or loom's when built with `--cfg limiter_loom` so the
//! loom models explore every interleaving of lookups, inserts and reclamation.

#[cfg(limiter_loom)]
pub(crate) use loom::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(not(limiter_loom))]
pub(crate) use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
