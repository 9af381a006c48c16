//! Waiting instead of refusing: [`until_admitted`] retries a call after each denial's
//! `retry_after` (plus optional [`Jitter`]) until it is admitted, on whatever timer the caller
//! supplies, so the core stays free of any runtime. The facade crate `limiter` (feature
//! `tokio`) wraps it as `until_ready` methods on direct and keyed limiters and stacks.
//!
//! It never busy-loops: every denial sleeps at least its `retry_after` (at least 1 µs) before
//! the next attempt, and an attempt that can never be admitted (a cost above the burst) returns
//! its error at once, without sleeping.

use core::future::Future;
use core::time::Duration;

use crate::Decision;

/// The outcome of one attempt, as [`until_admitted`] reads it: `None` when admitted, else how
/// long to wait before trying again.
pub trait Admission {
    /// `None` if the attempt was admitted; otherwise the wait before the same call can be.
    fn wait(&self) -> Option<Duration>;
}

impl Admission for Decision {
    fn wait(&self) -> Option<Duration> {
        self.is_denied().then(|| self.retry_after())
    }
}

/// Random extra wait added after each denial, so that callers denied together do not all
/// retry at the same instant (a thundering herd).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Jitter {
    max: Duration,
}

impl Jitter {
    /// No extra wait: retry exactly when the limiter says the call is admitted.
    pub const fn none() -> Self {
        Self {
            max: Duration::ZERO,
        }
    }

    /// Up to `max` extra, uniformly distributed, after each denial.
    pub const fn up_to(max: Duration) -> Self {
        Self { max }
    }

    /// The most extra wait added after one denial.
    pub const fn max(&self) -> Duration {
        self.max
    }

    /// A wait in `[0, max]` drawn from `state` (xorshift64*), advancing it.
    fn sample(&self, state: &mut u64) -> Duration {
        let max = u64::try_from(self.max.as_nanos()).unwrap_or(u64::MAX);
        if max == 0 {
            return Duration::ZERO;
        }
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let draw = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        Duration::from_nanos(draw % max.saturating_add(1).max(1))
    }
}

/// The shortest sleep after a denial, so that a denial reporting a sub-microsecond wait still
/// yields to the timer rather than spinning.
pub const MIN_WAIT: Duration = Duration::from_micros(1);

/// Calls `attempt` until it is admitted, sleeping with `sleep` for each denial's wait plus
/// `jitter` in between; returns the admitting outcome, or the first error (at once: an error
/// means the call can never be decided, so waiting would not help).
///
/// ```
/// use limiter_core::wait::{self, Jitter};
/// use limiter_core::{Clock, Decision, ManualClock};
///
/// // A call admitted from 1 s on, decided against a test clock; the timer advances that
/// // clock (the facade's `until_ready` sleeps on tokio's timer instead).
/// let clock = ManualClock::new();
/// let attempt = || -> Result<Decision, std::convert::Infallible> {
///     let left = 1_000_000_000u64.saturating_sub(clock.now());
///     Ok(if left == 0 { Decision::allow(1, 0, 0) } else { Decision::deny(1, 0, left, left) })
/// };
/// let run = wait::until_admitted(attempt, Jitter::none(), |wait| {
///     clock.advance(wait);
///     std::future::ready(())
/// });
/// # let waker = std::task::Waker::noop();
/// # let mut cx = std::task::Context::from_waker(&waker);
/// # let mut run = std::pin::pin!(run);
/// # let std::task::Poll::Ready(decision) = run.as_mut().poll(&mut cx) else { panic!() };
/// // ... `run.await` in async code:
/// assert!(decision.unwrap().is_allowed());
/// assert_eq!(clock.now(), 1_000_000_000); // one sleep, of exactly the wait
/// ```
pub async fn until_admitted<T, E, F, S, W>(
    mut attempt: F,
    jitter: Jitter,
    mut sleep: S,
) -> Result<T, E>
where
    T: Admission,
    F: FnMut() -> Result<T, E>,
    S: FnMut(Duration) -> W,
    W: Future<Output = ()>,
{
    // Seeded per call from its address and a counter, so concurrent waiters draw apart.
    let mut state = seed(&attempt as *const F as usize);
    loop {
        let outcome = attempt()?;
        let Some(wait) = outcome.wait() else {
            return Ok(outcome);
        };
        let wait = wait.max(MIN_WAIT).saturating_add(jitter.sample(&mut state));
        sleep(wait).await;
    }
}

fn seed(address: usize) -> u64 {
    use core::sync::atomic::{AtomicU64, Ordering};
    // Relaxed: only distinctness matters.
    static CALLS: AtomicU64 = AtomicU64::new(0x9E37_79B9_7F4A_7C15);
    let n = CALLS.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed);
    (n ^ address as u64) | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_its_bound_and_varies() {
        let jitter = Jitter::up_to(Duration::from_millis(10));
        let mut state = seed(7);
        let draws: Vec<Duration> = (0..1_000).map(|_| jitter.sample(&mut state)).collect();
        assert!(draws.iter().all(|d| *d <= Duration::from_millis(10)));
        let distinct: std::collections::HashSet<_> = draws.iter().collect();
        assert!(distinct.len() > 900, "{} distinct draws", distinct.len());
        assert_eq!(Jitter::none().sample(&mut state), Duration::ZERO);
        assert_eq!(
            Jitter::up_to(Duration::MAX).max(),
            Duration::MAX,
            "a huge bound is kept, and sampled without overflow"
        );
        let _ = Jitter::up_to(Duration::MAX).sample(&mut state);
    }
}
