//! [`Clock`]: where limiters read time, as integer nanoseconds since the clock's own epoch.
//!
//! [`DefaultClock`] ([`TscClock`]) reads the processor's time-stamp counter through quanta where
//! the counter is invariant, as governor does, and the OS clock where it is not;
//! [`MonotonicClock`] reads `std::time::Instant`; [`CoarseClock`] reads one shared atomic that
//! the caller or a background thread refreshes (cheaper, and late by up to a refresh);
//! [`ManualClock`] is moved by hand in tests. Library code reads time only through this trait.
//!
//! # Windows aligned to the Unix epoch
//!
//! The OS-backed clocks ([`DefaultClock`], [`MonotonicClock`], and [`CoarseClock`] over them)
//! do not start at 0: a new clock's first reading is the time since the start of the current
//! Unix week ([`unix_week_phase`], at most 7 days), and readings advance monotonically from
//! there. A window counter numbers its windows `now / period`, so every window whose period
//! divides a week (seconds, minutes, hours, a day, a week, and any whole number of milliseconds
//! dividing 604,800,000) starts exactly where the Unix epoch's windows start: a one-minute
//! window ends on the minute, a day's at 00:00 UTC, as Redis's scripts (which read `TIME`) and
//! envoy's reference service count. Other periods are aligned to the start of the week the
//! clock was made in. The monotonic clocks are slewed by NTP as the wall clock is, but not
//! stepped: a wall clock set by hand later drifts from the windows by that step.

use core::time::Duration;
use std::time::Instant;

use crate::sync::{Arc, AtomicU64, Ordering};

/// A source of time: nanoseconds since the clock's own epoch.
///
/// A reading may be earlier than a previous one (a manual clock set back, a broken source);
/// limiters never panic on it and never admit more because of it.
pub trait Clock: Send + Sync {
    /// Nanoseconds since this clock's epoch.
    fn now(&self) -> u64;

    /// Whether readings advance at the OS wall clock's rate (as the system clock is slewed), so
    /// a reading turned into Unix time ([`unix_origin`] plus the reading) stays on the wall
    /// clock however long the process runs. What counts by the calendar needs it: a stack
    /// refuses a calendar limit on a clock that does not. `true` unless the clock says
    /// otherwise: [`TscClock`] on the time-stamp counter keeps one calibration's rate (16 ppm
    /// off on the development VM, half a minute a month).
    fn keeps_wall_rate(&self) -> bool {
        true
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    fn now(&self) -> u64 {
        (**self).now()
    }
    fn keeps_wall_rate(&self) -> bool {
        (**self).keeps_wall_rate()
    }
}

impl<C: Clock + ?Sized> Clock for std::sync::Arc<C> {
    fn now(&self) -> u64 {
        (**self).now()
    }
    fn keeps_wall_rate(&self) -> bool {
        (**self).keeps_wall_rate()
    }
}

impl<C: Clock + ?Sized> Clock for Box<C> {
    fn now(&self) -> u64 {
        (**self).now()
    }
    fn keeps_wall_rate(&self) -> bool {
        (**self).keeps_wall_rate()
    }
}

/// The length of the week the OS-backed clocks start in, in nanoseconds.
pub const WEEK_NANOS: u64 = 7 * 24 * 60 * 60 * 1_000_000_000;

/// Nanoseconds since the start of the current Unix week (Thursday 00:00 UTC, as the Unix
/// epoch's weeks run): where the OS-backed clocks' readings begin. A window counter numbers
/// its windows `now / period`, so every window whose period divides a week (seconds, minutes,
/// hours, a day, a week) then starts where the Unix epoch's windows start, as Redis's scripts
/// (which read `TIME`) and envoy's reference service count; other periods are aligned to the
/// start of the week the clock was made in. 0 if the wall clock reads before 1970.
pub fn unix_week_phase() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| {
            let nanos = since.as_nanos() % u128::from(WEEK_NANOS);
            // Below WEEK_NANOS, so it fits.
            u64::try_from(nanos).unwrap_or(0)
        })
}

