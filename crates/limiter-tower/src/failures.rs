//! What the middleware does with a failure it answers for: a store whose failure policy
//! answered (the request let through uncounted, refused with 503, or decided by a local
//! fallback) or a request that cannot be rate limited (500). The operator reads it in the log
//! (`tracing`, target `limiter_tower`), at most one warning every ten seconds per layer with
//! the number left out since; of a store's failure the client is told only that the limiter is
//! unavailable, since its error names servers and keys, which are not the client's to see.

use std::fmt::Display;
use std::time::Duration;

use limiter_core::Paced;

/// One layer's failures, paced in the log.
#[derive(Debug)]
pub(crate) struct FailureLog {
    pace: Paced,
}

impl FailureLog {
    pub(crate) fn new() -> Self {
        Self {
            pace: Paced::new(Duration::from_secs(10)),
        }
    }

    /// Logs `error` with `what` the middleware did about it, unless a warning was written less
    /// than ten seconds ago (then it is counted, and the next warning says how many).
    #[cold]
    pub(crate) fn report(&self, what: &str, error: &dyn Display) {
        if let Some(unlogged) = self.pace.due() {
            tracing::warn!(
                %error,
                unlogged,
                "{what} (one such line every 10 s per layer)"
            );
        }
    }
}
