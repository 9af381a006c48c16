//! [`Breaker`]: the circuit breaker that keeps a dead Redis from costing a timeout per call.
//!
//! Closed: calls go to Redis; `failures_to_open` outages in a row open it. Open: calls go
//! straight to the failure policy until `open_for` has passed. Then one call at a time is let
//! through as a probe: success closes the breaker, failure opens it for another `open_for`.
//! The state is tiny and touched once per call, so it sits behind a mutex: no atomic protocol.
#![deny(clippy::arithmetic_side_effects)]

use core::time::Duration;
use std::sync::{Mutex, PoisonError};

/// When the circuit breaker opens and how long it stays open.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BreakerConfig {
    /// Outages in a row (timeouts, connection errors) that open the breaker. 0 disables it.
    pub failures_to_open: u32,
    /// How long it stays open before letting one probe through.
    pub open_for: Duration,
}

impl Default for BreakerConfig {
    /// Opens after 5 outages in a row, for 1 second.
    fn default() -> Self {
        Self {
            failures_to_open: 5,
            open_for: Duration::from_secs(1),
        }
    }
}

/// What the breaker lets a call do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Go to Redis.
    Call,
    /// Go to Redis as the one probe of an open breaker.
    Probe,
    /// Do not call Redis; the breaker probes again after this long.
    Refuse(Duration),
}

#[derive(Debug)]
struct State {
    /// Outages in a row while closed.
    failures: u32,
    /// While open: the clock reading (ns) from which a probe may go.
    open_until: Option<u64>,
    /// Whether a probe is out.
    probing: bool,
}

/// The breaker. Times are readings of the backend's local clock, in nanoseconds.
#[derive(Debug)]
pub(crate) struct Breaker {
    config: BreakerConfig,
    state: Mutex<State>,
}

impl Breaker {
    pub(crate) fn new(config: BreakerConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State {
                failures: 0,
                open_until: None,
                probing: false,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is valid after any panic: every update is a plain assignment.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a call made at `now` may go to Redis.
    pub(crate) fn pass(&self, now: u64) -> Pass {
        let mut state = self.state();
        match state.open_until {
            None => Pass::Call,
            Some(until) if now < until => {
                Pass::Refuse(Duration::from_nanos(until.saturating_sub(now)))
            }
            Some(_) if state.probing => Pass::Refuse(Duration::ZERO),
            Some(_) => {
                state.probing = true;
                Pass::Probe
            }
        }
    }

    /// Redis answered: the breaker closes.
    pub(crate) fn success(&self) {
        let mut state = self.state();
        if state.open_until.is_some() {
            tracing::info!(
                target: "limiter_redis::breaker",
                "circuit breaker closed: Redis answered the probe, calls go to Redis again"
            );
        }
        state.failures = 0;
        state.open_until = None;
        state.probing = false;
    }

    /// Redis failed at `now` (an outage, not a refused call).
    pub(crate) fn failure(&self, now: u64, pass: Pass) {
        if self.config.failures_to_open == 0 {
            return;
        }
        let mut state = self.state();
        let reopen = match pass {
            Pass::Probe => {
                state.probing = false;
                true
            }
            _ => {
                state.failures = state.failures.saturating_add(1);
                state.open_until.is_none() && state.failures >= self.config.failures_to_open
            }
        };
        if reopen {
            let open_for = u64::try_from(self.config.open_for.as_nanos()).unwrap_or(u64::MAX);
            state.open_until = Some(now.saturating_add(open_for));
            if matches!(pass, Pass::Probe) {
                // Still open: said once when it opened, not at every probe of an outage.
                tracing::debug!(
                    target: "limiter_redis::breaker",
                    open_for = ?self.config.open_for,
                    "circuit breaker stays open: the probe failed"
                );
            } else {
                tracing::warn!(
                    target: "limiter_redis::breaker",
                    failures = state.failures,
                    open_for = ?self.config.open_for,
                    "circuit breaker open: calls skip Redis and follow the failure policy until a probe succeeds"
                );
            }
        }
    }

    /// Whether the breaker is open (or probing).
    pub(crate) fn is_open(&self) -> bool {
        self.state().open_until.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn opens_after_the_threshold_probes_once_and_closes_on_success() {
        let breaker = Breaker::new(BreakerConfig {
            failures_to_open: 3,
            open_for: Duration::from_secs(1),
        });
        for _ in 0..2 {
            assert_eq!(breaker.pass(0), Pass::Call);
            breaker.failure(0, Pass::Call);
        }
        assert!(
            !breaker.is_open(),
            "two failures stay under the threshold of three"
        );
        breaker.failure(10, Pass::Call);
        assert_eq!(breaker.pass(10), Pass::Refuse(Duration::from_nanos(SECOND)));
        assert_eq!(
            breaker.pass(SECOND + 9),
            Pass::Refuse(Duration::from_nanos(1))
        );
        assert_eq!(breaker.pass(SECOND + 10), Pass::Probe);
        assert_eq!(
            breaker.pass(SECOND + 10),
            Pass::Refuse(Duration::ZERO),
            "one probe at a time"
        );
        breaker.failure(SECOND + 20, Pass::Probe);
        assert_eq!(
            breaker.pass(SECOND + 21),
            Pass::Refuse(Duration::from_nanos(SECOND - 1))
        );
        assert_eq!(breaker.pass(2 * SECOND + 20), Pass::Probe);
        breaker.success();
        assert_eq!(breaker.pass(2 * SECOND + 20), Pass::Call);
        assert!(!breaker.is_open());
    }

    #[test]
    fn a_success_resets_the_count_and_zero_disables() {
        let breaker = Breaker::new(BreakerConfig {
            failures_to_open: 2,
            open_for: Duration::from_secs(1),
        });
        breaker.failure(0, Pass::Call);
        breaker.success();
        breaker.failure(0, Pass::Call);
        assert_eq!(breaker.pass(0), Pass::Call, "failures must be in a row");
        let off = Breaker::new(BreakerConfig {
            failures_to_open: 0,
            open_for: Duration::from_secs(1),
        });
        for _ in 0..100 {
            off.failure(0, Pass::Call);
        }
        assert_eq!(off.pass(0), Pass::Call);
    }
}
