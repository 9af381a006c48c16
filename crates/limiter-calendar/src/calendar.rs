//! [`Calendar`]: a unit of the calendar (a day, a week from Monday, a month, a year) in UTC or
//! an IANA time zone, and the window of it an instant falls in: its number and where it starts
//! and ends, at local midnight of the unit's first day (so a day across a daylight-saving
//! change is 23 or 25 hours long). The window computed last and the one after it are kept
//! (`cache.rs`), so most calls convert nothing.

use std::fmt;
use std::str::FromStr;

use jiff::civil::Date;
use jiff::tz::TimeZone;
use jiff::{Timestamp, ToSpan};

use crate::cache::WindowCache;
use crate::window::Window;

/// A unit of the calendar.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CalendarUnit {
    /// From local midnight to the next (`1d`).
    Day,
    /// From Monday's local midnight to the next Monday's (`1w`).
    Week,
    /// From the first of the month at local midnight to the next first (`1mo`).
    Month,
    /// From January 1st at local midnight to the next (`1y`).
    Year,
}

impl CalendarUnit {
    /// Every unit, shortest first: what a `period` may name.
    pub const ALL: [Self; 4] = [Self::Day, Self::Week, Self::Month, Self::Year];

    /// The unit's usual length (a day, 7 days, 30 days, 365 days): for display, where a
    /// limit names its period; windows follow the calendar, not this.
    pub fn nominal(self) -> std::time::Duration {
        let days = match self {
            Self::Day => 1,
            Self::Week => 7,
            Self::Month => 30,
            Self::Year => 365,
        };
        std::time::Duration::from_secs(days * 86_400)
    }

    /// The unit's name in a period: `1d`, `1w`, `1mo`, `1y`.
    pub fn period(self) -> &'static str {
        match self {
            Self::Day => "1d",
            Self::Week => "1w",
            Self::Month => "1mo",
            Self::Year => "1y",
        }
    }
}

impl FromStr for CalendarUnit {
    type Err = CalendarError;

    /// `1d`, `1w`, `1mo` or `1y`.
    fn from_str(period: &str) -> Result<Self, CalendarError> {
        match period {
            "1d" => Ok(Self::Day),
            "1w" => Ok(Self::Week),
            "1mo" => Ok(Self::Month),
            "1y" => Ok(Self::Year),
            other => Err(CalendarError::UnknownPeriod(other.to_owned())),
        }
    }
}

/// A calendar that cannot be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CalendarError {
    /// A zone the embedded IANA database does not have.
    #[error(
        "unknown time zone {0:?}: name UTC or an IANA zone such as \"Europe/Berlin\" or \"America/New_York\""
    )]
    UnknownZone(String),
    /// A period that is not a unit of the calendar.
    #[error("a calendar period is \"1d\", \"1w\" (from Monday), \"1mo\" or \"1y\", not {0:?}")]
    UnknownPeriod(String),
}

/// A unit of the calendar in a time zone.
///
/// It keeps the window it computed last and the one after it, shared by every thread that
/// asks (read without a lock): a window is computed once and then read, until the clock moves
/// past the one after it. A window is kept only where the zone's local date never goes back
/// within it, so a kept window is exactly the one computing any of its instants gives (where a
/// zone's clocks were once set back across midnight, as Goose Bay's were at 00:01, that window
/// is computed every time).
#[derive(Clone)]
pub struct Calendar {
    unit: CalendarUnit,
    zone: TimeZone,
    zone_name: String,
    cache: WindowCache,
}

impl fmt::Debug for Calendar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Calendar({} in {})", self.unit.period(), self.zone_name)
    }
}

impl PartialEq for Calendar {
    fn eq(&self, other: &Self) -> bool {
        self.unit == other.unit && self.zone_name == other.zone_name
    }
}

impl Eq for Calendar {}

/// 1970-01-01, where window numbers start.
const EPOCH_DATE: Date = jiff::civil::date(1970, 1, 1);

impl Calendar {
    /// `unit` in `zone`: `"UTC"` or an IANA name, looked up in the embedded database.
    pub fn new(unit: CalendarUnit, zone: &str) -> Result<Self, CalendarError> {
        let tz = if zone == "UTC" {
            TimeZone::UTC
        } else {
            TimeZone::get(zone).map_err(|_| CalendarError::UnknownZone(zone.to_owned()))?
        };
        Ok(Self {
            unit,
            zone: tz,
            zone_name: zone.to_owned(),
            cache: WindowCache::new(),
        })
    }

