//! What a test's thread logs through `tracing`, captured as text ([`capture`]): for tests that
//! a failure is told to the operator, and told once.

use std::sync::{Arc, Mutex, PoisonError};

/// What this thread logs at INFO and above from now until the guard drops, as text (a test on
/// tokio's default, one-thread runtime: the servers it spawns log on its thread).
///
/// ```
/// let (_capture, logs) = limiter_testkit::logs::capture();
/// tracing::warn!("once");
/// tracing::debug!("not captured");
/// assert_eq!(logs.count("once"), 1);
/// assert_eq!(logs.count("not captured"), 0);
/// ```
pub fn capture() -> (tracing::subscriber::DefaultGuard, Logs) {
    let logs = Logs::default();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(logs.clone())
        .finish();
    (tracing::subscriber::set_default(subscriber), logs)
}

/// Log lines written so far (see [`capture`]).
#[derive(Clone, Debug, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// The lines written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(PoisonError::into_inner)).into_owned()
    }

    /// How many lines written so far contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Logs {
    type Writer = Logs;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}
