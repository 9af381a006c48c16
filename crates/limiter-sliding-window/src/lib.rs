//! Sliding-window and fixed-window counters: each key's whole state is one `u64` (a window
//! number and one or two counts), updated by compare-and-swap, and a denial writes nothing.
//!
//! A window counter admits at most `count` units per window of length `period`:
//!
//! - [`SlidingWindow`] weights the previous window's count by how much of it still overlaps the
//!   sliding window ending now. It smooths the boundary burst of fixed windows at the cost of
//!   two counts, not a log of every request.
//! - [`FixedWindow`] counts the current window only, as envoy's rate-limit service does.
//!
//! [`WindowCounter`] documents the bounds, the state layout and the supported ranges.
//!
//! # Accuracy
//!
//! The sliding counter assumes the previous window's requests were spread evenly. The
//! `accuracy` test replays synthetic traces (2,000 clients, 100 requests each, a limit of 20 per
//! second) against an exact sliding log and counts the decisions that differ:
//!
//! | trace | log denies | decisions that differ | counter admits, log denies | log admits, counter denies |
//! | --- | --- | --- | --- | --- |
//! | 1 client in 20 bursts at 5x the limit, the rest steady at 1/4 | 0.9% | 0.115% | 160 | 70 |
//! | every client bursts at 5x the limit | 20.4% | 2.808% | 3,663 | 1,953 |
//!
//! On the all-bursty trace a fixed window differs about twice as often (5.7%). Cloudflare
//! reports 0.003% on real traffic, where nearly every client is far below its limit. Whatever
//! the trace, the counter admits at most `count` per aligned window, so at most `2 * count` in
//! any span of one window.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use limiter_core::{Limit, ManualClock};
//! use limiter_sliding_window::SlidingWindow;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let clock = ManualClock::new();
//! let window = SlidingWindow::with_clock(Limit::per_second(4), clock.clone())?;
//! assert!(window.check_n(4)?.is_allowed());
//!
//! // Half way through the next second, half of the full previous window still counts.
//! clock.advance(Duration::from_millis(1_500));
//! let d = window.check_n(2)?;
//! assert!(d.is_allowed());
//! assert_eq!(d.remaining(), 0);
//! assert_eq!(window.check()?.retry_after(), Duration::from_millis(250));
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(clippy::unwrap_used)]

mod counter;
mod layout;

pub use counter::{FixedCounter, SlidingCounter, WindowCounter};
pub use limiter_core::{
    Clock, Decision, DecisionError, DefaultClock, Limit, LimitError, Limiter, ManualClock,
    MonotonicClock,
};

/// One sliding-window counter: see [`DirectLimiter`](limiter_core::DirectLimiter).
pub type SlidingWindow<C = DefaultClock> = limiter_core::DirectLimiter<SlidingCounter, C>;

/// A sliding-window counter per key: see [`KeyedLimiter`](limiter_store::KeyedLimiter).
pub type KeyedSlidingWindow<K, C = DefaultClock, St = limiter_store::ShardedStore<K>> =
    limiter_store::KeyedLimiter<SlidingCounter, K, C, St>;

/// One fixed-window counter: see [`DirectLimiter`](limiter_core::DirectLimiter).
pub type FixedWindow<C = DefaultClock> = limiter_core::DirectLimiter<FixedCounter, C>;

/// A fixed-window counter per key: see [`KeyedLimiter`](limiter_store::KeyedLimiter).
pub type KeyedFixedWindow<K, C = DefaultClock, St = limiter_store::ShardedStore<K>> =
    limiter_store::KeyedLimiter<FixedCounter, K, C, St>;