/// The Unix time, in nanoseconds, of `clock`'s reading 0, for a clock whose readings count from
/// the start of a Unix week ([`DefaultClock`] and [`MonotonicClock`], which begin at
/// [`unix_week_phase`]): the week boundary nearest the wall clock less the reading, so drift of
/// a few ns (or seconds) between the two clocks cannot move it. For reporting when a decision
/// was made, and reading a caller's Unix time as a reading; decisions never read the wall
/// clock. A [`ManualClock`] gets the start of the current week (or the next, within half a week
/// of it).
pub fn unix_origin(clock: &impl Clock) -> u64 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let origin = wall.saturating_sub(clock.now());
    origin.saturating_add(WEEK_NANOS / 2) / WEEK_NANOS * WEEK_NANOS
}

/// Monotonic time from `std::time::Instant` (the OS clock). Its readings begin at
/// [`unix_week_phase`] when it is made, so windows are aligned to the Unix epoch (see
/// [`unix_week_phase`]).
///
/// A reading asks the OS (a vDSO call on Linux: 20 to 40 ns on the development VMs, more than a
/// whole check). The [`DefaultClock`] reads the time-stamp counter instead where it can; pick
/// this one to rule the counter out. Copies share the epoch, so limiters built from copies of one
/// clock agree on time.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    epoch: Instant,
    /// The reading at `epoch`: the time since the start of that Unix week.
    start: u64,
}

impl MonotonicClock {
    /// A clock whose first reading is the time since the start of this Unix week.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
            start: unix_week_phase(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now(&self) -> u64 {
        // 2^64 ns is about 584 years; saturate rather than wrap past it.
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .saturating_add(self.start)
    }
}

/// The clock every limiter, store and stack uses when none is named: see [`TscClock`].
pub type DefaultClock = TscClock;

/// Where a [`TscClock`] reads time from: [`TscClock::source`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClockSource {
    /// The processor's invariant time-stamp counter (one `rdtsc` and a multiply a reading).
    TimeStampCounter,
    /// The OS's monotonic clock, where the counter is missing or not invariant.
    OsClock,
}

/// Monotonic time from the processor's time-stamp counter, through
/// [quanta](https://docs.rs/quanta) (the source governor reads by default). It is the
/// [`DefaultClock`]. Its readings begin at [`unix_week_phase`] when it is made, so windows are
/// aligned to the Unix epoch (see [`unix_week_phase`]).
///
/// A reading is one `rdtsc` and a multiply: on the development VM 9.7 ns against 26.5 ns for
/// [`MonotonicClock`], which is most of a check's cost. [`TscClock::source`] says which source
/// this machine gave it. What it trades: quanta calibrates the
/// counter against the OS clock once per process (the first `TscClock::new` takes a few
/// milliseconds), so its rate keeps that calibration's error for the life of the process: 16
/// ppm on the development VM, whose readings drifted from the OS clock by 1.4 s a day. A limit
/// measures intervals, which that moves by 16 µs a second; a service that reports or reads Unix
/// times for days (`limiterd`) reads [`MonotonicClock`] instead, which the OS keeps at the
/// system clock's rate. It uses the counter only where the processor says it is invariant (the
/// same rate on every core, in every power state); elsewhere, and on other architectures, it
/// reads the OS clock, so it is never worse than `MonotonicClock` by much. A reading taken on
/// one core may trail one just taken on another by the cores' counter skew (nanoseconds): a
/// limiter then sees time stand still or step back by that much, which only ever delays a
/// refill, never admits more.
///
/// Copies share the epoch and the calibration.
///
/// ```
/// use limiter_core::{Clock, ClockSource, TscClock};
///
/// let clock = TscClock::new();
/// let copy = clock.clone();
/// let first = clock.now();
/// assert!(copy.now() >= first);
/// // Where the counter is not invariant (or on another architecture), the OS clock:
/// println!("reading {:?}", clock.source());
/// assert!(matches!(clock.source(), ClockSource::TimeStampCounter | ClockSource::OsClock));
/// ```
#[derive(Clone, Debug)]
pub struct TscClock {
    clock: quanta::Clock,
    epoch: u64,
    /// The reading at `epoch`: the time since the start of that Unix week.
    start: u64,
    /// Nanoseconds per raw reading, in 32.32 fixed point: quanta's own calibration, read once
    /// (`2^32` for the OS clock, whose raw readings are nanoseconds already).
    scale: u64,
}

