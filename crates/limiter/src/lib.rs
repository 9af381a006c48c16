//! Rate limiting in one dependency: the lock-free token bucket and window counters, per-key
//! stores bounded in memory, transactional stacks of limits; the tower middleware (feature
//! `tower`, or `axum`) and the Redis backend for a fleet (feature `redis`).
//!
//! This crate re-exports the workspace's crates, so every type here is the one those crates
//! document: the algorithms and limiters at the top level, and one module per part. Its one
//! module of its own, `wait` (feature `tokio`), waits until a call is admitted.
//!
//! | path | crate | what |
//! | --- | --- | --- |
//! | [`Limit`], [`Decision`], [`Limiter`], errors, [`DefaultClock`], [`ManualClock`] | `limiter-core` | the vocabulary |
//! | [`clock`] | `limiter-core` | every clock |
//! | [`TokenBucket`], [`KeyedTokenBucket`] | `limiter-token-bucket` | the token bucket |
//! | [`SlidingWindow`], [`FixedWindow`], keyed forms | `limiter-sliding-window` | window counters |
//! | [`store`] | `limiter-store` | key stores: sharded (default), bounded |
//! | [`concurrency`] | `limiter-concurrency` | requests in flight per key |
//! | `calendar` (feature `calendar`) | `limiter-calendar` | quotas per day, week, month, year in a time zone |
//! | [`algorithm`] | core and the algorithm crates | for implementers: transitions by type, the state word, `DirectLimiter` and `KeyedLimiter` |
//! | [`stack`] | `limiter-stack` | several limits decided all or nothing |
//! | `tower` (feature `tower`) | `limiter-tower` | the HTTP/gRPC middleware |
//! | `redis` (feature `redis`) | `limiter-redis` | the same limits on Redis |
//! | `wait` (feature `tokio`) | this crate | `until_ready`: wait until a call is admitted |
//!
//! # Example
//!
//! ```
//! use limiter::algorithm::Algorithm;
//! use limiter::{KeyedTokenBucket, Limit, ManualClock, TokenBucket};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // 1009 per minute, copied from a pricing page: accepted, and counted exactly or slightly
//! // under, never over (`accuracy` says which).
//! let limit = Limit::per_minute(1009);
//! let bucket = TokenBucket::with_clock(limit, ManualClock::new())?;
//! assert!(bucket.check()?.is_allowed());
//! println!("{}", bucket.algorithm().accuracy());
//!
//! // Per key, on the default clock and store.
//! let per_key = KeyedTokenBucket::<u64>::new(Limit::per_second(10))?;
//! assert!(per_key.check_key(&7)?.is_allowed());
//! # Ok(()) }
//! ```

pub use limiter_core::{
    Clock, Decision, DecisionError, DefaultClock, Limit, LimitError, Limiter, ManualClock, Paced,
};
pub use limiter_sliding_window::{
    FixedWindow, KeyedFixedWindow, KeyedSlidingWindow, SlidingWindow,
};
pub use limiter_stack::Kind;
pub use limiter_token_bucket::{KeyedTokenBucket, TokenBucket};

/// For implementers of a new algorithm (or a new store of states): the pure transitions of
/// the built-in ones by type, the state word's compare-and-swap, and what a transition returns.
/// A user choosing among the built-in algorithms needs none of it ([`Kind`], the limiters).
pub mod algorithm {
    pub use limiter_core::{
        Accuracy, Algorithm, DirectLimiter, MIN_CLOCK_RANGE, Recording, StateCell, Step, Usage,
        check_clock,
    };
    pub use limiter_sliding_window::{FixedCounter, SlidingCounter, WindowCounter};
    pub use limiter_store::KeyedLimiter;
    pub use limiter_token_bucket::Gcra;
}

/// Quotas by the calendar: a day, a week from Monday, a month or a year in UTC or an IANA time
/// zone (`limiter-calendar`, feature `calendar`).
#[cfg(feature = "calendar")]
pub mod calendar {
    pub use limiter_calendar::*;
}

/// Clocks: the default (the time-stamp counter where it can be read, else the OS's monotonic
/// clock), the OS's own, a coarse one, and [`ManualClock`] for tests.
pub mod clock {
    pub use limiter_core::{
        Clock, ClockSource, CoarseClock, DefaultClock, ManualClock, MonotonicClock, TscClock,
        unix_origin,
    };
}

/// Concurrency limits: at most `count` permits held at once per key, each released when its
/// guard is dropped (`limiter-concurrency`).
pub mod concurrency {
    pub use limiter_concurrency::{
        Admission, KeyedConcurrency, OwnedPermit, Permit, PermitStack, Refused,
    };
}

/// Key stores: where a keyed limiter keeps one state word per key (`limiter-store`).
pub mod store {
    pub use limiter_store::*;
}

/// Stacks: several limits, per key or global, decided at one instant and all or nothing
/// (`limiter-stack`).
pub mod stack {
    pub use limiter_stack::*;
}

/// The tower middleware for axum, hyper and tonic (`limiter-tower`).
#[cfg(feature = "tower")]
pub mod tower {
    pub use limiter_tower::*;
}

/// The same limits and stacks decided on Redis, for a fleet (`limiter-redis`).
#[cfg(feature = "redis")]
pub mod redis {
    pub use limiter_redis::*;
}

/// The Rust examples of README.md and of every guide in docs/, compiled (and, but for the Redis
/// and server ones, run) as doctests so they stay true; they import this crate alone (and axum,
/// tokio). `cargo xtask lint` refuses a guide with Rust examples that is not listed here.
#[cfg(all(doctest, feature = "axum", feature = "redis", feature = "calendar"))]
mod guides {
    #[doc = include_str!("../../../README.md")]
    struct Readme;
    #[doc = include_str!("../../../docs/library.md")]
    struct Library;
    #[doc = include_str!("../../../docs/stacks.md")]
    struct Stacks;
    #[doc = include_str!("../../../docs/redis.md")]
    struct Redis;
    #[doc = include_str!("../../../docs/middleware.md")]
    struct Middleware;
    #[doc = include_str!("../../../docs/concurrency.md")]
    struct Concurrency;
    #[doc = include_str!("../../../docs/calendar.md")]
    struct Calendar;
}

#[cfg(feature = "tokio")]
pub mod wait;
