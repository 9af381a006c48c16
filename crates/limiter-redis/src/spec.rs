//! [`RedisLimit`]: one limit as the Lua script decides it, checked once when a limiter is built.
//!
//! Redis time is whole microseconds since the Unix epoch (its `TIME` resolution), so each limit
//! is decided by the same Rust algorithm built on the limit counted in microseconds: the "ns"
//! of the algorithm are microseconds here. Every quantity the script handles as a plain Lua
//! number (a double) stays below 2^53: the token bucket's depth is kept below 2^51 ticks (a
//! debt reaches twice it), and the window counters' products are computed in pieces by the
//! script.
#![deny(clippy::arithmetic_side_effects)]

use limiter_core::{Accuracy, Algorithm, DecisionError, Limit, LimitError, Step};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_token_bucket::Gcra;

use crate::script::call::{self, Call, GroupKind, Mode, WIRE};

/// Which algorithm a Redis limit runs: the same name in process (limiter-stack's `Kind`);
/// each is the same pure transition as its in-process counterpart, reimplemented in Lua.
pub use limiter_stack::Kind;

/// Every plain number in the script stays below this (2^52), and so does Redis time in µs
/// until 2112.
pub(crate) const LUA_EXACT: u64 = 1 << 52;

/// The script's code for each algorithm.
fn code(kind: Kind) -> u8 {
    match kind {
        Kind::TokenBucket => 1,
        Kind::SlidingWindow => 2,
        Kind::FixedWindow => 3,
    }
}

/// A limit the Redis script decides: the algorithm, the limit, and the parameters the script
/// receives, with the Rust algorithm the script reimplements (its twin, tested against it).
#[derive(Clone, Debug)]
pub struct RedisLimit {
    kind: Kind,
    limit: Limit,
    micros: Limit,
    twin: Twin,
    /// The script's four parameters (see `decide.lua`).
    params: [u64; 4],
    /// The algorithm's code and the parameters as the script reads them, encoded once. The
    /// script stores them beside each state it writes, so a call under a changed limit knows
    /// to rescale the state.
    wire: [u8; WIRE],
}

/// The Rust algorithm a Redis limit's script reimplements, built on the limit in microseconds.
#[derive(Clone, Debug)]
enum Twin {
    TokenBucket(Gcra),
    SlidingWindow(SlidingCounter),
    FixedWindow(FixedCounter),
}

impl RedisLimit {
    /// Checks that `limit` can be decided on Redis by `kind`, as in process.
    ///
    /// Every limit in the supported range is accepted (counts and bursts from 1 to `u32::MAX`,
    /// periods from 1 µs to 366 days). Redis time is whole microseconds, so a period with a
    /// fraction of a microsecond is rounded up to the next one (slightly fewer units, never
    /// more); every quantity the script handles as a double stays below 2^53, which for the
    /// token bucket means a bucket depth below 2^51 ticks (deep buckets count in coarser ticks,
    /// conservatively, as [`Gcra`] documents). Only a burst or a count no state can hold is
    /// refused, in the algorithm's own words.
    pub fn new(kind: Kind, limit: Limit) -> Result<Self, LimitError> {
        limit.check()?;
        let period_us = limit.period_nanos().div_ceil(1_000);
        let micros = Limit::from_nanos(limit.count(), period_us).with_burst(limit.burst());
        let restate = |error: LimitError| match error {
            // The twin counts microseconds as its nanoseconds: restate the limit as given.
            LimitError::Unsupported { algorithm, reason } => LimitError::Unsupported {
                algorithm,
                reason: format!(
                    "{limit} cannot be decided on Redis: {}",
                    reason
                        .split_once(": ")
                        .map_or(reason.as_str(), |(_, why)| why)
                ),
            },
            other => other,
        };
        let (twin, params) = match kind {
            Kind::TokenBucket => {
                // A debt reaches twice the depth: both stay below 2^52.
                let gcra = Gcra::with_max_depth(micros, LUA_EXACT / 2 - 1).map_err(restate)?;
                let (q, shift, p, tau) = gcra.ticks();
                (Twin::TokenBucket(gcra), [q, p, tau, u64::from(shift)])
            }
            Kind::SlidingWindow => {
                let counter =
                    SlidingCounter::for_expiring_store(micros, LUA_EXACT).map_err(restate)?;
                let params = window_params(micros, counter.layout());
                (Twin::SlidingWindow(counter), params)
            }
            Kind::FixedWindow => {
                let counter =
                    FixedCounter::for_expiring_store(micros, LUA_EXACT).map_err(restate)?;
                let params = window_params(micros, counter.layout());
                (Twin::FixedWindow(counter), params)
            }
        };
        let mut wire = [0; WIRE];
        let fields = [u64::from(code(kind))].into_iter().chain(params);
        for (slot, field) in wire.chunks_exact_mut(8).zip(fields) {
            slot.copy_from_slice(&call::number(field));
        }
        Ok(Self {
            kind,
            limit,
            micros,
            twin,
            params,
            wire,
        })
    }

