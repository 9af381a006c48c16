//! [`WindowCounter`]: the pure transition of the sliding-window and fixed-window counters.
#![deny(clippy::arithmetic_side_effects)]

use limiter_core::{
    Accuracy, Algorithm, Decision, DecisionError, Limit, LimitError, MIN_CLOCK_RANGE, Step, Usage,
};

use crate::layout::{Layout, MIN_WRAPPING_INDEX_BITS, Windows};

/// A window counter: at most `count` units per window of length `period`. Windows are numbered
/// `now / period` from the clock's epoch.
///
/// - **Sliding** (`SLIDING = true`, [`SlidingCounter`]): a call is admitted if the current
///   window's count plus the previous window's count, weighted by the fraction of the previous
///   window that still overlaps the sliding window ending now, leaves room for its cost. The
///   weighted count is rounded up, so rounding never favours the caller. This is the counter
///   Cloudflare and unkey use: two counts instead of a log of every request.
/// - **Fixed** (`SLIDING = false`, [`FixedCounter`]): only the current window counts, as in
///   envoy's rate-limit service.
///
/// # Bounds
///
/// Each aligned window admits at most `count`, so any span of `T` ns admits at most
/// `count * (floor(T / period) + 2)`: up to `2 * count` across a window boundary, for both
/// counters. The sliding counter approximates a sliding log (see the crate docs for how often
/// the two disagree); the fixed one does not try to.
///
/// # Debt
///
/// [`record`](Algorithm::record) adds the recorded cost to the current window's count whatever
/// it holds, so a window can be over its limit: it then denies every call until it ends, and a
/// sliding window weighs it into the next one as it weighs any count (a fixed window forgets it
/// when the window ends, as envoy's reference service counts). A window's count is kept up to
/// twice the limit's count ([`Usage::MAX_DEBT`]): usage recorded past that is not kept. The
/// bound above then counts recorded units with the admitted ones: in each aligned window, the
/// units admitted plus those recorded before the window's last admission are at most `count`.
///
/// # State and ranges
///
/// One `u64`: the window number, then the previous count (sliding only), then the current
/// count, each count in just the bits `2 * count` needs (a window in debt). The limit's burst
/// must equal its count (a window has no separate burst). Every count from 1 to `u32::MAX` in
/// every window from 1 ns to 584 years is accepted:
///
/// - Where the counts leave the window number room for [`MIN_CLOCK_RANGE`] ns of clock, both
///   counts are exact (every fixed window up to `u32::MAX` per 34 ms or longer; sliding windows
///   up to 131,071 per second, a million per minute).
/// - Past that, a sliding window keeps the previous window's count rounded up to a granule of
///   `2^g` units, so it can only weigh more: never more admitted, at most `2^g - 1` units fewer
///   per window ([`accuracy`](Algorithm::accuracy) states it; 31 units in 10^6 per second,
///   8,191 in 10^8 per minute).
/// - Where even that leaves too few bits (over 67 million per one-second window sliding or per
///   millisecond fixed), the window number wraps modulo `2^k` (`k >= 21`):
///   exact for a state written within the last `2^(k-1)` windows, the horizon that
///   [`accuracy`](Algorithm::accuracy) states. An older state (full, so normally dropped by its
///   store, though not by a direct limiter) may be read as recent, or as written up to a
///   horizon ahead, and then admits at most `count` until the clock reaches that window: it
///   only ever denies more. A clock that steps back by more than the horizon reads a state as
///   that old, and decides on it as on a fresh one.
///
/// Counts above `2^32 - 1` (sliding) or `2^42 - 1` (fixed) per window are refused.
///
/// Past its range ([`max_now_nanos`](Self::max_now_nanos)) a reading is refused with
/// [`DecisionError::ClockOutOfRange`].
///
/// # A clock that goes backwards
///
/// A reading before the state's own window is decided as at the start of that window: no time
/// has passed for the state, and the previous window weighs the most it can, so a backward step
/// never admits more. Waits include the time for the clock to catch up.
#[derive(Clone, Debug)]
pub struct WindowCounter<const SLIDING: bool> {
    limit: Limit,
    /// `count`: units per window.
    count: u64,
    /// `period`: the window length.
    window_ns: u64,
    layout: Layout,
    /// The last reading whose window number fits the layout.
    max_now_ns: u64,
}

