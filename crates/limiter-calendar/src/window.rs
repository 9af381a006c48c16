//! [`Window`]: one window of a calendar, its number and its bounds.

/// One window of a calendar: its number (counted from the unit that holds 1970-01-01 in the
/// zone) and its bounds in nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The window's number: days, weeks, months or years since the zone's 1970 start.
    pub index: u64,
    /// Where it starts (inclusive).
    pub start_unix_ns: u64,
    /// Where the next starts (exclusive).
    pub end_unix_ns: u64,
}