    /// Whether the script can decide `state` at `now_us` microseconds since the Unix epoch.
    /// Only a token bucket whose clock went back can't: its debt grows by the time gone back,
    /// and once it reaches 2^52 ticks (what the script's doubles count exactly) the script
    /// refuses the call, naming the key, and the limiter's failure policy answers, until the
    /// clock catches up. The twin would decide it; the differential tests hold the script to
    /// refusing exactly then.
    pub fn decidable_at(&self, state: u64, now_us: u64) -> bool {
        if !matches!(self.twin, Twin::TokenBucket(_)) {
            return true;
        }
        let [q, _, _, shift] = self.params;
        // The tick the reading falls in, as the script counts it (a state is the tat in ticks).
        let tick = if shift > 0 {
            u128::from(now_us) >> shift
        } else {
            u128::from(now_us).saturating_mul(u128::from(q))
        };
        u128::from(state).saturating_sub(tick) < u128::from(LUA_EXACT)
    }

    /// The script's twin decision: the Rust algorithm on `state` at `now_us` microseconds since
    /// the Unix epoch, with every "ns" of the decision a microsecond. The script makes exactly
    /// this decision and writes exactly this state; the differential tests hold it to that.
    pub fn decide(&self, state: u64, cost: u64, now_us: u64) -> Result<Step, DecisionError> {
        match &self.twin {
            Twin::TokenBucket(a) => a.decide(state, cost, now_us),
            Twin::SlidingWindow(a) => a.decide(state, cost, now_us),
            Twin::FixedWindow(a) => a.decide(state, cost, now_us),
        }
    }

    /// The script's twin record: the Rust algorithm records `cost` units of usage on `state`
    /// at `now_us` (see [`Algorithm::record`]). The script makes exactly this decision and
    /// writes exactly this state.
    pub fn record(&self, state: u64, cost: u64, now_us: u64) -> Result<Step, DecisionError> {
        match &self.twin {
            Twin::TokenBucket(a) => a.record(state, cost, now_us),
            Twin::SlidingWindow(a) => a.record(state, cost, now_us),
            Twin::FixedWindow(a) => a.record(state, cost, now_us),
        }
    }

    /// The script's twin refund: the Rust algorithm gives `units` back to `state`, which a
    /// grant at `granted_us` took, at `now_us` (microseconds since the Unix epoch); `None`
    /// when nothing comes back. The script writes exactly this state.
    pub fn refund(&self, state: u64, units: u64, granted_us: u64, now_us: u64) -> Option<u64> {
        match &self.twin {
            Twin::TokenBucket(a) => a.refund(state, units, granted_us, now_us),
            Twin::SlidingWindow(a) => a.refund(state, units, granted_us, now_us),
            Twin::FixedWindow(a) => a.refund(state, units, granted_us, now_us),
        }
    }

    /// The script's twin rescale: `state`, written under the limit `from`, in this limit's
    /// terms at `now_us`: the part of `from`'s capacity in use then, as the same fraction of
    /// this limit's, rounded up (the Rust algorithms' `usage` and `with_usage`). The script does
    /// exactly this when a call names a key under a limit other than the one that wrote it.
    pub fn rescale(
        &self,
        from: &RedisLimit,
        state: u64,
        now_us: u64,
    ) -> Result<u64, DecisionError> {
        let usage = match &from.twin {
            Twin::TokenBucket(a) => a.usage(state, now_us),
            Twin::SlidingWindow(a) => a.usage(state, now_us),
            Twin::FixedWindow(a) => a.usage(state, now_us),
        };
        match &self.twin {
            Twin::TokenBucket(a) => a.with_usage(usage, now_us),
            Twin::SlidingWindow(a) => a.with_usage(usage, now_us),
            Twin::FixedWindow(a) => a.with_usage(usage, now_us),
        }
    }