/// The sliding-window counter.
pub type SlidingCounter = WindowCounter<true>;
/// The fixed-window counter.
pub type FixedCounter = WindowCounter<false>;

impl<const SLIDING: bool> WindowCounter<SLIDING> {
    /// The counter for `limit`, or why it cannot be represented.
    pub fn from_limit(limit: Limit) -> Result<Self, LimitError> {
        Self::build(limit, MIN_CLOCK_RANGE, false)
    }

    /// The counter for a store that drops every state once it is full, as Redis expires its
    /// keys, on a clock that must reach `min_range_ns` (Redis: `2^52` µs since the Unix epoch,
    /// the script's limit). No state there outlives the horizon of a wrapping window number, so
    /// one is preferred to rounding the previous count: a sliding window counts up to 2 million
    /// per window exactly.
    pub fn for_expiring_store(limit: Limit, min_range_ns: u64) -> Result<Self, LimitError> {
        Self::build(limit, min_range_ns, true)
    }

    fn build(limit: Limit, min_range_ns: u64, expiring: bool) -> Result<Self, LimitError> {
        limit.check()?;
        let unsupported = |reason: String| LimitError::Unsupported {
            algorithm: Self::NAME,
            reason,
        };
        if limit.burst() != limit.count() {
            return Err(unsupported(format!(
                "{limit}: a window counter admits `count` per window and has no separate burst; \
                 leave the burst unset, or use the token bucket for bursts"
            )));
        }
        let (count, window_ns) = (limit.count(), limit.period_nanos());
        let layout = Layout::choose(
            count,
            SLIDING,
            needed_index_bits(window_ns, min_range_ns),
            expiring,
        );
        if layout.is_wrapping() && layout.index_bits() < MIN_WRAPPING_INDEX_BITS {
            let most = if SLIDING {
                (1u64 << 32) - 1
            } else {
                (1u64 << 42) - 1
            };
            return Err(unsupported(format!(
                "{limit}: a {} counts at most {most} units per window; use a smaller count \
                 (in larger units), or the token bucket",
                Self::NAME
            )));
        }
        let max_now_ns = if layout.is_wrapping() {
            u64::MAX
        } else {
            last_reading(layout, window_ns)
        };
        debug_assert!(max_now_ns >= min_range_ns);
        Ok(Self {
            limit,
            count,
            window_ns,
            layout,
            max_now_ns,
        })
    }

    /// The last clock reading, in nanoseconds since the epoch, this limit can decide at.
    pub fn max_now_nanos(&self) -> u64 {
        self.max_now_ns
    }

    /// The state's layout as the Redis script receives it: bits of the current count, of the
    /// previous count, of its granule (kept in units of `2^g`, rounded up), of the window
    /// number, and 1 if the window number wraps (see the type's docs).
    pub fn layout(&self) -> [u32; 5] {
        self.layout.fields()
    }

    /// The window `stored` (as unpacked) stands for, seen from window `now`: for a wrapping
    /// layout, the nearest with the same low bits; an empty state is fresh, wherever its index.
    fn absolute(&self, stored: Windows, now: u64) -> u64 {
        if stored.current == 0 && stored.previous == 0 {
            return now.min(self.layout.absolute(stored.index, now));
        }
        self.layout.absolute(stored.index, now)
    }

    /// The window `now_ns` is in and the state as of its own (absolute) window.
    #[inline]
    fn locate(&self, state: u64, now_ns: u64) -> (u64, Windows) {
        let mut stored = self.layout.unpack(state);
        if self.layout.is_wrapping() {
            let window = now_ns.checked_div(self.window_ns).unwrap_or(0);
            stored.index = self.absolute(stored, window);
            (window, stored)
        } else {
            (self.window_of(now_ns, stored.index), stored)
        }
    }