impl TscClock {
    /// A clock whose first reading is the time since the start of this Unix week
    /// (calibrating the counter if this process has not yet).
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        // What quanta makes of 2^32 raw ticks: the scale, to 32 fractional bits (a relative
        // error below 10^-9, against a calibration good to about 10^-6).
        let scale = clock.delta_as_nanos(0, 1 << 32);
        let epoch = clock.raw();
        Self {
            clock,
            epoch,
            start: unix_week_phase(),
            scale,
        }
    }

    /// Whether this clock reads the time-stamp counter or, where the processor's counter is not
    /// invariant (or missing), the OS clock.
    pub fn source(&self) -> ClockSource {
        // quanta scales counter ticks by its calibration and passes OS nanoseconds through
        // unchanged: a scale of exactly one is the OS clock (a counter at exactly 1 GHz would
        // read the same, and is as fast).
        if self.scale == 1 << 32 {
            ClockSource::OsClock
        } else {
            ClockSource::TimeStampCounter
        }
    }
}

impl Default for TscClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for TscClock {
    #[inline]
    fn now(&self) -> u64 {
        // Saturates at 0 for a raw reading behind the epoch (another core's skew). The scaling
        // is done here, inline, rather than by quanta's out-of-line `delta_as_nanos`.
        let ticks = self.clock.raw().saturating_sub(self.epoch);
        let nanos = (u128::from(ticks) * u128::from(self.scale)) >> 32;
        u64::try_from(nanos)
            .unwrap_or(u64::MAX)
            .saturating_add(self.start)
    }

    /// Only where it reads the OS clock: the counter runs at one calibration's rate.
    fn keeps_wall_rate(&self) -> bool {
        self.source() == ClockSource::OsClock
    }
}

/// A clock moved by hand, for tests: cheap to clone, and every clone shares the same time.
///
/// ```
/// use std::time::Duration;
/// use limiter_core::{Clock, ManualClock};
///
/// let clock = ManualClock::new();
/// let shared = clock.clone();
/// clock.advance(Duration::from_millis(5));
/// assert_eq!(shared.now(), 5_000_000);
/// clock.set(1); // time may also be set backwards
/// assert_eq!(shared.now(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct ManualClock {
    nanos: Arc<AtomicU64>,
}

impl ManualClock {
    /// A clock reading 0.
    pub fn new() -> Self {
        Self::starting_at(0)
    }

    /// A clock reading `nanos`.
    pub fn starting_at(nanos: u64) -> Self {
        Self {
            nanos: Arc::new(AtomicU64::new(nanos)),
        }
    }

    /// Moves time forward by `by`, saturating at `u64::MAX` nanoseconds.
    pub fn advance(&self, by: Duration) {
        self.advance_nanos(u64::try_from(by.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Moves time forward by `nanos`, saturating at `u64::MAX`.
    pub fn advance_nanos(&self, nanos: u64) {
        // Relaxed: the reading is a value, not a flag guarding other memory; tests that need a
        // reading to be seen by another thread order it with their own join or barrier.
        let _ = self
            .nanos
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_add(nanos))
            });
    }

