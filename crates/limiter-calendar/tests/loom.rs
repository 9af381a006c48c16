//! Loom models of the window cache's sequence lock, through [`Calendar::window`]: callers
//! racing to keep their windows, and a reader racing them, each get exactly the window its
//! instant is in (a torn read would mix one window's number with another's bounds). Run with
//! `cargo xtask loom`.
#![cfg(limiter_loom)]

// The calendar is shared by a std `Arc`: the atomics under test are the cache's (loom's under
// `limiter_loom`); the handle's count is not part of the protocol.
use std::sync::Arc;

use limiter_calendar::{Calendar, CalendarUnit, Window};
use loom::thread;

const DAY: u64 = 86_400 * 1_000_000_000;
/// 2026-03-28 12:00 UTC: the day before Berlin springs forward.
const NOON: u64 = 1_774_699_200 * 1_000_000_000;

fn berlin_days() -> Calendar {
    Calendar::new(CalendarUnit::Day, "Europe/Berlin").expect("known zone")
}

/// The window of `at`, computed by a calendar of its own (nothing kept yet).
fn computed(at: u64) -> Window {
    berlin_days().window(at).expect("in range")
}

#[test]
fn callers_racing_to_keep_their_windows_each_get_their_own() {
    loom::model(|| {
        let (first, far) = (NOON, NOON + 9 * DAY);
        let (want_first, want_far) = (computed(first), computed(far));
        let calendar = Arc::new(berlin_days());
        let other = Arc::clone(&calendar);
        let racer = thread::spawn(move || other.window(far));
        let here = calendar.window(first);
        assert_eq!(here, Some(want_first));
        assert_eq!(racer.join().unwrap(), Some(want_far));
        // Whichever pair was kept (or none), it is whole.
        assert_eq!(calendar.window(first + 1), Some(want_first));
        assert_eq!(calendar.window(far + 1), Some(want_far));
    });
}

#[test]
fn a_reader_racing_a_caller_that_keeps_another_window_reads_one_whole() {
    loom::model(|| {
        // The kept pair: this day (23 hours, the spring change) and the next.
        let (kept, next, far) = (NOON, NOON + DAY, NOON + 9 * DAY);
        let (want_kept, want_next, want_far) = (computed(kept), computed(next), computed(far));
        let calendar = Arc::new(berlin_days());
        assert_eq!(calendar.window(kept), Some(want_kept));
        let other = Arc::clone(&calendar);
        let reader = thread::spawn(move || (other.window(next), other.window(kept + 1)));
        assert_eq!(calendar.window(far), Some(want_far));
        let (read_next, read_kept) = reader.join().unwrap();
        assert_eq!(read_next, Some(want_next));
        assert_eq!(read_kept, Some(want_kept));
    });
}