    /// How far below the limit the script may admit (see [`Accuracy`]): the twin's own, which
    /// also counts a period rounded up to whole microseconds.
    pub fn accuracy(&self) -> Accuracy {
        let twin = match &self.twin {
            Twin::TokenBucket(a) => a.accuracy(),
            Twin::SlidingWindow(a) => a.accuracy(),
            Twin::FixedWindow(a) => a.accuracy(),
        };
        let (asked, counted) = (
            u128::from(self.limit.period_nanos()),
            u128::from(self.micros.period_nanos()).saturating_mul(1_000),
        );
        if asked == counted {
            return twin;
        }
        // Both shortfalls together, rounded up: 1 - (1 - a)(asked / counted).
        let billion = 1_000_000_000u128;
        // The shortfall is at most a billion parts, and periods are below 2^64: no overflow.
        let kept = billion.saturating_sub(u128::from(twin.shortfall_per_billion()));
        let whole = counted.saturating_mul(billion);
        let rounded =
            Accuracy::from_shortfall(whole.saturating_sub(asked.saturating_mul(kept)), whole);
        match twin.horizon_nanos() {
            Some(horizon) => rounded.with_horizon(horizon.saturating_mul(1_000)),
            None => rounded,
        }
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

    /// The algorithm's code and the four parameters the script receives for this limit (see
    /// [`SCRIPT`](crate::SCRIPT)). Two limits the script decides alike have the same fields.
    pub fn script_fields(&self) -> (u8, [u64; 4]) {
        (code(self.kind), self.params)
    }

    /// The algorithm's code and parameters as the script reads them (five doubles).
    pub(crate) fn wire(&self) -> &[u8; WIRE] {
        &self.wire
    }

    /// The script's argument (`ARGV[1]`) for one call of `cost` units on this limit alone,
    /// its state at `KEYS[1]`, at the server's time: for calling [`SCRIPT`](crate::SCRIPT)
    /// directly, as the benchmarks do.
    pub fn call_argument(&self, cost: u64) -> Vec<u8> {
        let mut call = Call::new(Mode::Independent);
        call.group(cost, GroupKind::Enforced, 1);
        call.limit(1, &self.wire);
        call.finish(None, 0)
    }

    /// The state a key holds (`GET`'s bytes) as the twin's state word, when this limit wrote
    /// it; `None` for a state another limit wrote or bytes that are no state. A state written
    /// by an earlier version of the script (a decimal word, untagged or tagged with this
    /// limit's fields) is read as well. For tests and inspection: the differential tests hold
    /// the script's writes to the twin's this way.
    pub fn twin_state(&self, stored: &[u8]) -> Option<u64> {
        if stored.len() == 64 {
            let mut numbers = stored
                .chunks_exact(8)
                .map(|c| f64::from_be_bytes(c.try_into().unwrap_or_default()));
            let state: Vec<u64> = numbers.by_ref().take(3).map(exact).collect::<Option<_>>()?;
            let written_by: Vec<u8> = stored.get(24..)?.to_vec();
            if written_by != self.wire {
                return None;
            }
            return self.word_of(state[0], state[1], state[2]);
        }
        let text = std::str::from_utf8(stored).ok()?;
        let (word, tag) = text.split_once(' ').unwrap_or((text, ""));
        let (code, [a, b, c, d]) = self.script_fields();
        if !tag.is_empty() && tag != format!("{code}:{a}:{b}:{c}:{d}") {
            return None;
        }
        word.parse().ok()
    }

    /// The twin's word for the script's state (w1, w2, w3): a bucket's tat, `tick(at) +
    /// debt`; a window counter's index and counts packed by its layout.
    fn word_of(&self, w1: u64, w2: u64, w3: u64) -> Option<u64> {
        let [a, _, c, d] = self.params;
        match self.kind {
            Kind::TokenBucket => {
                let tick = if d > 0 { w1 >> d } else { w1.checked_mul(a)? };
                tick.checked_add(w2)
            }
            Kind::SlidingWindow | Kind::FixedWindow => {
                let (current_bits, previous_bits, granule_bits) = (c % 64, (c / 64) % 64, c / 4096);
                let (index_bits, wrapping) = (d % 64, d >= 64);
                let index = if wrapping { w1 & mask(index_bits) } else { w1 };
                let previous = w2 >> granule_bits;
                Some(
                    index.checked_shl(
                        u32::try_from(current_bits.checked_add(previous_bits)?).ok()?,
                    )? | previous.checked_shl(u32::try_from(current_bits).ok()?)?
                        | w3,
                )
            }
        }
    }
}

/// A double the script wrote, as the whole number it holds.
fn exact(value: f64) -> Option<u64> {
    // Checked whole and within range first.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    (value >= 0.0 && value.fract() == 0.0 && value < 18_446_744_073_709_551_616.0)
        .then_some(value as u64)
}

/// The low `bits` bits set.
fn mask(bits: u64) -> u64 {
    u64::MAX
        .checked_shr(64u32.saturating_sub(u32::try_from(bits).unwrap_or(64)))
        .unwrap_or(0)
}

/// A window counter's script parameters: count, window in µs, then its layout packed as
/// `current bits + 64 * previous bits + 4096 * granule bits` and `index bits + 64 * wrapping`.
fn window_params(micros: Limit, layout: [u32; 5]) -> [u64; 4] {
    // Every field is below 64, so the packing is exact.
    let [current, previous, granule, index, wrapping] = layout.map(u64::from);
    [
        micros.count(),
        micros.period_nanos(),
        current | previous << 6 | granule << 12,
        index | wrapping << 6,
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::time::Duration;

    #[test]
    fn every_limit_of_the_supported_range_is_accepted_on_redis() {
        let max = u64::from(u32::MAX);
        for kind in [Kind::TokenBucket, Kind::SlidingWindow, Kind::FixedWindow] {
            for count in [1, 1009, 1_000_000, max] {
                for period in [
                    Duration::from_micros(1),
                    Duration::from_secs(1),
                    Duration::from_secs(60),
                    Duration::from_secs(366 * 86_400),
                ] {
                    let limit = Limit::new(count, period);
                    let spec = RedisLimit::new(kind, limit)
                        .unwrap_or_else(|e| panic!("{kind} {limit}: {e}"));
                    assert_eq!(spec.limit(), limit);
                    if kind == Kind::TokenBucket {
                        let deep = limit.with_burst(max);
                        assert!(RedisLimit::new(kind, deep).is_ok(), "{deep}");
                    }
                }
            }
        }
        // A sliding window of 10^6 per second and 10^8 per minute: exact and not rounded.
        for limit in [Limit::per_second(1_000_000), Limit::per_second(10_000)] {
            let spec = RedisLimit::new(Kind::SlidingWindow, limit).unwrap();
            assert_eq!(spec.accuracy().shortfall_per_billion(), 0, "{limit}");
        }
        let per_minute =
            RedisLimit::new(Kind::SlidingWindow, Limit::per_minute(100_000_000)).unwrap();
        // The previous count's granule (it also holds a window in debt): 8,191 in 10^8.
        assert!(
            per_minute.accuracy().shortfall_per_billion() <= 100_000,
            "{}",
            per_minute.accuracy()
        );
    }

    #[test]
    fn a_period_with_a_fraction_of_a_microsecond_is_rounded_up_and_says_so() {
        let limit = Limit::from_nanos(10, 1_000_500);
        let spec = RedisLimit::new(Kind::TokenBucket, limit).unwrap();
        assert_eq!(spec.in_micros().period_nanos(), 1_001);
        assert!(!spec.accuracy().is_exact());
        // 1000.5 us counted as 1001 us: 0.05% fewer.
        assert_eq!(spec.accuracy().shortfall_per_billion(), 499_501);
    }

    #[test]
    fn a_burst_no_bucket_can_hold_is_refused_in_the_users_terms() {
        let limit = Limit::per_day(1).with_burst(u64::MAX);
        let err = RedisLimit::new(Kind::TokenBucket, limit)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot be decided on Redis") && err.contains("burst"),
            "{err}"
        );
        assert!(err.contains("1 per 86400s"), "{err}");
    }
}
