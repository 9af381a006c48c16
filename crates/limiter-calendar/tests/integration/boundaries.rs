//! Calendar boundaries against instants worked out independently (Python's `zoneinfo` over the
//! system's copy of the IANA database, not the embedded one): days across both daylight-saving
//! changes (23 and 25 hours), a day whose local midnight does not exist, month ends of 28 to
//! 31 days, leap years, weeks from Monday, years; then counters on a manual clock at those
//! boundaries, direct and per key.

use std::time::Duration;

use limiter_calendar::{
    Calendar, CalendarCounter, CalendarError, CalendarUnit, CalendarWindow, KeyedCalendarWindow,
};
use limiter_core::ManualClock;
use limiter_store::ShardedStore;

const S: u64 = 1_000_000_000;
const HOUR: u64 = 3_600 * S;

/// The window holding `at`, and that it ends where the next begins.
fn bounds(unit: CalendarUnit, zone: &str, at: u64) -> (u64, u64) {
    let calendar = Calendar::new(unit, zone).expect("known zone");
    let window = calendar.window(at).expect("in range");
    assert!(window.start_unix_ns <= at && at < window.end_unix_ns);
    let next = calendar.window(window.end_unix_ns).expect("in range");
    assert_eq!(
        next.start_unix_ns, window.end_unix_ns,
        "windows tile the line"
    );
    assert_eq!(next.index, window.index + 1);
    let before = calendar.window(window.start_unix_ns - 1).expect("in range");
    assert_eq!(before.end_unix_ns, window.start_unix_ns);
    (window.start_unix_ns, window.end_unix_ns)
}

#[test]
fn days_across_daylight_saving_changes_last_23_and_25_hours() {
    // Berlin springs forward on 2026-03-29 and falls back on 2026-10-25.
    let spring = bounds(
        CalendarUnit::Day,
        "Europe/Berlin",
        1_774_738_800 * S + 5 * HOUR,
    );
    assert_eq!(spring, (1_774_738_800 * S, 1_774_821_600 * S));
    assert_eq!(spring.1 - spring.0, 23 * HOUR);
    let autumn = bounds(
        CalendarUnit::Day,
        "Europe/Berlin",
        1_792_879_200 * S + 20 * HOUR,
    );
    assert_eq!(autumn, (1_792_879_200 * S, 1_792_969_200 * S));
    assert_eq!(autumn.1 - autumn.0, 25 * HOUR);
    // Santiago's clocks skip from midnight to 01:00 on 2026-09-06: that day starts at 01:00.
    let gap = bounds(
        CalendarUnit::Day,
        "America/Santiago",
        1_788_667_200 * S + HOUR,
    );
    assert_eq!(gap, (1_788_667_200 * S, 1_788_750_000 * S));
    let eve = bounds(CalendarUnit::Day, "America/Santiago", 1_788_667_200 * S - 1);
    assert_eq!(eve, (1_788_580_800 * S, 1_788_667_200 * S));
}

#[test]
fn months_end_on_their_last_day_leap_years_included() {
    let feb_2028 = bounds(
        CalendarUnit::Month,
        "UTC",
        1_832_976_000 * S + 10 * 24 * HOUR,
    );
    assert_eq!(feb_2028, (1_832_976_000 * S, 1_835_481_600 * S));
    assert_eq!((feb_2028.1 - feb_2028.0) / (24 * HOUR), 29);
    let feb_2027 = bounds(CalendarUnit::Month, "UTC", 1_801_440_000 * S);
    assert_eq!((feb_2027.1 - feb_2027.0) / (24 * HOUR), 28);
    // March 2026 in Berlin: 31 days less the hour summer time takes.
    let march = bounds(CalendarUnit::Month, "Europe/Berlin", 1_774_994_400 * S - 1);
    assert_eq!(march, (1_772_319_600 * S, 1_774_994_400 * S));
    assert_eq!(march.1 - march.0, 31 * 24 * HOUR - HOUR);
}

#[test]
fn weeks_start_on_monday_and_years_on_january_first() {
    // Friday 2026-11-27 in New York: the week of Monday the 23rd.
    let week = bounds(
        CalendarUnit::Week,
        "America/New_York",
        1_795_410_000 * S + 4 * 24 * HOUR,
    );
    assert_eq!(week, (1_795_410_000 * S, 1_796_014_800 * S));
    let year = bounds(
        CalendarUnit::Year,
        "Asia/Tokyo",
        1_767_193_200 * S + 100 * 24 * HOUR,
    );
    assert_eq!(year, (1_767_193_200 * S, 1_798_729_200 * S));
}

#[test]
fn unknown_zones_and_periods_are_refused_naming_them() {
    let err = Calendar::new(CalendarUnit::Day, "Mars/Olympus").unwrap_err();
    assert_eq!(err, CalendarError::UnknownZone("Mars/Olympus".into()));
    assert!(err.to_string().contains("Europe/Berlin"), "{err}");
    assert_eq!("1mo".parse::<CalendarUnit>(), Ok(CalendarUnit::Month));
    let err = "30d".parse::<CalendarUnit>().unwrap_err();
    assert!(err.to_string().contains("\"1mo\""), "{err}");
    let month = Calendar::new(CalendarUnit::Month, "UTC").unwrap();
    assert!(CalendarCounter::new(0, month, 0).is_err());
    // Every unit a period names, shortest first, each named back by its period; and the
    // refusal lists them all.
    let mut seen = Vec::new();
    for unit in CalendarUnit::ALL {
        assert_eq!(unit.period().parse::<CalendarUnit>(), Ok(unit));
        assert!(!seen.contains(&unit), "{unit:?} twice");
        assert!(
            err.to_string().contains(&format!("{:?}", unit.period())),
            "{err}"
        );
        seen.push(unit);
    }
    assert!(
        CalendarUnit::ALL
            .windows(2)
            .all(|w| w[0].nominal() < w[1].nominal())
    );
    for period in ["1d", "1w", "1mo", "1y"] {
        let unit = period.parse::<CalendarUnit>().unwrap();
        assert!(CalendarUnit::ALL.contains(&unit), "{period}");
    }
}

