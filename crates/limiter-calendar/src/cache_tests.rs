//! A kept window is exactly the computed one: in every zone of the embedded database, at every
//! change of its clocks from 1970 to 2040, read in order (the kept windows answer) and backwards
//! (each computed again); and on random instants in zones with unusual changes.

use proptest::prelude::*;

use crate::{Calendar, CalendarUnit};

const S: u64 = 1_000_000_000;
const HOUR: u64 = 3_600 * S;
/// 1970 to 2040 in Unix seconds.
const FROM: i64 = 0;
const UNTIL: i64 = 2_208_988_800;

/// Instants around each change of `zone`'s clocks in [`FROM`, `UNTIL`).
fn around_changes(zone: &str) -> Vec<u64> {
    let tz = jiff::tz::TimeZone::get(zone).expect("a zone of the database");
    let from = jiff::Timestamp::from_second(FROM).expect("in range");
    let mut probes = Vec::new();
    for change in tz.following(from) {
        let second = change.timestamp().as_second();
        if second >= UNTIL {
            break;
        }
        let Ok(at) = u64::try_from(change.timestamp().as_nanosecond()) else {
            continue;
        };
        probes.extend([at.saturating_sub(1), at, at + HOUR, at + 13 * HOUR]);
    }
    probes
}

fn assert_exact(calendar: &Calendar, instants: impl Iterator<Item = u64>) {
    for at in instants {
        assert_eq!(
            calendar.window(at),
            calendar.compute(at),
            "{calendar:?} at {at} ns"
        );
    }
}

#[test]
fn kept_windows_are_the_computed_ones_in_every_zone() {
    let zones: Vec<String> = jiff::tz::db().available().map(|n| n.to_string()).collect();
    assert!(
        zones.len() > 300,
        "the embedded database has {} zones",
        zones.len()
    );
    for zone in &zones {
        let probes = around_changes(zone);
        for unit in [CalendarUnit::Day, CalendarUnit::Week, CalendarUnit::Month] {
            let calendar = Calendar::new(unit, zone).expect("a zone of the database");
            assert_exact(&calendar, probes.iter().copied());
            assert_exact(&calendar, probes.iter().rev().copied());
        }
    }
}

/// Zones whose clocks changed in unusual ways: at midnight (Santiago, Havana), a skipped day
/// (Apia), half-hour changes (Lord Howe), a two-hour change (Troll), quarter-hour offsets
/// (Kathmandu, Chatham), a zone moved across the date line (Kiritimati).
const ODD_ZONES: [&str; 9] = [
    "America/Santiago",
    "America/Havana",
    "Pacific/Apia",
    "Australia/Lord_Howe",
    "Antarctica/Troll",
    "Asia/Kathmandu",
    "Pacific/Chatham",
    "Pacific/Kiritimati",
    "Europe/Berlin",
];

fn unit() -> impl Strategy<Value = CalendarUnit> {
    prop::sample::select(CalendarUnit::ALL.to_vec())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn instants_near_one_another_get_the_computed_window(
        zone in 0..ODD_ZONES.len(),
        unit in unit(),
        base in 0..4_102_444_800_u64,
        steps in proptest::collection::vec(-(40 * 86_400_i64)..40 * 86_400, 1..40),
    ) {
        let calendar = Calendar::new(unit, ODD_ZONES[zone]).expect("known zone");
        let mut at = base * S;
        for step in steps {
            at = at.saturating_add_signed(step * 1_000_000_000 / 3);
            prop_assert_eq!(calendar.window(at), calendar.compute(at), "at {}", at);
        }
    }
}
