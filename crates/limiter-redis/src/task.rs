//! The one place limiter-redis starts work of its own: [`spawn`] runs a future on the
//! caller's tokio runtime (a leased stack's idle sweep and its renewing ahead, the
//! coalescer's next call, a connection's reader and writer, a cluster's slot-map refresh, the
//! Sentinel watch) and [`pause`] waits between a watch's rounds. Library code spawns and sleeps
//! nowhere else (`cargo xtask lint`), so what runs in the background is listed here by its
//! callers.

use std::future::Future;

/// Runs `task` on the current tokio runtime, if there is one; `Err(task)` hands it back when
/// none is running (the caller decides what not running it means).
pub(crate) fn spawn<F>(task: F) -> Result<(), F>
where
    F: Future<Output = ()> + Send + 'static,
{
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(task);
            Ok(())
        }
        Err(_) => Err(task),
    }
}

/// Runs `task` on `runtime` (one a caller was on earlier: a held permit's release, which may
/// be dropped outside it; a runtime that has shut down drops the task unstarted).
pub(crate) fn spawn_on<F>(runtime: &tokio::runtime::Handle, task: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    runtime.spawn(task);
}

/// Waits `period` (between a background watch's rounds).
pub(crate) async fn pause(period: core::time::Duration) {
    tokio::time::sleep(period).await;
}