    /// `state` as seen at `now_ns` (within range). A reading before the state's window: no time
    /// has passed for the state, so it is read at the start of its window (`stored.index *
    /// period` is at most the reading that wrote it).
    fn read(&self, state: u64, now_ns: u64) -> Reading {
        let (window, stored) = self.locate(state, now_ns);
        let (index, at) = if window < stored.index {
            (stored.index, stored.index.saturating_mul(self.window_ns))
        } else {
            (window, now_ns)
        };
        let w = self.roll(stored, index);
        let elapsed = at.saturating_sub(index.saturating_mul(self.window_ns));
        Reading {
            w,
            elapsed,
            lag: at.saturating_sub(now_ns),
            used: self.weighted(w.previous, elapsed).saturating_add(w.current),
        }
    }

    /// The window `now_ns` falls in, `now_ns / period`: found without dividing when it is the
    /// window `stored` (the state's own) or the next one, as it is for all but the first call
    /// of each window; a 64-bit division costs more than the rest of a decision.
    fn window_of(&self, now_ns: u64, stored: u64) -> u64 {
        let into = stored
            .checked_mul(self.window_ns)
            .and_then(|start| now_ns.checked_sub(start));
        match into {
            Some(into) if into < self.window_ns => stored,
            Some(into) if into.saturating_sub(self.window_ns) < self.window_ns => {
                stored.saturating_add(1)
            }
            _ => now_ns.checked_div(self.window_ns).unwrap_or(0),
        }
    }

    /// The counts as of window `index`, which is not before `stored.index`.
    fn roll(&self, stored: Windows, index: u64) -> Windows {
        match index.saturating_sub(stored.index) {
            0 => stored,
            1 if SLIDING => Windows {
                index,
                previous: self.layout.round_previous(stored.current),
                current: 0,
            },
            _ => Windows {
                index,
                previous: 0,
                current: 0,
            },
        }
    }

    /// The previous window's count weighted by its overlap with the sliding window, rounded up.
    fn weighted(&self, previous: u64, elapsed: u64) -> u64 {
        if !SLIDING || previous == 0 {
            return 0;
        }
        let overlap = self.window_ns.saturating_sub(elapsed);
        // In 64 bits whenever the product fits (counts below 2^32 in windows up to 4 s always
        // do): a 128-bit division is a library call, several times the cost.
        if let Some(product) = previous.checked_mul(overlap) {
            return product.div_ceil(self.window_ns);
        }
        let weighted = (u128::from(previous).saturating_mul(u128::from(overlap)))
            .div_ceil(u128::from(self.window_ns));
        u64::try_from(weighted).unwrap_or(u64::MAX)
    }

    /// From `elapsed` into window `w.index`, the wait until `cost` fits, if nothing else consumes.
    fn wait(&self, w: Windows, elapsed: u64, cost: u64) -> u64 {
        let window = u128::from(self.window_ns);
        // Later in this window, as the previous window's weight decays.
        if SLIDING && w.previous > 0 && w.current.saturating_add(cost) <= self.count {
            let allowance = u128::from(self.count.saturating_sub(w.current).saturating_sub(cost));
            // The weight fits `allowance` once at most `keep` ns of overlap are left.
            let keep = allowance
                .saturating_mul(window)
                .checked_div(u128::from(w.previous))
                .unwrap_or(0);
            if keep > 0 {
                let at = u64::try_from(window.saturating_sub(keep)).unwrap_or(u64::MAX);
                return at.saturating_sub(elapsed);
            }
        }
        // In the next window, where this window's count becomes the previous one.
        let to_next = self.window_ns.saturating_sub(elapsed);
        let into_next = if SLIDING && w.current > 0 {
            let allowance = u128::from(self.count.saturating_sub(cost));
            // This window's count, as the next window will weigh it (rounded up to a granule).
            let previous = self.layout.round_previous(w.current);
            let keep = allowance
                .saturating_mul(window)
                .checked_div(u128::from(previous))
                .unwrap_or(0)
                .min(window);
            u64::try_from(window.saturating_sub(keep)).unwrap_or(u64::MAX)
        } else {
            0
        };
        to_next.saturating_add(into_next)
    }

