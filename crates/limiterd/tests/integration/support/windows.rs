//! Fixed windows on a real clock. A daemon's windows (and Redis's) start again at every
//! multiple of their period from the Unix epoch, so a section of a test that counts exactly
//! through one window fails when its run happens to cross a boundary: the count starts again.
//! [`in_one_window`] runs such a section again, once, on the fresh state it builds, when it
//! failed across a boundary; a failure within one window, or a second failure, fails the test.
//! (The alternative, where a fixed window is not what a test is about, is a token bucket of a
//! long period: it has no boundary, and gives back no unit within a test's minutes.)

use std::future::Future;

pub(crate) const MINUTE_MS: u64 = 60_000;
pub(crate) const HOUR_MS: u64 = 3_600_000;
pub(crate) const DAY_MS: u64 = 86_400_000;

/// The wall clock, in Unix milliseconds.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64
}

/// Whether a run from `started` to `ended` (Unix ms) crossed a multiple of `period_ms`.
pub(crate) fn crossed_a_boundary(started: u64, ended: u64, period_ms: u64) -> bool {
    started / period_ms != ended / period_ms
}

/// Runs `section` (which starts what it counts on: a daemon, a server, identifiers of its
/// own), and again if it failed while the wall clock crossed a multiple of `period_ms` (the
/// shortest window it counts through; a longer window's boundaries are among them).
pub(crate) async fn in_one_window<Section, Run>(period_ms: u64, section: Section)
where
    Section: Fn() -> Run,
    Run: Future<Output = ()> + Send + 'static,
{
    in_one_window_by(period_ms, unix_ms, section).await;
}

/// [`in_one_window`] on the clock `now`.
async fn in_one_window_by<Section, Run>(period_ms: u64, now: impl Fn() -> u64, section: Section)
where
    Section: Fn() -> Run,
    Run: Future<Output = ()> + Send + 'static,
{
    let started = now();
    let Err(failure) = tokio::spawn(section()).await else {
        return;
    };
    let ended = now();
    if !failure.is_panic() || !crossed_a_boundary(started, ended, period_ms) {
        std::panic::resume_unwind(failure.into_panic());
    }
    eprintln!(
        "the run from {started} to {ended} crossed a window's boundary (every {period_ms} ms): \
         run again"
    );
    if let Err(failure) = tokio::spawn(section()).await {
        std::panic::resume_unwind(failure.into_panic());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A section that fails on its first run and passes on the next, counting its runs.
    fn fails_once(
        runs: &Arc<AtomicU64>,
    ) -> impl Fn() -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        let runs = Arc::clone(runs);
        move || {
            let run = runs.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move { assert!(run > 0, "the first run fails") })
        }
    }

    /// A clock that reads `first`, then `then` ever after.
    fn clock(first: u64, then: u64) -> impl Fn() -> u64 {
        let reads = AtomicU64::new(0);
        move || {
            if reads.fetch_add(1, Ordering::Relaxed) == 0 {
                first
            } else {
                then
            }
        }
    }

    #[test]
    fn a_boundary_is_a_multiple_of_the_period() {
        assert!(crossed_a_boundary(59_999, 60_000, MINUTE_MS));
        assert!(!crossed_a_boundary(60_000, 119_999, MINUTE_MS));
        assert!(!crossed_a_boundary(3_599_000, 3_599_999, HOUR_MS));
        assert!(crossed_a_boundary(3_599_000, 3_600_000, HOUR_MS));
    }

    #[tokio::test]
    async fn a_section_that_failed_across_a_boundary_runs_again() {
        let runs = Arc::new(AtomicU64::new(0));
        in_one_window_by(HOUR_MS, clock(HOUR_MS - 1, HOUR_MS), fails_once(&runs)).await;
        assert_eq!(runs.load(Ordering::Relaxed), 2);
    }

    #[tokio::test]
    async fn a_section_that_passed_runs_once() {
        let runs = Arc::new(AtomicU64::new(1));
        in_one_window_by(HOUR_MS, clock(HOUR_MS - 1, HOUR_MS), fails_once(&runs)).await;
        assert_eq!(
            runs.load(Ordering::Relaxed),
            2,
            "one run, after the one counted"
        );
    }

    #[tokio::test]
    #[should_panic(expected = "the first run fails")]
    async fn a_section_that_failed_within_one_window_fails() {
        let runs = Arc::new(AtomicU64::new(0));
        in_one_window_by(HOUR_MS, clock(HOUR_MS, 2 * HOUR_MS - 1), fails_once(&runs)).await;
    }
}
