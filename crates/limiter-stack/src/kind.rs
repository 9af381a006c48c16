//! [`Kind`]: the run-time name of a built-in algorithm, for limits chosen by configuration
//! rather than by type: `Layer::limit(Kind::TokenBucket, limit)` in process, the same on a
//! Redis layer (limiter-redis re-exports it), and limiterd's `algorithm = "token_bucket"`.
//!
//! It lives here because a stack is where algorithms are chosen at run time: a layer holds its
//! limits as trait objects, so naming the algorithm by value costs nothing, and this crate is
//! the lowest that both the Redis backend and the service build on. The type-level form
//! (`TokenBucket::new(limit)`, `Layer::limit_with::<A>(limit)` for an algorithm of your own)
//! stays for direct use.

use core::fmt;

use limiter_core::{Algorithm, Limit, LimitError};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_token_bucket::Gcra;

/// A built-in algorithm, named at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The token bucket (GCRA, `limiter-token-bucket`): a steady rate with bursts up to the
    /// burst size.
    TokenBucket,
    /// The sliding-window counter (`limiter-sliding-window`): at most `count` per period,
    /// weighing the previous window by its overlap.
    SlidingWindow,
    /// The fixed-window counter (`limiter-sliding-window`): at most `count` per aligned window.
    FixedWindow,
}

impl Kind {
    /// Every built-in algorithm.
    pub const ALL: [Kind; 3] = [Kind::TokenBucket, Kind::SlidingWindow, Kind::FixedWindow];

    /// The algorithm's name, as its Rust implementation gives it ("token bucket", ...).
    pub fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => Gcra::NAME,
            Kind::SlidingWindow => SlidingCounter::NAME,
            Kind::FixedWindow => FixedCounter::NAME,
        }
    }

    /// Whether this algorithm accepts `limit`, or why not (the error a stack's `build()`
    /// would report for it).
    pub fn check(self, limit: Limit) -> Result<(), LimitError> {
        match self {
            Kind::TokenBucket => Gcra::new(limit).map(drop),
            Kind::SlidingWindow => SlidingCounter::new(limit).map(drop),
            Kind::FixedWindow => FixedCounter::new(limit).map(drop),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
