//! Calendar quotas on a real clock: zones whose next boundary (a midnight, a month's end) is at
//! least [`ROOM_MS`] away whenever a test runs, so no quota starts again mid-test and a
//! quota's boundary stays later than any bucket's refill beside it (an answer's reset is the
//! later of the two). A test that named one zone failed in the 40 minutes before its month
//! ended: a bucket beside the quota was full again after the month's end, so the reset read
//! the clock.

use super::windows::{HOUR_MS, unix_ms};

/// An hour: more than any bucket in these tests takes to be full again (40 minutes at most).
pub(crate) const ROOM_MS: u64 = HOUR_MS;

/// A zone without daylight saving whose next midnight is at least [`ROOM_MS`] away, and that
/// midnight in Unix ms, worked out from its offset: Tokyo (UTC+9), or in the hour before
/// Tokyo's midnight Honolulu (UTC-10, whose midnight is then 18 hours off).
pub(crate) fn zone_with_a_midnight_ahead() -> (&'static str, u64) {
    zone_with_a_midnight_ahead_of(unix_ms())
}

/// [`zone_with_a_midnight_ahead`] at `now` (Unix ms).
fn zone_with_a_midnight_ahead_of(now: u64) -> (&'static str, u64) {
    let day = 86_400_000;
    [("Asia/Tokyo", 9_i64), ("Pacific/Honolulu", -10)]
        .into_iter()
        .map(|(zone, hours)| {
            let offset = hours * 3_600_000;
            let local = now as i64 + offset;
            (zone, (local.div_euclid(day) * day + day - offset) as u64)
        })
        .find(|&(_, midnight)| midnight >= now + ROOM_MS)
        .expect("Tokyo's and Honolulu's midnights are 19 hours apart")
}

/// Berlin, or in the last hour of its month Honolulu (whose month then ends 11 or 12 hours
/// later), and where its month ends: at least [`ROOM_MS`] ahead.
pub(crate) fn zone_with_a_month_ahead() -> (&'static str, u64) {
    zone_with_a_month_ahead_of(unix_ms())
}

/// [`zone_with_a_month_ahead`] at `now` (Unix ms).
fn zone_with_a_month_ahead_of(now: u64) -> (&'static str, u64) {
    ["Europe/Berlin", "Pacific/Honolulu"]
        .into_iter()
        .map(|zone| (zone, month_end_ms(zone, now)))
        .find(|&(_, end)| end >= now + ROOM_MS)
        .expect("Berlin's and Honolulu's months end 11 hours apart")
}

/// Where the month of `now` (Unix ms) ends in `zone`, in Unix ms (from the embedded time zone
/// database).
fn month_end_ms(zone: &str, now: u64) -> u64 {
    let month = limiter_calendar::Calendar::new(limiter_calendar::CalendarUnit::Month, zone)
        .expect("known zone");
    let now_ns = now.saturating_mul(1_000_000);
    month.window(now_ns).expect("in range").end_unix_ns / 1_000_000
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-01T00:00:00Z: Berlin's December starts an hour before it, Tokyo's day 9 hours
    /// before, Honolulu's 10 hours after.
    const DECEMBER_UTC: u64 = 1_796_083_200_000;
    const HOUR: u64 = HOUR_MS;

    #[test]
    fn a_zone_whose_boundary_is_near_gives_way_to_one_far_off() {
        let berlin_month = DECEMBER_UTC - HOUR;
        assert_eq!(
            zone_with_a_month_ahead_of(berlin_month - 2 * HOUR),
            ("Europe/Berlin", berlin_month)
        );
        // 40 minutes before Berlin's month ends (when a test naming Berlin failed).
        let (zone, end) = zone_with_a_month_ahead_of(berlin_month - 40 * 60_000);
        assert_eq!((zone, end), ("Pacific/Honolulu", DECEMBER_UTC + 10 * HOUR));

        let tokyo_midnight = DECEMBER_UTC - 9 * HOUR;
        assert_eq!(
            zone_with_a_midnight_ahead_of(tokyo_midnight - 2 * HOUR),
            ("Asia/Tokyo", tokyo_midnight)
        );
        assert_eq!(
            zone_with_a_midnight_ahead_of(tokyo_midnight - HOUR / 2),
            ("Pacific/Honolulu", DECEMBER_UTC + 10 * HOUR)
        );
    }
}