    /// The unit.
    pub fn unit(&self) -> CalendarUnit {
        self.unit
    }

    /// The zone's name, as given.
    pub fn zone(&self) -> &str {
        &self.zone_name
    }

    /// The window `unix_ns` (nanoseconds since the Unix epoch) falls in; `None` past the
    /// calendar's range (the year 9999).
    #[inline]
    pub fn window(&self, unix_ns: u64) -> Option<Window> {
        match self.cache.get(unix_ns) {
            Some(window) => Some(window),
            None => self.compute_and_keep(unix_ns),
        }
    }

    /// The window `unix_ns` falls in, computed; kept with the one after it where each is
    /// exactly what computing any of its instants gives.
    #[cold]
    fn compute_and_keep(&self, unix_ns: u64) -> Option<Window> {
        let window = self.compute(unix_ns)?;
        let holds = window.start_unix_ns <= unix_ns && unix_ns < window.end_unix_ns;
        if holds && self.dates_never_go_back(&window) {
            let next = self
                .compute(window.end_unix_ns)
                .filter(|next| self.dates_never_go_back(next));
            self.cache.put(&window, next.as_ref());
        }
        Some(window)
    }

    /// Whether the zone's local date never goes back from `window`'s start to its end (both
    /// included): then every instant of it has a date of the window's unit, and computing any
    /// of them gives this window. A zone whose clocks were set back across midnight fails it
    /// for that window; so does one with more changes in a window than are looked through.
    fn dates_never_go_back(&self, window: &Window) -> bool {
        const MOST_CHANGES: usize = 64;
        let (Some(start), Some(end)) = (
            Self::timestamp(window.start_unix_ns.saturating_sub(1)),
            Self::timestamp(window.end_unix_ns),
        ) else {
            return false;
        };
        let mut seen = 0;
        for change in self.zone.following(start).take(MOST_CHANGES + 1) {
            let at = change.timestamp();
            if at > end {
                return true;
            }
            seen += 1;
            let just_before = at.checked_sub(jiff::SignedDuration::from_nanos(1));
            let Ok(just_before) = just_before else {
                return false;
            };
            if self.zone.to_datetime(at).date() < self.zone.to_datetime(just_before).date() {
                return false;
            }
        }
        seen <= MOST_CHANGES
    }

    fn timestamp(unix_ns: u64) -> Option<Timestamp> {
        Timestamp::from_nanosecond(i128::from(unix_ns)).ok()
    }

    /// The window `unix_ns` falls in, from the zone's calendar.
    pub(crate) fn compute(&self, unix_ns: u64) -> Option<Window> {
        let at = Timestamp::from_nanosecond(i128::from(unix_ns)).ok()?;
        let today = at.to_zoned(self.zone.clone()).date();
        let (first, next, index) = match self.unit {
            CalendarUnit::Day => {
                let index = EPOCH_DATE.until(today).ok()?.get_days();
                (today, today.checked_add(1.day()).ok()?, i64::from(index))
            }
            CalendarUnit::Week => {
                let back = today.weekday().to_monday_zero_offset();
                let monday = today.checked_sub(i64::from(back).days()).ok()?;
                // 1969-12-29 was a Monday: weeks count from it.
                let days = jiff::civil::date(1969, 12, 29)
                    .until(monday)
                    .ok()?
                    .get_days();
                (
                    monday,
                    monday.checked_add(1.week()).ok()?,
                    i64::from(days / 7),
                )
            }
            CalendarUnit::Month => {
                let first = today.first_of_month();
                let months = (i64::from(today.year()) - 1970) * 12 + i64::from(today.month()) - 1;
                (first, first.checked_add(1.month()).ok()?, months)
            }
            CalendarUnit::Year => {
                let first = today.first_of_year();
                (
                    first,
                    first.checked_add(1.year()).ok()?,
                    i64::from(today.year()) - 1970,
                )
            }
        };
        Some(Window {
            index: u64::try_from(index).ok()?,
            start_unix_ns: self.midnight(first)?,
            end_unix_ns: self.midnight(next)?,
        })
    }

    /// The instant `date` starts in the zone (its local midnight, or the first instant after it
    /// where midnight does not exist).
    fn midnight(&self, date: Date) -> Option<u64> {
        let start = date.to_zoned(self.zone.clone()).ok()?.start_of_day().ok()?;
        u64::try_from(start.timestamp().as_nanosecond()).ok()
    }
}
