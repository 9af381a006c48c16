//! [`CalendarCounter`]: a fixed window counter whose windows are a [`Calendar`]'s: its state is
//! one word (the window's number and the units counted in it), and a call in a later window
//! starts from zero, as envoy's and unkey's fixed windows do, but on the calendar's boundaries.

use limiter_core::{Algorithm, Clock, Decision, DecisionError, Limit, LimitError, Step, Usage};

use crate::calendar::Calendar;
use crate::window::Window;

/// Bits of the state word that count units; the window's number (plus one: 0 is fresh) is above.
const COUNT_BITS: u32 = 40;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// The most units one window may count.
pub const MAX_CALENDAR_COUNT: u64 = COUNT_MASK / 2;

/// At most `count` units per calendar window: a day, a week from Monday, a month or a year in a
/// time zone. Built with [`new`](Self::new) (a calendar is more than a [`Limit`]), and used by
/// [`CalendarWindow`](crate::CalendarWindow) and [`KeyedCalendarWindow`](crate::KeyedCalendarWindow).
#[derive(Clone, Debug)]
pub struct CalendarCounter {
    calendar: Calendar,
    limit: Limit,
    origin_unix_ns: u64,
}

impl CalendarCounter {
    /// `count` units per window of `calendar`, on a clock whose reading 0 is `origin_unix_ns`
    /// nanoseconds after the Unix epoch ([`limiter_core::unix_origin`] finds it for a clock)
    /// and whose rate is the OS clock's ([`MonotonicClock`](limiter_core::MonotonicClock);
    /// see the crate's docs on the clock). [`on_clock`](Self::on_clock) finds the reading 0
    /// from the clock itself and refuses one off the wall clock's rate.
    pub fn new(count: u64, calendar: Calendar, origin_unix_ns: u64) -> Result<Self, LimitError> {
        if count == 0 || count > MAX_CALENDAR_COUNT {
            return Err(LimitError::Unsupported {
                algorithm: Self::NAME,
                reason: format!(
                    "{count} per {}: a calendar window counts 1 to {MAX_CALENDAR_COUNT} units",
                    calendar.unit().period()
                ),
            });
        }
        Ok(Self {
            limit: Limit::new(count, calendar.unit().nominal()),
            calendar,
            origin_unix_ns,
        })
    }

    /// `count` units per window of `calendar`, on `clock`: [`new`](Self::new) with the clock's
    /// reading 0 found ([`limiter_core::unix_origin`]), refused for a clock that does not keep
    /// the wall clock's rate ([`Clock::keeps_wall_rate`]: the default clock on the time-stamp
    /// counter), whose windows would end early or late by its drift.
    ///
    /// ```
    /// use limiter_calendar::{Calendar, CalendarCounter, CalendarUnit, CalendarWindow};
    /// use limiter_core::MonotonicClock;
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let clock = MonotonicClock::new();
    /// let day = Calendar::new(CalendarUnit::Day, "America/New_York")?;
    /// let quota = CalendarWindow::from_algorithm(CalendarCounter::on_clock(10_000, day, &clock)?, clock)?;
    /// assert!(quota.check()?.is_allowed());
    /// # Ok(()) }
    /// ```
    pub fn on_clock(
        count: u64,
        calendar: Calendar,
        clock: &impl Clock,
    ) -> Result<Self, LimitError> {
        let counter = Self::new(count, calendar, limiter_core::unix_origin(clock))?;
        // The clock refused in the words every limiter built from an algorithm uses, after
        // the quota it was asked for.
        limiter_core::check_clock(&counter, clock).map_err(|refused| match refused {
            LimitError::Unsupported { algorithm, reason } => LimitError::Unsupported {
                algorithm,
                reason: format!(
                    "{count} per {} in {}: {reason}",
                    counter.calendar.unit().period(),
                    counter.calendar.zone()
                ),
            },
            other => other,
        })?;
        Ok(counter)
    }

    /// The calendar.
    pub fn calendar(&self) -> &Calendar {
        &self.calendar
    }

