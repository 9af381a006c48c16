//! A calendar limit and the clock it reads: a stack refuses one on a clock that does not keep
//! the wall clock's rate (its windows would end early or late by the clock's drift), when built
//! and when a plan holding one is added while it serves, naming the layer, the plan and the
//! fix; a limiter built from a counter refuses one too; the clocks say which keep that rate,
//! wrappers as their source.

use std::sync::Arc;

use limiter_calendar::{Calendar, CalendarCounter, CalendarUnit};
use limiter_core::{
    Algorithm, Clock, ClockSource, CoarseClock, DefaultClock, Limit, ManualClock, MonotonicClock,
    TscClock, unix_origin,
};
use limiter_stack::{BuildError, Kind, Layer, Plan, Stack};

/// A clock like the time-stamp counter's: readings from a manual clock, at a rate it does not
/// promise is the wall clock's.
#[derive(Clone, Debug, Default)]
struct Drifting(ManualClock);

impl Clock for Drifting {
    fn now(&self) -> u64 {
        self.0.now()
    }
    fn keeps_wall_rate(&self) -> bool {
        false
    }
}

/// A clock's reading 0 in Unix time, 2026-04-01 in Berlin (a test's clock starts there).
const APRIL: u64 = 1_774_994_400 * 1_000_000_000;

/// `count` a month in Berlin, on a clock whose reading 0 is `origin` in Unix time.
fn monthly(count: u64, origin: u64) -> CalendarCounter {
    let month = Calendar::new(CalendarUnit::Month, "Europe/Berlin").expect("known zone");
    CalendarCounter::new(count, month, origin).expect("valid")
}

/// Per customer a rate and a month's quota (on a clock whose reading 0 is `origin`).
fn customer(origin: u64) -> Layer<&'static str, String> {
    Layer::keyed("customer", |c: &&str| Some(c.to_string()))
        .limit(Kind::TokenBucket, Limit::per_second(10))
        .algorithm(monthly(1_000, origin))
}

#[test]
fn a_calendar_limit_is_refused_on_a_clock_off_the_wall_rate_naming_the_fix() {
    let refused = Stack::builder()
        .layer(Layer::global("all").limit(Kind::TokenBucket, Limit::per_second(100)))
        .layer(customer(APRIL))
        .clock(Drifting::default())
        .build()
        .expect_err("a drifting clock");
    assert_eq!(
        refused,
        BuildError::CalendarClock {
            layer: "customer".into(),
            plan: "customer".into(),
        }
    );
    let message = refused.to_string();
    assert!(message.contains("layer `customer`"), "{message}");
    assert!(
        message.contains(".clock(MonotonicClock::new())"),
        "{message}"
    );
    // The same layers on a clock the OS keeps at the wall's rate, or on a test's clock.
    let os_clock = MonotonicClock::new();
    let on_os_clock = Stack::builder()
        .layer(customer(unix_origin(&os_clock)))
        .clock(os_clock)
        .build()
        .expect("the OS clock keeps the wall's rate");
    assert!(on_os_clock.check(&"acme").expect("valid").is_allowed());
    Stack::builder()
        .layer(customer(APRIL))
        .clock(ManualClock::new())
        .build()
        .expect("a test's clock reads what the test sets");
    // Rate limits alone measure intervals: any clock will do.
    Stack::builder()
        .layer(
            Layer::keyed("ip", |c: &&str| Some(c.to_string()))
                .limit(Kind::TokenBucket, Limit::per_second(10)),
        )
        .clock(Drifting::default())
        .build()
        .expect("no calendar");
}

#[test]
fn the_default_clock_takes_a_calendar_only_where_it_reads_the_os_clock() {
    let built: Result<Stack<&str, String>, _> = Stack::builder().layer(customer(APRIL)).build();
    let window =
        limiter_calendar::CalendarWindow::from_algorithm(monthly(5, APRIL), DefaultClock::new());
    match DefaultClock::new().source() {
        ClockSource::TimeStampCounter => {
            assert!(matches!(built, Err(BuildError::CalendarClock { .. })));
            assert!(window.is_err());
        }
        ClockSource::OsClock => assert!(built.is_ok() && window.is_ok()),
    }
}

/// A stack of one layer open to plans added while it serves, on `clock`.
fn tiers<C: Clock>(clock: C) -> Stack<&'static str, String, C> {
    Stack::builder()
        .layer(
            Layer::keyed("customer", |c: &&str| Some(c.to_string())).open_plans(4, 1, |_: &&str| 0),
        )
        .clock(clock)
        .build()
        .expect("an open layer")
}

#[test]
fn a_plan_counting_by_the_calendar_is_refused_when_added_on_such_a_clock() {
    let drifting: Stack<&str, String, Drifting> = tiers(Drifting::default());
    let month = Plan::new("monthly").algorithm(monthly(1_000, APRIL));
    assert_eq!(
        drifting.add_plan(0, month).expect_err("a drifting clock"),
        BuildError::CalendarClock {
            layer: "customer".into(),
            plan: "monthly".into(),
        }
    );
    let rate = Plan::new("per second").limit(Kind::TokenBucket, Limit::per_second(5));
    assert_eq!(drifting.add_plan(0, rate).expect("no calendar"), 0);
    let manual: Stack<&str, String, ManualClock> = tiers(ManualClock::new());
    let month = Plan::new("monthly").algorithm(monthly(1_000, APRIL));
    assert_eq!(manual.add_plan(0, month).expect("a test's clock"), 0);
    assert!(manual.check(&"acme").expect("valid").is_allowed());
}

