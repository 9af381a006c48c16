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

impl Kind {
    /// The name configuration files and APIs give the algorithm (`token_bucket`,
    /// `sliding_window`, `fixed_window`): what [`Display`](fmt::Display) prints and
    /// [`FromStr`](core::str::FromStr) reads.
    pub fn id(self) -> &'static str {
        match self {
            Kind::TokenBucket => "token_bucket",
            Kind::SlidingWindow => "sliding_window",
            Kind::FixedWindow => "fixed_window",
        }
    }
}

/// Prints the algorithm's [`id`](Kind::id), which [`FromStr`](core::str::FromStr) reads back.
impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// A name that is no algorithm's [`id`](Kind::id).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{given}` is not an algorithm: use token_bucket, sliding_window or fixed_window")]
pub struct UnknownKind {
    /// The name given.
    pub given: String,
}

/// Reads an algorithm's [`id`](Kind::id) (`"token_bucket"`); anything else is an
/// [`UnknownKind`] naming the three.
///
/// ```
/// use limiter_stack::Kind;
///
/// let kind: Kind = "sliding_window".parse()?;
/// assert_eq!(kind, Kind::SlidingWindow);
/// assert_eq!(kind.to_string(), "sliding_window");
/// assert!("leaky_bucket".parse::<Kind>().unwrap_err().to_string().contains("token_bucket"));
/// # Ok::<(), limiter_stack::UnknownKind>(())
/// ```
impl core::str::FromStr for Kind {
    type Err = UnknownKind;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Kind::ALL
            .into_iter()
            .find(|kind| kind.id() == text)
            .ok_or_else(|| UnknownKind {
                given: text.to_owned(),
            })
    }
}