    /// From `now`, the wait until the counts are all back to zero.
    fn reset_after(&self, w: Windows, now_ns: u64) -> u64 {
        let windows_left: u64 = match (w.current > 0, SLIDING && w.previous > 0) {
            (true, _) if SLIDING => 2,
            (true, _) | (false, true) => 1,
            (false, false) => return 0,
        };
        let end_index = w.index.saturating_add(windows_left);
        // In 64 bits whenever the end fits, as for any reading in range short of its last window.
        if let Some(end) = end_index.checked_mul(self.window_ns) {
            return end.saturating_sub(now_ns);
        }
        let end = u128::from(end_index).saturating_mul(u128::from(self.window_ns));
        u64::try_from(end.saturating_sub(u128::from(now_ns))).unwrap_or(u64::MAX)
    }
}

impl<const SLIDING: bool> Algorithm for WindowCounter<SLIDING> {
    const NAME: &'static str = if SLIDING {
        "sliding window"
    } else {
        "fixed window"
    };
    /// Window 0 with no counts: empty in every window.
    const FRESH: u64 = 0;

    fn new(limit: Limit) -> Result<Self, LimitError> {
        Self::from_limit(limit)
    }

    fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Exact, except where the previous count is rounded up to a granule of `g` units (then up
    /// to `g - 1` units fewer per window) and where the window number wraps (then exact for
    /// states written within the last `2^(k-1)` windows).
    fn accuracy(&self) -> Accuracy {
        let granule = if SLIDING { self.layout.granule() } else { 1 };
        let accuracy = Accuracy::from_shortfall(
            u128::from(granule.saturating_sub(1)),
            u128::from(self.count),
        );
        if !self.layout.is_wrapping() {
            return accuracy;
        }
        let windows = 1u64
            .checked_shl(self.layout.index_bits().saturating_sub(1))
            .unwrap_or(u64::MAX);
        accuracy.with_horizon(windows.saturating_mul(self.window_ns).max(1))
    }

    #[inline]
    fn decide(&self, state: u64, cost: u64, now_ns: u64) -> Result<Step, DecisionError> {
        let count = self.count;
        if cost > count {
            return Err(DecisionError::CostExceedsBurst { cost, burst: count });
        }
        if now_ns > self.max_now_ns {
            return Err(DecisionError::ClockOutOfRange {
                now_ns,
                max_ns: self.max_now_ns,
            });
        }
        let Reading {
            w,
            elapsed,
            lag,
            used,
        } = self.read(state, now_ns);
        if used.saturating_add(cost) <= count {
            let after = Windows {
                current: w.current.saturating_add(cost),
                ..w
            };
            let decision = Decision::allow(
                count,
                count.saturating_sub(used).saturating_sub(cost),
                self.reset_after(after, now_ns),
            );
            Ok(Step {
                decision,
                next: (cost > 0).then(|| self.layout.pack(after)),
            })
        } else {
            let retry = lag.saturating_add(self.wait(w, elapsed, cost));
            let decision = Decision::deny(
                count,
                count.saturating_sub(used),
                retry,
                self.reset_after(w, now_ns),
            );
            Ok(Step {
                decision,
                next: None,
            })
        }
    }

    fn record(&self, state: u64, cost: u64, now_ns: u64) -> Result<Step, DecisionError> {
        if cost == 0 {
            return self.decide(state, 0, now_ns);
        }
        let count = self.count;
        if now_ns > self.max_now_ns {
            return Err(DecisionError::ClockOutOfRange {
                now_ns,
                max_ns: self.max_now_ns,
            });
        }
        let Reading {
            w, elapsed, lag, ..
        } = self.read(state, now_ns);
        // Kept up to twice the count (a window's worth of debt); never lowered.
        let most = count.saturating_mul(Usage::MAX_DEBT).max(w.current);
        let after = Windows {
            current: w.current.saturating_add(cost).min(most),
            ..w
        };
        let used = self
            .weighted(after.previous, elapsed)
            .saturating_add(after.current);
        let reset = self.reset_after(after, now_ns);
        let decision = if used <= count {
            Decision::allow(count, count.saturating_sub(used), reset)
        } else {
            Decision::deny(
                count,
                0,
                lag.saturating_add(self.wait(after, elapsed, 1)),
                reset,
            )
        };
        Ok(Step {
            decision,
            next: Some(self.layout.pack(after)),
        })
    }

    #[inline]
    fn is_full(&self, state: u64, now_ns: u64) -> bool {
        if now_ns > self.max_now_ns {
            return true;
        }
        let window = now_ns.checked_div(self.window_ns).unwrap_or(0);
        let mut stored = self.layout.unpack(state);
        stored.index = self.absolute(stored, window);
        let w = if window < stored.index {
            stored
        } else {
            self.roll(stored, window)
        };
        w.previous == 0 && w.current == 0
    }

    fn usage(&self, state: u64, now_ns: u64) -> Usage {
        if now_ns > self.max_now_ns {
            return Usage::NONE; // past the range every call is refused
        }
        Usage::new(self.read(state, now_ns).used, self.count)
    }

    fn with_usage(&self, usage: Usage, now_ns: u64) -> Result<u64, DecisionError> {
        if now_ns > self.max_now_ns {
            return Err(DecisionError::ClockOutOfRange {
                now_ns,
                max_ns: self.max_now_ns,
            });
        }
        // All of it in the current window: it then weighs at least as much, as long, as it
        // did under the old limit's windows, never less. A debt carries over as debt.
        Ok(self.layout.pack(Windows {
            index: now_ns.checked_div(self.window_ns).unwrap_or(0),
            previous: 0,
            current: usage
                .scaled_to(self.count)
                .min(self.count.saturating_mul(Usage::MAX_DEBT)),
        }))
    }

    fn refund(&self, state: u64, units: u64, granted_at: u64, _now_ns: u64) -> Option<u64> {
        let granted = granted_at.checked_div(self.window_ns).unwrap_or(0);
        let mut w = self.layout.unpack(state);
        w.index = self.absolute(w, granted);
        // The units were counted in the grant's window: take them back from that window's
        // count if the state still holds it, and from nothing otherwise.
        let count = if granted == w.index {
            &mut w.current
        } else if SLIDING && granted.checked_add(1) == Some(w.index) {
            &mut w.previous
        } else {
            return None;
        };
        if *count == 0 {
            return None;
        }
        *count = count.saturating_sub(units);
        w.previous = self.layout.round_previous(w.previous);
        Some(self.layout.pack(w))
    }
}