#[test]
fn a_quota_resets_at_the_boundary_and_says_when() {
    // Reading 0 is one second before 2026-10-25 ends in Berlin (a 25-hour day).
    let origin = 1_792_969_200 * S - S;
    let day = Calendar::new(CalendarUnit::Day, "Europe/Berlin").unwrap();
    let clock = ManualClock::new();
    let quota = CalendarWindow::from_algorithm(
        CalendarCounter::new(2, day, origin).unwrap(),
        clock.clone(),
    )
    .unwrap();
    let first = quota.check().unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.reset_after(), Duration::from_secs(1));
    assert!(quota.check().unwrap().is_allowed());
    let denied = quota.check().unwrap();
    assert!(denied.is_denied());
    assert_eq!(denied.retry_after(), Duration::from_secs(1));
    clock.advance(Duration::from_secs(1));
    let next = quota.check().unwrap();
    assert!(next.is_allowed());
    assert_eq!(next.remaining(), 1);
    assert_eq!(
        next.reset_after(),
        Duration::from_secs(24 * 3_600),
        "2026-10-26 is 24 hours"
    );
}

/// A window on its default clock (named by the type alone: the OS's monotonic clock, whose rate
/// the OS keeps at the wall clock's) says the next UTC midnight as the wall clock has it.
#[test]
fn a_window_on_its_default_clock_ends_at_the_wall_clocks_midnight() {
    let clock = limiter_core::MonotonicClock::new();
    let origin = limiter_core::unix_origin(&clock);
    let day = Calendar::new(CalendarUnit::Day, "UTC").unwrap();
    let quota: CalendarWindow =
        CalendarWindow::from_algorithm(CalendarCounter::new(5, day, origin).unwrap(), clock)
            .unwrap();
    let wall = |at: std::time::SystemTime| {
        at.duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos()
    };
    let before = wall(std::time::SystemTime::now());
    let reset = quota.check().unwrap().reset_after().as_nanos();
    let after = wall(std::time::SystemTime::now());
    let midnight = |at: u128| (at / u128::from(24 * HOUR) + 1) * u128::from(24 * HOUR);
    // The reading was taken between the two wall readings: its midnight, less it, is the reset
    // (a millisecond either way for the wall clock's own steps); a midnight between the two
    // readings leaves nothing to compare.
    if midnight(before) == midnight(after) {
        let ms = 1_000_000;
        assert!(
            midnight(before) - after <= reset + ms && reset <= midnight(before) - before + ms,
            "reset {reset} ns, wall {before}..{after}"
        );
    }
}

#[test]
fn keys_count_apart_and_are_forgotten_once_their_window_passes() {
    let origin = 1_774_994_400 * S - S; // a second before April in Berlin
    let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
    let clock = ManualClock::new();
    let per_key: KeyedCalendarWindow<String, ManualClock> = KeyedCalendarWindow::from_algorithm(
        CalendarCounter::new(1, month, origin).unwrap(),
        clock.clone(),
        ShardedStore::new(),
    )
    .unwrap();
    assert!(per_key.check_key("acme").unwrap().is_allowed());
    assert!(per_key.check_key("acme").unwrap().is_denied());
    assert!(per_key.check_key("globex").unwrap().is_allowed());
    clock.advance(Duration::from_secs(1));
    assert_eq!(
        per_key.reclaim_full(),
        2,
        "March's counts are forgotten in April"
    );
    assert!(per_key.check_key("acme").unwrap().is_allowed());
}

#[test]
fn a_monthly_quota_in_a_stack_is_all_or_nothing_with_a_rate() {
    use limiter_stack::{Kind, Layer, Stack};
    let origin = 1_774_994_400 * S - S; // a second before April in Berlin
    let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin").unwrap();
    let clock = ManualClock::new();
    let stack: Stack<&str, String, ManualClock> = Stack::builder()
        .layer(
            Layer::keyed("customer", |c: &&str| Some(c.to_string()))
                .limit(Kind::TokenBucket, limiter_core::Limit::per_second(2))
                .algorithm(CalendarCounter::new(3, month, origin).unwrap()),
        )
        .clock(clock.clone())
        .build()
        .unwrap();
    assert!(stack.check_n(&"acme", 2).unwrap().is_allowed());
    // The rate allows no more this second: the month's quota takes nothing either.
    assert!(stack.check(&"acme").unwrap().is_denied());
    clock.advance(Duration::from_millis(500)); // the bucket has one again, the month 1 left
    let last = stack.check(&"acme").unwrap();
    assert!(last.is_allowed());
    assert_eq!(last.decision().remaining(), 0);
    clock.advance(Duration::from_millis(500)); // April: March's quota is spent, April's not
    assert!(stack.check(&"acme").unwrap().is_allowed());
}
