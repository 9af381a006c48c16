//! [`RedisLimit`]: one limit as the Lua script decides it, checked once when a limiter is built.
//!
//! Redis time is whole microseconds since the Unix epoch (its `TIME` resolution), so each limit
//! is decided by the same Rust algorithm built on the limit counted in microseconds: the "ns"
//! of the algorithm are microseconds here. Every quantity the script handles as a plain Lua
//! number (a double) must stay below 2^52; this module refuses limits that would not.
#![deny(clippy::arithmetic_side_effects)]

use core::fmt;
use core::time::Duration;
use limiter_core::{Algorithm, Limit, LimitError, MIN_CLOCK_RANGE};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_token_bucket::Gcra;

/// Every plain number in the script stays below this (2^52).
pub(crate) const LUA_EXACT: u64 = 1 << 52;

/// Which algorithm a Redis limit runs. Each is the same pure transition as its in-process
/// counterpart, reimplemented in Lua.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// The token bucket (GCRA) of `limiter-token-bucket`.
    TokenBucket,
    /// The sliding-window counter of `limiter-sliding-window`.
    SlidingWindow,
    /// The fixed-window counter of `limiter-sliding-window`.
    FixedWindow,
}

impl Kind {
    /// The algorithm's name, as its Rust implementation gives it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::TokenBucket => Gcra::NAME,
            Kind::SlidingWindow => SlidingCounter::NAME,
            Kind::FixedWindow => FixedCounter::NAME,
        }
    }

    /// Adds `limit` to an in-process stack `layer`, decided by this kind's Rust algorithm
    /// (the script's twin): for a local fallback, or any stack configured by kind.
    pub fn add_to<R, K>(
        self,
        layer: limiter_stack::Layer<R, K>,
        limit: Limit,
    ) -> Result<limiter_stack::Layer<R, K>, limiter_stack::BuildError> {
        match self {
            Kind::TokenBucket => layer.limit::<Gcra>(limit),
            Kind::SlidingWindow => layer.limit::<SlidingCounter>(limit),
            Kind::FixedWindow => layer.limit::<FixedCounter>(limit),
        }
    }

    /// The script's code for the algorithm.
    fn code(self) -> u8 {
        match self {
            Kind::TokenBucket => 1,
            Kind::SlidingWindow => 2,
            Kind::FixedWindow => 3,
        }
    }

    fn letter(self) -> char {
        match self {
            Kind::TokenBucket => 't',
            Kind::SlidingWindow => 's',
            Kind::FixedWindow => 'f',
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A limit the Redis script can decide exactly: the algorithm, the limit, and the parameters the
/// script receives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisLimit {
    kind: Kind,
    limit: Limit,
    micros: Limit,
    /// The script's four parameters (see `decide.lua`).
    params: [u64; 4],
    /// Names the limit inside Redis keys, so a changed limit never reads another's state.
    fingerprint: String,
}

impl RedisLimit {
    /// Checks that `limit` can be decided on Redis by `kind`, exactly as in process.
    ///
    /// Beyond the algorithm's own checks, Redis needs: a period of whole microseconds (its
    /// clock's resolution); at most one unit per microsecond; for the token bucket, a burst
    /// whose refill time is below 2^52 ticks; for the window counters, `count` times the period
    /// in microseconds below 2^52. The error names the largest count that would work.
    pub fn new(kind: Kind, limit: Limit) -> Result<Self, LimitError> {
        Self::derive(kind, limit).map_err(|reason| {
            let hint = nearest_count(kind, limit)
                .map(|count| {
                    format!(
                        "; {count} per {:?} is the largest count below it that works",
                        limit.period()
                    )
                })
                .unwrap_or_default();
            let shorter = same_rate_in_shorter_windows(kind, limit)
                .map(|shorter| format!(", and {shorter} the same rate in shorter windows"))
                .unwrap_or_default();
            LimitError::Unsupported {
                algorithm: kind.name(),
                reason: format!("{limit} cannot be decided on Redis: {reason}{hint}{shorter}"),
            }
        })
    }

    fn derive(kind: Kind, limit: Limit) -> Result<Self, String> {
        let period_ns = limit.period_nanos();
        if !period_ns.is_multiple_of(1_000) {
            return Err(format!(
                "its period {:?} is not a whole number of microseconds, the resolution of Redis time; \
                 round the period to whole microseconds",
                limit.period()
            ));
        }
        let period_us = period_ns / 1_000;
        let micros = Limit::from_nanos(limit.count(), period_us)
            .and_then(|l| l.with_burst(limit.burst()))
            .map_err(|_| {
                "it admits more than one unit per microsecond, finer than Redis time; count in \
                 larger units or use a longer period"
                    .to_owned()
            })?;
        let too_wide = |what: &str| {
            format!(
                "{what} reaches 2^52, beyond what the script computes exactly; use a shorter \
                 period or a smaller count"
            )
        };
        let params = match kind {
            Kind::TokenBucket => {
                let gcra = Gcra::new(micros).map_err(|_| range_reason(kind))?;
                let (p, q) = gcra.unit_nanos();
                let tau = limit.burst().checked_mul(p).filter(|&t| t < LUA_EXACT);
                let Some(tau) = tau else {
                    return Err(too_wide("the time to refill the whole burst, in ticks"));
                };
                [q, p, tau, limit.burst()]
            }
            Kind::SlidingWindow | Kind::FixedWindow => {
                if kind == Kind::SlidingWindow {
                    SlidingCounter::new(micros).map_err(|_| range_reason(kind))?;
                } else {
                    FixedCounter::new(micros).map_err(|_| range_reason(kind))?;
                }
                let count = limit.count();
                if count.checked_mul(period_us).is_none_or(|w| w >= LUA_EXACT) {
                    return Err(too_wide("count × window in microseconds"));
                }
                let bits = u64::from(u64::BITS.saturating_sub(count.leading_zeros()));
                [count, period_us, bits, 0]
            }
        };
        let fingerprint = if limit.burst() == limit.count() {
            format!("{}{}/{}us", kind.letter(), limit.count(), period_us)
        } else {
            format!(
                "{}{}/{}us/{}",
                kind.letter(),
                limit.count(),
                period_us,
                limit.burst()
            )
        };
        Ok(Self {
            kind,
            limit,
            micros,
            params,
            fingerprint,
        })
    }

    /// The algorithm.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The limit, as given.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The limit counted in microseconds: the Rust algorithm built on it, with every "ns" read as
    /// a microsecond, makes exactly the script's decisions. The differential tests rely on it.
    pub fn in_micros(&self) -> Limit {
        self.micros
    }

    /// The most units one call may ask for.
    pub fn burst(&self) -> u64 {
        self.limit.burst()
    }

    /// The part of Redis key names that identifies the limit, e.g. `t10/1000000us`.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// The algorithm's code and the four parameters the script receives for this limit (see
    /// [`SCRIPT`](crate::SCRIPT)), for calling the script directly, as the benchmarks do.
    pub fn script_fields(&self) -> (u8, [u64; 4]) {
        (self.kind.code(), self.params)
    }
}

/// Why the algorithm refused the limit counted in microseconds. Its own message would show
/// microseconds as nanoseconds, so the reason is restated here.
fn range_reason(kind: Kind) -> String {
    let years = MIN_CLOCK_RANGE / 1_000_000 / 31_557_600;
    let fix = match kind {
        Kind::TokenBucket => "use a count that divides the period into fewer fractional parts",
        // A longer window frees a bit of window number per doubling, but a count twice as
        // large needs a bit more per count held: the same rate fits worse, not better.
        Kind::SlidingWindow | Kind::FixedWindow => {
            "use a smaller count, or the same rate in shorter windows, which hold more per second"
        }
    };
    format!(
        "counted in microseconds since the Unix epoch, its state cannot cover the 2^56 us \
         (about {years} years) of clock every limit must; {fix}"
    )
}

/// For a window counter, `limit`'s rate (rounded down, never above it) in the longest window
/// a half, a fifth, a tenth, a twentieth, ... as long (so a round period stays round), in
/// whole microseconds, that `kind` accepts on Redis.
fn same_rate_in_shorter_windows(kind: Kind, limit: Limit) -> Option<Limit> {
    if kind == Kind::TokenBucket || limit.burst() != limit.count() {
        return None;
    }
    let period_us = limit.period_nanos() / 1_000;
    let divisors = (0..u64::MAX.ilog10())
        .flat_map(|power| [2_u64, 5, 10].map(|m| 10_u64.checked_pow(power)?.checked_mul(m)))
        .map_while(|divisor| divisor);
    for divisor in divisors {
        let shorter_us = period_us.checked_div(divisor).filter(|&us| us > 0)?;
        // count * shorter / period <= count, so it fits in a u64.
        let count = u128::from(limit.count())
            .checked_mul(u128::from(shorter_us))?
            .checked_div(u128::from(period_us))?;
        let count = u64::try_from(count).ok().filter(|&c| c > 0)?;
        let candidate = Limit::new(count, Duration::from_micros(shorter_us)).ok()?;
        if RedisLimit::derive(kind, candidate).is_ok() {
            return Some(candidate);
        }
    }
    None
}

/// The largest count below `limit`'s (same period) that `kind` accepts on Redis.
fn nearest_count(kind: Kind, limit: Limit) -> Option<u64> {
    let works = |count: u64| {
        Limit::new(count, limit.period())
            .and_then(|l| {
                if limit.burst() == limit.count() {
                    Ok(l)
                } else {
                    l.with_burst(limit.burst().min(count))
                }
            })
            .is_ok_and(|l| RedisLimit::derive(kind, l).is_ok())
    };
    match kind {
        // Window counters accept every count below one that works: binary search.
        Kind::SlidingWindow | Kind::FixedWindow => {
            let (mut lo, mut hi) = (0_u64, limit.count());
            while hi.saturating_sub(lo) > 1 {
                let mid = lo.saturating_add(hi.saturating_sub(lo) / 2);
                if works(mid) { lo = mid } else { hi = mid }
            }
            (lo > 0 && works(lo)).then_some(lo)
        }
        Kind::TokenBucket => {
            const SEARCH: u64 = 4_096;
            let lowest = limit.count().saturating_sub(SEARCH).max(1);
            (lowest..limit.count()).rev().find(|&count| works(count))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliding_window_too_fine_for_redis_is_told_the_shorter_windows_that_fit() {
        // 100k per second needs 17 bits per count; a 1 s window leaves room for 13.
        let too_many = Limit::per_second(100_000).unwrap();
        let message = RedisLimit::new(Kind::SlidingWindow, too_many)
            .unwrap_err()
            .to_string();
        assert!(message.contains("shorter windows"), "{message}");
        // The same rate in longer windows fits worse, as the error no longer suggests.
        let longer = Limit::new(1_000_000, Duration::from_secs(10)).unwrap();
        assert!(RedisLimit::new(Kind::SlidingWindow, longer).is_err());
        // The suggested limit works and keeps the rate (rounded down).
        let suggested = message
            .split(", and ")
            .nth(1)
            .and_then(|rest| rest.strip_suffix(" the same rate in shorter windows"))
            .unwrap_or_else(|| panic!("no suggestion in: {message}"));
        let (count, period) = suggested.split_once(" per ").unwrap();
        let (count, period_ms) = (
            count.parse::<u64>().unwrap(),
            period.strip_suffix("ms").unwrap().parse::<u64>().unwrap(),
        );
        let limit = Limit::new(count, Duration::from_millis(period_ms)).unwrap();
        assert!(
            RedisLimit::new(Kind::SlidingWindow, limit).is_ok(),
            "{limit}"
        );
        assert!(
            count * 1_000 <= 100_000 * period_ms,
            "{limit} is faster than 100k/s"
        );
        assert!(
            count * 1_000 * 2 > 100_000 * period_ms,
            "{limit} lost half the rate"
        );
    }
}
