//! [`WindowCounter`]: the pure transition of the sliding-window and fixed-window counters.
#![deny(clippy::arithmetic_side_effects)]

use core::time::Duration;

use limiter_core::{
    Algorithm, Decision, DecisionError, Limit, LimitError, MIN_CLOCK_RANGE, Step, Usage,
};

use crate::layout::{Layout, Windows};

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
/// # State and ranges
///
/// One `u64`: the window number, then the previous count (sliding only), then the current
/// count, each count in just the bits `count` needs. The limit's burst must equal its count (a
/// window has no separate burst). A limit is accepted only if the window number still covers
/// [`MIN_CLOCK_RANGE`] ns of clock; for one-second windows that allows up to 262,143 per second
/// sliding, and every valid limit (up to one unit per ns) fixed. Past its range a reading is refused with
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
    const FIELDS: u32 = if SLIDING { 2 } else { 1 };

    /// The counter for `limit`, or why it cannot be represented.
    pub fn from_limit(limit: Limit) -> Result<Self, LimitError> {
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
        let layout = Layout::for_count(count, Self::FIELDS);
        let max_now_ns = last_reading(layout, window_ns);
        if max_now_ns < MIN_CLOCK_RANGE {
            let most = largest_supported_count(window_ns, Self::FIELDS);
            // Longer windows do not help: each doubling of the window frees one bit of window
            // number but a count twice as large needs one more bit per count held.
            let instead = same_rate_in_shorter_windows(count, window_ns, Self::FIELDS)
                .map(|shorter| format!(", or the same rate in shorter windows, such as {shorter}"))
                .unwrap_or_default();
            return Err(unsupported(format!(
                "{limit}: counts up to {count} leave window numbers for only {:?} of clock, less than \
                 the {:?} required; with {:?} windows the {} supports at most {most} per window. \
                 Use a smaller count{instead}: shorter windows hold more per second",
                Duration::from_nanos(max_now_ns),
                Duration::from_nanos(MIN_CLOCK_RANGE),
                limit.period(),
                Self::NAME,
            )));
        }
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

    /// `state` as seen at `now_ns` (within range). A reading before the state's window: no time
    /// has passed for the state, so it is read at the start of its window (`stored.index *
    /// period` is at most the reading that wrote it).
    fn read(&self, state: u64, now_ns: u64) -> Reading {
        let stored = self.layout.unpack(state);
        let window = self.window_of(now_ns, stored.index);
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
                previous: stored.current,
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
            let keep = allowance
                .saturating_mul(window)
                .checked_div(u128::from(w.current))
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

    #[inline]
    fn is_full(&self, state: u64, now_ns: u64) -> bool {
        if now_ns > self.max_now_ns {
            return true;
        }
        let stored = self.layout.unpack(state);
        let window = now_ns.checked_div(self.window_ns).unwrap_or(0);
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
        // did under the old limit's windows, never less.
        Ok(self.layout.pack(Windows {
            index: now_ns.checked_div(self.window_ns).unwrap_or(0),
            previous: 0,
            current: usage.scaled_to(self.count),
        }))
    }

    fn refund(&self, state: u64, units: u64, granted_at: u64, _now_ns: u64) -> Option<u64> {
        let mut w = self.layout.unpack(state);
        let granted = granted_at.checked_div(self.window_ns).unwrap_or(0);
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

/// Whether a counter of `fields` counts up to `count` in windows of `window_ns` covers
/// [`MIN_CLOCK_RANGE`].
fn fits(count: u64, window_ns: u64, fields: u32) -> bool {
    last_reading(Layout::for_count(count, fields), window_ns) >= MIN_CLOCK_RANGE
}

/// The largest `2^b - 1` a window of `window_ns` supports with at least [`MIN_CLOCK_RANGE`].
fn largest_supported_count(window_ns: u64, fields: u32) -> u64 {
    (1..u64::BITS)
        .rev()
        .map(|bits| {
            u64::MAX
                .checked_shr(u64::BITS.saturating_sub(bits))
                .unwrap_or(0)
        })
        .find(|&count| fits(count, window_ns, fields))
        .unwrap_or(1)
}

/// `count` per `window_ns` as the same rate (rounded down, never above it) in the longest
/// window a half, a fifth, a tenth, a twentieth, ... as long that fits (so a round period
/// stays round), or `None` if no window of at least 1 ns holds a unit.
fn same_rate_in_shorter_windows(count: u64, window_ns: u64, fields: u32) -> Option<Limit> {
    for divisor in window_divisors() {
        let shorter = window_ns.checked_div(divisor).filter(|&w| w > 0)?;
        // count * shorter / window_ns <= count, so it fits in a u64.
        let scaled = u128::from(count)
            .checked_mul(u128::from(shorter))?
            .checked_div(u128::from(window_ns))?;
        let scaled = u64::try_from(scaled).ok().filter(|&c| c > 0)?;
        if fits(scaled, shorter, fields) {
            return Limit::from_nanos(scaled, shorter).ok();
        }
    }
    None
}

/// 2, 5, 10, 20, 50, 100, ...: what to divide a window by so a round period stays round.
fn window_divisors() -> impl Iterator<Item = u64> {
    (0..u64::MAX.ilog10())
        .flat_map(|power| {
            [2_u64, 5, 10].map(move |m| 10_u64.checked_pow(power).and_then(|p| m.checked_mul(p)))
        })
        .map_while(|divisor| divisor)
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // tests compute expected values with plain operators
mod tests {
    use super::*;
    use limiter_core::StateCell;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_rate_too_high_for_its_windows_fits_in_the_shorter_windows_the_error_names() {
        // A million per second does not fit a sliding window's state over 2^56 ns of clock
        // (a 1 s window holds at most 262,143)...
        let error = SlidingCounter::from_limit(Limit::per_second(1_000_000).unwrap())
            .unwrap_err()
            .to_string();
        // ...nor does the same rate in longer windows, whatever one might guess...
        for seconds in [2, 10, 60] {
            let longer = Limit::new(1_000_000 * seconds, Duration::from_secs(seconds)).unwrap();
            assert!(SlidingCounter::from_limit(longer).is_err(), "{longer}");
        }
        // ...but it does in the shorter windows the error names, at the same rate.
        assert!(
            error.contains("shorter windows, such as 100000 per 100ms"),
            "{error}"
        );
        let named = Limit::new(100_000, Duration::from_millis(100)).unwrap();
        let counter = SlidingCounter::from_limit(named).unwrap();
        assert!(counter.max_now_nanos() >= MIN_CLOCK_RANGE);
        // The suggestion never raises the rate: 3 per 7 ns becomes 1 per 3 ns, not 1.29.
        let rounded = same_rate_in_shorter_windows(3, 7, 2).unwrap();
        assert_eq!((rounded.count(), rounded.period_nanos()), (1, 3));
        let divisors: Vec<u64> = window_divisors().take(7).collect();
        assert_eq!(divisors, [2, 5, 10, 20, 50, 100, 200]);
        assert_eq!(window_divisors().last(), Some(10_000_000_000_000_000_000));
    }

    fn sliding(count: u64, period_ns: u64) -> SlidingCounter {
        SlidingCounter::from_limit(Limit::from_nanos(count, period_ns).unwrap()).unwrap()
    }

    /// Fills window 0 with `count` at its very end, so window 1 starts with all of it weighted.
    fn full_previous(s: &SlidingCounter) -> u64 {
        s.decide(SlidingCounter::FRESH, s.count, s.window_ns - 1)
            .unwrap()
            .next
            .unwrap()
    }

    #[test]
    fn the_previous_window_decays_linearly_and_rounds_against_the_caller() {
        let s = sliding(10, SECOND);
        let state = full_previous(&s);
        // At 10% into window 1, 90% of window 0 overlaps: 9 weighted, 1 left.
        let d = s.decide(state, 1, SECOND + SECOND / 10).unwrap().decision;
        assert!(d.is_allowed() && d.remaining() == 0, "{d:?}");
        // One ns earlier the weight is 9.00000001, rounded up to 10: nothing left.
        let d = s
            .decide(state, 1, SECOND + SECOND / 10 - 1)
            .unwrap()
            .decision;
        assert!(d.is_denied(), "{d:?}");
        assert_eq!(d.retry_after_nanos(), 1);
    }

    #[test]
    fn retry_after_is_the_exact_first_admitting_instant() {
        let s = sliding(10, SECOND);
        let state = full_previous(&s);
        for cost in 1..=10 {
            let first = s.decide(state, cost, SECOND).unwrap().decision;
            assert!(first.is_denied());
            let at = SECOND + first.retry_after_nanos();
            assert!(
                s.decide(state, cost, at).unwrap().decision.is_allowed(),
                "cost {cost} at {at}"
            );
            assert!(
                s.decide(state, cost, at - 1).unwrap().decision.is_denied(),
                "cost {cost} before {at}"
            );
        }
    }

    #[test]
    fn a_full_window_waits_for_the_next_and_a_burst_for_the_one_after() {
        let s = sliding(4, SECOND);
        let state = s.decide(SlidingCounter::FRESH, 4, 0).unwrap().next.unwrap();
        // Window 0 is full from its start: in window 1 it weighs 4 * (1 - e), so one unit fits
        // after a quarter of window 1, and all four only in window 2.
        assert_eq!(
            s.decide(state, 1, 0).unwrap().decision.retry_after_nanos(),
            SECOND + SECOND / 4
        );
        assert_eq!(
            s.decide(state, 4, 0).unwrap().decision.retry_after_nanos(),
            2 * SECOND
        );
        let fixed = FixedCounter::from_limit(Limit::from_nanos(4, SECOND).unwrap()).unwrap();
        let state = fixed
            .decide(FixedCounter::FRESH, 4, 0)
            .unwrap()
            .next
            .unwrap();
        assert_eq!(
            fixed
                .decide(state, 4, SECOND / 2)
                .unwrap()
                .decision
                .retry_after_nanos(),
            SECOND / 2
        );
    }

    #[test]
    fn limits_out_of_range_are_refused_with_the_largest_count_that_fits() {
        let err = SlidingCounter::from_limit(Limit::per_second(1_000_000).unwrap()).unwrap_err();
        assert!(
            err.to_string().contains("at most 262143 per window"),
            "{err}"
        );
        assert!(SlidingCounter::from_limit(Limit::per_second(262_143).unwrap()).is_ok());
        assert!(FixedCounter::from_limit(Limit::per_second(1_000_000_000).unwrap()).is_ok());
        let sliding_max = SlidingCounter::from_limit(Limit::per_second(262_143).unwrap()).unwrap();
        assert!(sliding_max.max_now_nanos() >= MIN_CLOCK_RANGE);
        let burst = Limit::per_second(10).unwrap().with_burst(5).unwrap();
        assert!(
            SlidingCounter::from_limit(burst)
                .unwrap_err()
                .to_string()
                .contains("no separate burst")
        );
    }

    #[test]
    fn a_reading_before_the_state_window_is_decided_at_its_start() {
        let s = sliding(10, SECOND);
        let state = s
            .decide(SlidingCounter::FRESH, 10, 5 * SECOND)
            .unwrap()
            .next
            .unwrap();
        let d = s.decide(state, 1, 2 * SECOND).unwrap().decision;
        // Denied: window 5 is full. The wait runs from the reading, through the catch-up.
        assert!(d.is_denied());
        assert_eq!(d.retry_after_nanos(), 3 * SECOND + SECOND + SECOND / 10);
        assert!(!s.is_full(state, 2 * SECOND));
        assert!(s.is_full(state, 7 * SECOND));
    }

    #[test]
    fn the_window_found_without_dividing_is_the_quotient() {
        for window_ns in [1, 7, 1_000, SECOND, u64::MAX / 3] {
            let s = WindowCounter::<true> {
                window_ns,
                ..sliding(1, 1)
            };
            for stored in [
                0,
                1,
                5,
                u64::MAX / window_ns,
                u64::MAX / window_ns - 1,
                u64::MAX,
            ] {
                let start = stored.saturating_mul(window_ns);
                let readings = [0, 1, window_ns, 2 * window_ns + 1]
                    .into_iter()
                    .flat_map(|d| {
                        let before = start.saturating_sub(d);
                        let after = start.saturating_add(d);
                        [before, after, after.saturating_add(window_ns - 1)]
                    })
                    .chain([u64::MAX, u64::MAX - 1]);
                for now in readings {
                    assert_eq!(
                        s.window_of(now, stored),
                        now / window_ns,
                        "window {window_ns}, stored {stored}, now {now}"
                    );
                }
            }
        }
    }

    #[test]
    fn counts_and_windows_too_large_for_64_bit_products_decide_in_128() {
        // 2^20 per 2^45 ns: a full previous window weighs 2^20 * overlap, past u64 at any
        // overlap above 2^44 ns.
        let window = 1 << 45;
        let s = sliding(1 << 20, window);
        let state = full_previous(&s);
        // A quarter into window 1, three quarters of window 0 overlap: 786,432 weighted.
        let d = s.decide(state, 0, window + window / 4).unwrap().decision;
        assert_eq!(d.remaining(), (1 << 20) - 786_432);
        // The window's own end, as a multiple of the period, past u64: the reset comes out in
        // 128 bits, from the last window a reading can be in.
        let last = s.max_now_nanos();
        let d = s.decide(SlidingCounter::FRESH, 1, last).unwrap().decision;
        let end = (u128::from(last / window) + 2) * u128::from(window);
        assert_eq!(
            d.reset_after_nanos(),
            u64::try_from(end - u128::from(last)).unwrap_or(u64::MAX)
        );
    }

    #[test]
    fn no_state_is_the_retired_word_even_at_the_last_reading() {
        // 255 = 2^8 - 1 fills every count bit; the last window number is the one left unused.
        let s = sliding(255, 1_000);
        let full = s
            .decide(SlidingCounter::FRESH, 255, s.max_now_nanos())
            .unwrap();
        assert_ne!(full.next, Some(StateCell::RETIRED));
        let refilled = s.decide(full.next.unwrap(), 255, s.max_now_nanos());
        assert!(refilled.unwrap().decision.is_denied());
        let fixed = FixedCounter::from_limit(Limit::from_nanos(255, 1_000).unwrap()).unwrap();
        let full = fixed
            .decide(FixedCounter::FRESH, 255, fixed.max_now_nanos())
            .unwrap();
        assert_ne!(full.next, Some(StateCell::RETIRED));
    }
}