    /// The window the clock's reading `now` falls in.
    pub fn window_at(&self, now: u64) -> Result<Window, DecisionError> {
        self.origin_unix_ns
            .checked_add(now)
            .and_then(|unix| self.calendar.window(unix))
            .ok_or(DecisionError::ClockOutOfRange {
                now_ns: now,
                max_ns: u64::MAX - self.origin_unix_ns,
            })
    }

    /// Units counted in `window` by `state`.
    fn used(state: u64, window: &Window) -> u64 {
        if state >> COUNT_BITS == window.index + 1 {
            state & COUNT_MASK
        } else {
            0
        }
    }

    fn pack(window: &Window, used: u64) -> u64 {
        ((window.index + 1) << COUNT_BITS) | used.min(COUNT_MASK)
    }

    /// The answer for `used` units in `window` at `now`, admitted or not.
    fn answer(&self, window: &Window, now: u64, used: u64, allowed: bool) -> Decision {
        let count = self.limit.count();
        let unix = self.origin_unix_ns.saturating_add(now);
        let reset = if used == 0 {
            0
        } else {
            window.end_unix_ns.saturating_sub(unix).max(1)
        };
        if allowed {
            Decision::allow(count, count.saturating_sub(used), reset)
        } else {
            Decision::deny(
                count,
                count.saturating_sub(used),
                reset.max(1),
                reset.max(1),
            )
        }
    }
}

impl Algorithm for CalendarCounter {
    const NAME: &'static str = "calendar window";
    const FRESH: u64 = 0;

    /// A calendar window is built with [`CalendarCounter::new`]: a limit alone names no
    /// calendar.
    fn new(limit: Limit) -> Result<Self, LimitError> {
        Err(LimitError::Unsupported {
            algorithm: Self::NAME,
            reason: format!(
                "{limit}: a calendar window needs a calendar; build it with CalendarCounter::new"
            ),
        })
    }

    fn limit(&self) -> &Limit {
        &self.limit
    }

    /// Always: a window's bounds are the calendar's, in Unix time.
    fn reads_unix_time(&self) -> bool {
        true
    }

    fn decide(&self, state: u64, cost: u64, now: u64) -> Result<Step, DecisionError> {
        let count = self.limit.count();
        if cost > count {
            return Err(DecisionError::CostExceedsBurst { cost, burst: count });
        }
        let window = self.window_at(now)?;
        let used = Self::used(state, &window);
        let after = used + cost;
        if after <= count {
            Ok(Step {
                decision: self.answer(&window, now, after, true),
                next: (cost > 0).then(|| Self::pack(&window, after)),
            })
        } else {
            Ok(Step {
                decision: self.answer(&window, now, used, false),
                next: None,
            })
        }
    }

    fn record(&self, state: u64, cost: u64, now: u64) -> Result<Step, DecisionError> {
        let count = self.limit.count();
        let window = self.window_at(now)?;
        let after = Self::used(state, &window)
            .saturating_add(cost)
            .min(Usage::MAX_DEBT.saturating_mul(count));
        Ok(Step {
            decision: self.answer(&window, now, after, after <= count),
            next: (cost > 0).then(|| Self::pack(&window, after)),
        })
    }

    fn is_full(&self, state: u64, now: u64) -> bool {
        self.window_at(now)
            .is_ok_and(|window| Self::used(state, &window) == 0)
    }

    fn usage(&self, state: u64, now: u64) -> Usage {
        let used = self
            .window_at(now)
            .map_or(0, |window| Self::used(state, &window));
        Usage::new(used, self.limit.count())
    }

    fn with_usage(&self, usage: Usage, now: u64) -> Result<u64, DecisionError> {
        let window = self.window_at(now)?;
        Ok(Self::pack(&window, usage.scaled_to(self.limit.count())))
    }

    fn refund(&self, state: u64, units: u64, granted_at: u64, now: u64) -> Option<u64> {
        let window = self.window_at(now).ok()?;
        // Units granted in an earlier window came back when it ended.
        let granted = self.window_at(granted_at).ok()?;
        if granted.index != window.index {
            return None;
        }
        let used = Self::used(state, &window);
        Some(Self::pack(&window, used.saturating_sub(units)))
    }
}