#[test]
fn clocks_say_whether_they_keep_the_wall_rate_and_wrappers_as_their_source() {
    assert!(MonotonicClock::new().keeps_wall_rate());
    assert!(ManualClock::new().keeps_wall_rate());
    let tsc = TscClock::new();
    assert_eq!(
        tsc.keeps_wall_rate(),
        tsc.source() == ClockSource::OsClock,
        "the counter runs at one calibration's rate"
    );
    assert!(!Drifting::default().keeps_wall_rate());
    assert!(!Arc::new(Drifting::default()).keeps_wall_rate());
    let by_reference = |clock: &Drifting| -> bool { Clock::keeps_wall_rate(&clock) };
    assert!(!by_reference(&Drifting::default()));
    let boxed: Box<dyn Clock> = Box::new(Drifting::default());
    assert!(!boxed.keeps_wall_rate());
    assert!(!CoarseClock::over(Drifting::default()).keeps_wall_rate());
    assert!(CoarseClock::over(MonotonicClock::new()).keeps_wall_rate());
}

#[test]
fn only_a_calendar_reads_unix_time() {
    assert!(monthly(1, APRIL).reads_unix_time());
    let origin = unix_origin(&MonotonicClock::new());
    let day = Calendar::new(CalendarUnit::Day, "UTC").expect("known zone");
    assert!(
        CalendarCounter::new(1, day, origin)
            .expect("valid")
            .reads_unix_time()
    );
    let bucket = limiter_token_bucket::Gcra::new(Limit::per_second(1)).expect("valid");
    assert!(!bucket.reads_unix_time());
}

#[test]
fn a_counter_on_a_clock_finds_its_origin_and_refuses_a_drifting_one() {
    let day = || Calendar::new(CalendarUnit::Day, "UTC").expect("known zone");
    let clock = MonotonicClock::new();
    let counter = CalendarCounter::on_clock(5, day(), &clock).expect("the OS clock");
    // Its windows are the wall clock's: the day now in the OS clock's reading is today's.
    let window = counter.window_at(clock.now()).expect("in range");
    let origin = unix_origin(&clock);
    assert_eq!(
        counter.window_at(0).expect("in range").start_unix_ns,
        CalendarCounter::new(5, day(), origin)
            .expect("valid")
            .window_at(0)
            .expect("in range")
            .start_unix_ns
    );
    let today = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
        / 86_400;
    assert!(window.start_unix_ns / 86_400_000_000_000 >= today.saturating_sub(1));
    assert!(window.start_unix_ns / 86_400_000_000_000 <= today);
    let refused = CalendarCounter::on_clock(5, day(), &Drifting::default())
        .expect_err("a drifting clock")
        .to_string();
    assert!(refused.contains("5 per 1d in UTC"), "{refused}");
    assert!(refused.contains("read `MonotonicClock`"), "{refused}");
    assert!(CalendarCounter::on_clock(0, day(), &clock).is_err());
}

#[test]
fn a_limiter_built_from_a_counter_refuses_a_drifting_clock_and_takes_the_others() {
    use limiter_calendar::{CalendarWindow, KeyedCalendarWindow};
    use limiter_core::DirectLimiter;
    use limiter_store::ShardedStore;

    // A counter built with a raw origin (`new`) is checked where it meets its clock.
    let refused = CalendarWindow::from_algorithm(monthly(5, APRIL), Drifting::default())
        .expect_err("a drifting clock")
        .to_string();
    assert!(
        refused.starts_with("invalid limit for the calendar window: it turns the clock's readings"),
        "{refused}"
    );
    assert!(refused.contains("read `MonotonicClock`"), "{refused}");
    let keyed: Result<KeyedCalendarWindow<u8, Drifting>, _> = KeyedCalendarWindow::from_algorithm(
        monthly(5, APRIL),
        Drifting::default(),
        ShardedStore::new(),
    );
    assert!(keyed.is_err());

    // The clocks that keep the wall's rate build, and the limiter counts.
    let clock = ManualClock::new();
    let quota = CalendarWindow::from_algorithm(monthly(2, APRIL), clock.clone()).expect("exact");
    assert!(quota.check_n(2).expect("decides").is_allowed());
    assert!(quota.check().expect("decides").is_denied());
    let keyed: KeyedCalendarWindow<u8, MonotonicClock> = KeyedCalendarWindow::from_algorithm(
        monthly(5, unix_origin(&MonotonicClock::new())),
        MonotonicClock::new(),
        ShardedStore::new(),
    )
    .expect("the OS clock");
    assert!(keyed.check_key(&1).expect("decides").is_allowed());

    // An algorithm that reads no Unix time takes any clock.
    let bucket = limiter_token_bucket::Gcra::new(Limit::per_second(1)).expect("valid");
    let direct = DirectLimiter::from_algorithm(bucket, Drifting::default()).expect("a rate limit");
    assert!(direct.check().expect("decides").is_allowed());
}
