//! Calendar counters in UTC against a reference model built from plain calendar arithmetic
//! (days since 1970 and the civil date of a day, Howard Hinnant's algorithms; no time zone
//! library): random calls and clock steps across day, week, month and year boundaries, each
//! answer and its `reset_after` checked against the model.

use std::collections::HashMap;
use std::time::Duration;

use limiter_calendar::{Calendar, CalendarCounter, CalendarUnit, KeyedCalendarWindow};
use limiter_core::ManualClock;
use limiter_store::ShardedStore;
use proptest::prelude::*;

const DAY: u64 = 86_400;

/// (year, month 1-12, day) of `days` since 1970-01-01.
fn civil(days: u64) -> (i64, u64, u64) {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u64;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u64;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Days since 1970-01-01 of (year, month, 1).
fn days_of(year: i64, month: u64) -> u64 {
    let (y, m) = if month > 12 {
        (year + 1, month - 12)
    } else {
        (year, month)
    };
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe - 719_468) as u64
}

/// The window number and its end (Unix seconds) of `unit` at `secs`.
fn window(unit: CalendarUnit, secs: u64) -> (u64, u64) {
    let days = secs / DAY;
    let (y, m, _) = civil(days);
    match unit {
        CalendarUnit::Day => (days, (days + 1) * DAY),
        // 1969-12-29 was a Monday, three days before the epoch.
        CalendarUnit::Week => ((days + 3) / 7, (((days + 3) / 7 + 1) * 7 - 3) * DAY),
        CalendarUnit::Month => (((y - 1970) * 12) as u64 + m - 1, days_of(y, m + 1) * DAY),
        CalendarUnit::Year => ((y - 1970) as u64, days_of(y + 1, 1) * DAY),
    }
}

fn unit() -> impl Strategy<Value = CalendarUnit> {
    prop::sample::select(CalendarUnit::ALL.to_vec())
}

proptest! {
    #[test]
    fn utc_windows_match_plain_calendar_arithmetic(
        unit in unit(),
        count in 1u64..6,
        // Starting late in 2027: steps cross the end of 2027 and February 2028 (a leap year).
        start_offset in 0u64..(40 * DAY),
        calls in prop::collection::vec((0u64..(9 * DAY), 0u8..3, 0u64..4), 1..60),
    ) {
        let origin_secs = 1_829_347_200 + start_offset; // 2027-12-20 00:00 UTC
        let calendar = Calendar::new(unit, "UTC").unwrap();
        let clock = ManualClock::new();
        let limiter: KeyedCalendarWindow<u8, ManualClock> = KeyedCalendarWindow::from_algorithm(
            CalendarCounter::new(count, calendar, origin_secs * 1_000_000_000).unwrap(),
            clock.clone(),
            ShardedStore::new(),
        )
        .unwrap();
        let mut used: HashMap<(u8, u64), u64> = HashMap::new();
        let mut now = origin_secs;
        for (step, key, cost) in calls {
            clock.advance(Duration::from_secs(step));
            now += step;
            let (index, end) = window(unit, now);
            let in_window = used.entry((key, index)).or_default();
            let decided = limiter.check_key_n(&key, cost);
            if cost > count {
                prop_assert!(decided.is_err(), "a cost above the count is an error");
                continue;
            }
            let decision = decided.unwrap();
            let admitted = *in_window + cost <= count;
            prop_assert_eq!(decision.is_allowed(), admitted, "{:?} at {}", unit, now);
            if admitted {
                *in_window += cost;
            }
            prop_assert_eq!(decision.remaining(), count - *in_window);
            if *in_window > 0 {
                prop_assert_eq!(decision.reset_after(), Duration::from_secs(end - now));
            }
        }
    }
}