    /// Sets the reading to `nanos`, which may be earlier than the current one.
    pub fn set(&self, nanos: u64) {
        // Relaxed: as in `advance_nanos`.
        self.nanos.store(nanos, Ordering::Relaxed);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for ManualClock {
    fn now(&self) -> u64 {
        // Relaxed: pairs with nothing; see `advance_nanos`.
        self.nanos.load(Ordering::Relaxed)
    }
}

/// A clock read from one shared atomic: a reading is a single relaxed load (about 1 ns),
/// where [`MonotonicClock`] asks the OS's monotonic clock each time (tens of ns). The time is
/// published by [`CoarseClock::refresh`] (call it from an event loop's tick) or by a background
/// thread ([`CoarseClock::refreshed_every`]).
///
/// What it trades: a reading lags real time by up to one refresh. A limiter on it sees less
/// time pass than has passed, so it refills late: it never admits more than the limit, but
/// may deny a call that a fresh clock would admit, for at most one refresh interval's worth of
/// refill. Pick an interval well below the shortest period you limit (1 ms for limits of a
/// second or longer). Readings never go backwards, even when refreshes race.
///
/// ```
/// use limiter_core::{Clock, CoarseClock, ManualClock};
///
/// let source = ManualClock::starting_at(5);
/// let clock = CoarseClock::over(source.clone());
/// assert_eq!(clock.now(), 5); // read once when built
/// source.advance_nanos(10);
/// assert_eq!(clock.now(), 5); // late until refreshed
/// clock.refresh();
/// assert_eq!(clock.now(), 15);
/// ```
#[cfg(not(limiter_loom))]
#[derive(Clone, Debug)]
pub struct CoarseClock<S = MonotonicClock> {
    shared: Arc<Coarse<S>>,
}

#[cfg(not(limiter_loom))]
#[derive(Debug)]
struct Coarse<S> {
    source: S,
    nanos: AtomicU64,
}

#[cfg(not(limiter_loom))]
impl<S: Clock> Coarse<S> {
    fn refresh(&self) -> u64 {
        let now = self.source.now();
        // Relaxed: the value is the whole message; `fetch_max` keeps racing refreshes (and a
        // source that steps back) from moving the reading backwards.
        let before = self.nanos.fetch_max(now, Ordering::Relaxed);
        before.max(now)
    }
}

#[cfg(not(limiter_loom))]
impl CoarseClock {
    /// A coarse clock over a new [`MonotonicClock`], read once now; refresh it yourself.
    pub fn new() -> Self {
        Self::over(MonotonicClock::new())
    }

    /// A coarse clock over a new [`MonotonicClock`], refreshed every `interval` by a
    /// background thread that ends (within one interval) once every clone is dropped.
    ///
    /// # Errors
    /// `InvalidInput` for a zero interval; the OS's error if the thread cannot start.
    pub fn refreshed_every(interval: Duration) -> std::io::Result<Self> {
        Self::over(MonotonicClock::new()).refreshing_every(interval)
    }
}

#[cfg(not(limiter_loom))]
impl Default for CoarseClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(not(limiter_loom))]
impl<S: Clock> CoarseClock<S> {
    /// A coarse clock over `source`, read once now.
    pub fn over(source: S) -> Self {
        let shared = Coarse {
            nanos: AtomicU64::new(source.now()),
            source,
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// Reads the source and publishes it; returns the reading now in force (never earlier
    /// than one already published).
    pub fn refresh(&self) -> u64 {
        self.shared.refresh()
    }

    /// Starts a background thread that refreshes this clock every `interval`, until every
    /// clone of it is dropped.
    ///
    /// # Errors
    /// `InvalidInput` for a zero interval; the OS's error if the thread cannot start.
    pub fn refreshing_every(self, interval: Duration) -> std::io::Result<Self>
    where
        S: 'static,
    {
        if interval.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "a coarse clock's refresh interval must be above zero (1 ms suits limits of a second or more)",
            ));
        }
        let weak = Arc::downgrade(&self.shared);
        std::thread::Builder::new()
            .name("coarse-clock".into())
            .spawn(move || {
                while let Some(shared) = weak.upgrade() {
                    shared.refresh();
                    drop(shared);
                    std::thread::sleep(interval);
                }
            })?;
        Ok(self)
    }
}

#[cfg(not(limiter_loom))]
impl<S: Clock> Clock for CoarseClock<S> {
    fn now(&self) -> u64 {
        // Relaxed: see `Coarse::refresh`.
        self.shared.nanos.load(Ordering::Relaxed)
    }

    /// As its source's.
    fn keeps_wall_rate(&self) -> bool {
        self.shared.source.keeps_wall_rate()
    }
}

#[cfg(all(test, not(limiter_loom)))]
mod tests {