/// A state as seen at one reading.
struct Reading {
    /// The counts, rolled to the reading's window (or the state's, if the reading is earlier).
    w: Windows,
    /// How far into that window the reading is taken.
    elapsed: u64,
    /// How far the reading is behind that window's start (0 unless the clock went back).
    lag: u64,
    /// Units in use: the current count plus the previous one weighted, rounded up.
    used: u64,
}

/// The last reading whose window number `layout` can hold.
fn last_reading(layout: Layout, window_ns: u64) -> u64 {
    // The last window number is left unused, so no state is all ones (`StateCell::RETIRED`).
    let end = u128::from(layout.max_index()).saturating_mul(u128::from(window_ns));
    u64::try_from(end.saturating_sub(1)).unwrap_or(u64::MAX)
}

/// The fewest window-number bits whose absolute layout covers `min_range_ns` of windows of
/// `window_ns` (the last number is left unused).
fn needed_index_bits(window_ns: u64, min_range_ns: u64) -> u32 {
    (1..u64::BITS)
        .find(|&bits| {
            let layout = Layout::exact(u64::BITS.saturating_sub(bits), false);
            last_reading(layout, window_ns) >= min_range_ns
        })
        .unwrap_or(u64::BITS)
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // tests compute expected values with plain operators
mod tests;