    #[test]
    fn a_coarse_clock_lags_until_refreshed_and_never_goes_back() {
        let source = ManualClock::starting_at(100);
        let clock = CoarseClock::over(source.clone());
        let copy = clock.clone();
        source.advance_nanos(50);
        assert_eq!(copy.now(), 100);
        assert_eq!(clock.refresh(), 150);
        assert_eq!(copy.now(), 150);
        source.set(120);
        assert_eq!(
            clock.refresh(),
            150,
            "a source stepping back does not move it back"
        );
        assert_eq!(copy.now(), 150);
        let err = CoarseClock::over(source.clone())
            .refreshing_every(Duration::ZERO)
            .expect_err("zero interval");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    }

    #[test]
    fn racing_refreshes_and_readers_see_time_only_move_forward() {
        let source = ManualClock::new();
        let clock = CoarseClock::over(source.clone());
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..20_000 {
                    source.advance_nanos(3);
                }
            });
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..20_000 {
                        clock.refresh();
                    }
                });
            }
            s.spawn(|| {
                let mut last = 0;
                for _ in 0..50_000 {
                    let now = clock.now();
                    assert!(now >= last, "{now} after {last}");
                    last = now;
                }
            });
        });
        assert_eq!(clock.refresh(), 60_000);
    }

    #[test]
    fn the_background_thread_publishes_the_source() {
        let source = ManualClock::new();
        let clock = CoarseClock::over(source.clone())
            .refreshing_every(Duration::from_micros(100))
            .expect("a thread");
        source.set(42);
        // Waits for the thread to run, not for an amount of time.
        while clock.now() != 42 {
            std::thread::yield_now();
        }
        assert_eq!(clock.now(), 42);
    }
    use super::*;

    #[test]
    fn manual_clock_saturates_instead_of_overflowing() {
        let clock = ManualClock::starting_at(u64::MAX - 1);
        clock.advance(Duration::MAX);
        assert_eq!(clock.now(), u64::MAX);
    }

    /// How far `reading` (ns) is from the wall clock's place in its Unix week, across the
    /// week's wrap.
    fn off_the_wall(reading: u64) -> u64 {
        let wall = unix_week_phase();
        let diff = reading.abs_diff(wall);
        diff.min(WEEK_NANOS - diff % WEEK_NANOS)
    }

    #[test]
    fn os_clocks_read_the_time_since_the_start_of_the_unix_week() {
        // A clock counting from 0 would be off by the time since Thursday 00:00 UTC (up to a
        // week); an aligned one by the moment between the two readings. The bound is loose
        // (a second) for a loaded machine; the misalignment it catches is the whole phase.
        let second = 1_000_000_000;
        for reading in [
            MonotonicClock::new().now(),
            TscClock::new().now(),
            CoarseClock::new().now(),
        ] {
            assert!(
                off_the_wall(reading) < second,
                "reading {reading} is {} ns from the wall clock's {}",
                off_the_wall(reading),
                unix_week_phase()
            );
        }
        // And so a one-minute window ends on the minute: the phase within the minute agrees.
        let clock = DefaultClock::new();
        let minute = 60 * second;
        let (ours, wall) = (clock.now() % minute, unix_week_phase() % minute);
        let diff = ours.abs_diff(wall);
        assert!(diff.min(minute - diff) < second, "{ours} vs {wall}");
    }

    #[test]
    fn monotonic_clock_never_goes_back() {
        let clock = MonotonicClock::new();
        let first = clock.now();
        assert!(clock.now() >= first);
    }

    #[test]
    fn a_tsc_clock_counts_nanoseconds_at_the_os_clocks_pace() {
        // Both clocks measure one interval (spun through, never slept): a clock that returned
        // raw counter ticks, or scaled them wrongly, would be off by the counter's GHz.
        let tsc = TscClock::new();
        let os = MonotonicClock::new();
        let (tsc_start, os_start) = (tsc.now(), os.now());
        while os.now() - os_start < 20_000_000 {
            std::hint::spin_loop();
        }
        let (tsc_end, os_end) = (tsc.now(), os.now());
        let (tsc_took, os_took) = (tsc_end - tsc_start, os_end - os_start);
        assert!(
            tsc_took >= os_took / 2 && tsc_took <= os_took * 2,
            "the TSC clock counted {tsc_took} ns while the OS clock counted {os_took} ns"
        );
        // Copies share the epoch.
        assert!(tsc.clone().now() >= tsc_end);
    }
}
