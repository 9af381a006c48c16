//! The conformance checks every algorithm passes: the five checks from DESIGN.md, peeks and
//! denials that change nothing, records of usage that leave a debt, a clock that goes back, bad
//! input, and real-thread races.
//!
//! Each check panics with a message naming the limit and the step that failed; [`run_all`]
//! runs them all over the [`sample_limits`] an algorithm accepts.

use std::sync::Barrier;
use std::time::Duration;

use std::sync::atomic::{AtomicUsize, Ordering};

use limiter_core::{
    Algorithm, DecisionError, DirectLimiter, Limit, ManualClock, Recording, StateCell,
};
use limiter_store::{BoundedStore, KeyedLimiter, ShardedStore, Store};

use crate::model::Model;

/// A start well past zero, so that going back has room and is not mistaken for a fresh start.
pub const START_NS: u64 = 1 << 40;

/// How a limiter drained at [`START_NS`] comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refill {
    /// After this wait, exactly one more unit is admitted (token bucket, sliding window).
    OneUnit(Duration),
    /// After this wait, the whole count is admitted again at once (fixed window).
    Whole(Duration),
}

impl Refill {
    fn wait(self) -> Duration {
        match self {
            Refill::OneUnit(wait) | Refill::Whole(wait) => wait,
        }
    }

    fn units(self, limit: &Limit) -> u64 {
        match self {
            Refill::OneUnit(_) => 1,
            Refill::Whole(_) => limit.burst(),
        }
    }
}

/// Limits that cover whole and fractional refill intervals, bursts below, equal to and above
/// the count, and the extremes. Each algorithm runs the ones it accepts.
pub fn sample_limits() -> Vec<Limit> {
    let limit = |count, period_ns, burst| Limit::from_nanos(count, period_ns).with_burst(burst);
    vec![
        limit(10, 1_000_000_000, 10),
        limit(7, 1_000_000_000, 7),
        limit(7, 1_000_000_000, 3),
        limit(100, 60_000_000_000, 100),
        limit(100, 60_000_000_000, 250),
        limit(3, 10, 3),
        limit(3, 10, 1),
        limit(1, 1, 1),
        limit(1_000, 1_000, 1_000),
        limit(1_000_000_000, 1_000_000_000, 1_000_000),
    ]
}

/// Runs every check over every sample limit the algorithm accepts (at least four).
/// `refill(limit)` says how a limiter drained at [`START_NS`] comes back.
pub fn run_all<A: Algorithm, M: Model>(refill: fn(&Limit) -> Refill) {
    let limits: Vec<Limit> = sample_limits()
        .into_iter()
        .filter(|l| A::new(*l).is_ok())
        .collect();
    assert!(
        limits.len() >= 4,
        "{} accepts only {} sample limits",
        A::NAME,
        limits.len()
    );
    for limit in limits {
        full_admits_exactly_burst::<A>(limit);
        refill_returns_what_it_says::<A>(limit, refill(&limit));
        peek_changes_nothing::<A>(limit);
        denial_changes_nothing::<A>(limit);
        clock_backwards_never_admits_more::<A>(limit, refill(&limit));
        bad_input_is_an_error::<A>(limit);
        matches_model_on_a_drain_and_refill::<A, M>(limit);
        records_leave_a_debt::<A>(limit);
        keyed_checks::<A, _>(limit, ShardedStore::new);
        keyed_checks::<A, _>(limit, bounded_store);
        keyed_records::<A, _>(limit, ShardedStore::new);
        keyed_records::<A, _>(limit, bounded_store);
    }
    race_admits_exactly_burst::<A>(100, 50);
    race_records_and_checks::<A>(100, 50);
}

fn direct<A: Algorithm>(limit: Limit) -> (DirectLimiter<A, ManualClock>, ManualClock) {
    let clock = ManualClock::starting_at(START_NS);
    let limiter = DirectLimiter::with_clock(limit, clock.clone())
        .unwrap_or_else(|e| panic!("{} refused {limit}: {e}", A::NAME));
    (limiter, clock)
}

fn drain<A: Algorithm>(limiter: &DirectLimiter<A, ManualClock>) {
    let burst = limiter.algorithm().limit().burst();
    let taken = limiter.check_n(burst).expect("cost = burst is valid");
    assert!(
        taken.is_allowed(),
        "a full limiter admits its burst at once: {taken:?}"
    );
}

/// Exactly `units` single-unit calls are admitted, then one is denied (one weighted call stands
/// for the singles when there are very many).
fn expect_exactly<A: Algorithm>(
    limiter: &DirectLimiter<A, ManualClock>,
    units: u64,
    context: &str,
) {
    let singles = units.min(10_000);
    for unit in 1..=singles {
        let d = limiter.check().expect("valid");
        assert!(
            d.is_allowed(),
            "{context}: only {} of {units} units admitted",
            unit - 1
        );
        assert_eq!(
            d.remaining(),
            units - unit,
            "{context}: remaining after {unit}"
        );
    }
    if units > singles {
        assert!(
            limiter
                .check_n(units - singles)
                .expect("valid")
                .is_allowed(),
            "{context}: fewer than {units}"
        );
    }
    let d = limiter.check().expect("valid");
    assert!(
        d.is_denied(),
        "{context}: more than {units} units admitted: {d:?}"
    );
    assert!(
        d.retry_after() > Duration::ZERO,
        "{context}: denial without a wait"
    );
    assert_eq!(d.remaining(), 0, "{context}");
}

/// A full limiter admits exactly `burst` units one by one, counting down, then denies with a
/// positive `retry_after`.
pub fn full_admits_exactly_burst<A: Algorithm>(limit: Limit) {
    let (limiter, _) = direct::<A>(limit);
    expect_exactly(&limiter, limit.burst(), &format!("{limit}: a full limiter"));
}

/// After draining, the first unit comes back exactly at `retry_after`, which is the refill's
/// wait, and that wait brings back exactly the units it promises, no more.
pub fn refill_returns_what_it_says<A: Algorithm>(limit: Limit, refill: Refill) {
    let (limiter, clock) = direct::<A>(limit);
    drain(&limiter);
    let denied = limiter.check().expect("valid");
    assert!(denied.is_denied(), "{limit}: drained limiter admitted");
    let wait = refill.wait();
    assert_eq!(
        denied.retry_after(),
        wait,
        "{limit}: retry_after is not the refill wait"
    );
    clock.advance(wait - Duration::from_nanos(1));
    assert!(
        limiter.check().expect("valid").is_denied(),
        "{limit}: a unit came back before {wait:?}"
    );
    clock.advance_nanos(1);
    expect_exactly(
        &limiter,
        refill.units(&limit),
        &format!("{limit}: after {wait:?}"),
    );
}

/// A peek reports without consuming, however often it is repeated, and never inserts a key.
pub fn peek_changes_nothing<A: Algorithm>(limit: Limit) {
    let (limiter, _) = direct::<A>(limit);
    let before = limiter.peek().expect("valid");
    for _ in 0..3 {
        assert_eq!(
            limiter.peek().expect("valid"),
            before,
            "{limit}: a peek changed state"
        );
    }
    assert_eq!(before.remaining(), limit.burst());
    drain(&limiter);
    let empty = limiter.peek().expect("valid");
    assert_eq!(empty.remaining(), 0, "{limit}");
    assert_eq!(
        limiter.peek().expect("valid"),
        empty,
        "{limit}: a peek changed state"
    );
}

/// A denial writes nothing: repeating it gives the same answer, and waiting exactly its
/// `retry_after` admits the same cost.
pub fn denial_changes_nothing<A: Algorithm>(limit: Limit) {
    let (limiter, clock) = direct::<A>(limit);
    drain(&limiter);
    let cost = limit.burst();
    let first = limiter.check_n(cost).expect("valid");
    assert!(first.is_denied());
    for _ in 0..3 {
        assert_eq!(
            limiter.check_n(cost).expect("valid"),
            first,
            "{limit}: a denial changed state"
        );
    }
    clock.advance_nanos(first.retry_after_nanos() - 1);
    assert!(
        limiter.check_n(cost).expect("valid").is_denied(),
        "{limit}: admitted before retry_after"
    );
    clock.advance_nanos(1);
    assert!(
        limiter.check_n(cost).expect("valid").is_allowed(),
        "{limit}: denied at retry_after"
    );
}

/// A record of usage is never refused: at the limit a peek is still within it, a unit past it
/// leaves a debt (denied, nothing left, a positive wait), a peek then says over, the next
/// call waits exactly as long as the record said, a record above the burst is no error, and a
/// record within the limit answers and writes as the same admission would.
pub fn records_leave_a_debt<A: Algorithm>(limit: Limit) {
    let (limiter, clock) = direct::<A>(limit);
    drain(&limiter);
    let at_limit = limiter.peek().expect("valid");
    assert!(
        at_limit.is_allowed() && at_limit.remaining() == 0,
        "{limit}: a peek exactly at the limit is within it: {at_limit:?}"
    );
    let owed = limiter.record(1).expect("a record is never refused");
    assert!(
        owed.is_denied() && owed.remaining() == 0 && owed.retry_after_nanos() > 0,
        "{limit}: a record past the limit leaves a debt: {owed:?}"
    );
    let over = limiter.peek().expect("valid");
    assert!(
        over.is_denied(),
        "{limit}: a peek in debt is over: {over:?}"
    );
    clock.advance_nanos(owed.retry_after_nanos() - 1);
    assert!(
        limiter.check().expect("valid").is_denied(),
        "{limit}: admitted before the debt was paid back"
    );
    clock.advance_nanos(1);
    assert!(
        limiter.check().expect("valid").is_allowed(),
        "{limit}: denied when the record said one unit was back"
    );

    let (fresh, _) = direct::<A>(limit);
    let huge = fresh
        .record(u64::MAX)
        .expect("a record above the burst is no error");
    assert!(huge.is_denied(), "{limit}: {huge:?}");
    assert!(fresh.peek().expect("valid").is_denied());

    let (recorded, _) = direct::<A>(limit);
    let (checked, _) = direct::<A>(limit);
    let cost = limit.burst().div_ceil(2);
    assert_eq!(
        recorded.record(cost).expect("valid"),
        checked.check_n(cost).expect("valid"),
        "{limit}: a record within the limit is the same admission"
    );
    assert_eq!(
        recorded.peek().expect("valid"),
        checked.peek().expect("valid"),
        "{limit}: a record within the limit wrote another state"
    );
    assert_eq!(
        recorded.record(0).expect("valid"),
        recorded.peek().expect("valid"),
        "{limit}: a record of 0 is a peek"
    );
}

/// A bounded store with room for every key the checks use.
fn bounded_store() -> BoundedStore<u64> {
    BoundedStore::new(1_000).expect("a non-zero capacity")
}

fn keyed_on<A: Algorithm, St: Store<u64>>(
    limit: Limit,
    store: St,
) -> KeyedLimiter<A, u64, ManualClock, St> {
    KeyedLimiter::with_store(limit, ManualClock::starting_at(START_NS), store)
        .unwrap_or_else(|e| panic!("{} refused {limit}: {e}", A::NAME))
}

/// The keyed checks, on the store `new_store` builds: peeks and denials of new keys insert
/// nothing, draining one key leaves every other key full, and a key that is full again is
/// reclaimed without changing its next decision.
pub fn keyed_checks<A: Algorithm, St: Store<u64>>(limit: Limit, new_store: impl Fn() -> St) {
    let keyed = keyed_on::<A, St>(limit, new_store());
    assert!(keyed.peek_key(&1).expect("valid").is_allowed());
    assert!(keyed.is_empty(), "{limit}: a peek inserted a key");
    assert!(
        keyed
            .check_key_n(&1, limit.burst())
            .expect("valid")
            .is_allowed()
    );
    assert!(keyed.check_key(&1).expect("valid").is_denied());
    let other = keyed.check_key(&2).expect("valid");
    assert!(other.is_allowed(), "{limit}: key 2 affected by key 1");
    assert_eq!(other.remaining(), limit.burst() - 1);
    assert!(
        keyed.check_key(&1).expect("valid").is_denied(),
        "{limit}: key 1 refilled by key 2"
    );
    assert!(
        keyed.check_key_n(&3, limit.burst() + 1).is_err(),
        "{limit}: a cost over the burst was not an error"
    );
    assert_eq!(
        keyed.len(),
        2,
        "{limit}: a denial or an error inserted a key"
    );

    // Nothing is full yet: reclaiming drops nothing.
    assert_eq!(keyed.reclaim_full(), 0, "{limit}: reclaimed a key in use");
    // After a refill of both, both are full: reclaimed, and decided as before.
    let reference = keyed_on::<A, St>(limit, new_store());
    let _ = reference.check_key_n(&1, limit.burst());
    let refill_ns =
        u128::from(limit.burst()) * u128::from(limit.period_nanos()) / u128::from(limit.count());
    let full_again = u64::try_from(refill_ns)
        .unwrap_or(u64::MAX)
        .saturating_add(limit.period_nanos().saturating_mul(2));
    keyed.clock().advance_nanos(full_again);
    reference.clock().advance_nanos(full_again);
    assert_eq!(keyed.reclaim_full(), 2, "{limit}: full keys were kept");
    assert!(keyed.is_empty());
    assert_eq!(keyed.stats().reclaimed, 2);
    assert_eq!(
        keyed.check_key_n(&1, limit.burst()).expect("valid"),
        reference.check_key_n(&1, limit.burst()).expect("valid"),
        "{limit}: reclaiming a full key changed its decision"
    );
}

/// Keyed records, on the store `new_store` builds: a record inserts its key and leaves the
/// debt there alone, other keys untouched; a record of 0 inserts nothing.
pub fn keyed_records<A: Algorithm, St: Store<u64>>(limit: Limit, new_store: impl Fn() -> St) {
    let keyed = keyed_on::<A, St>(limit, new_store());
    assert!(keyed.record_key(&9, 0).expect("valid").is_allowed());
    assert!(keyed.is_empty(), "{limit}: a record of 0 inserted a key");
    let owed = keyed
        .record_key(&1, limit.burst().saturating_add(1))
        .expect("a record is never refused");
    assert!(owed.is_denied(), "{limit}: {owed:?}");
    assert_eq!(keyed.len(), 1, "{limit}: the record did not insert its key");
    assert!(keyed.check_key(&1).expect("valid").is_denied());
    assert!(keyed.peek_key(&1).expect("valid").is_denied());
    let other = keyed.check_key(&2).expect("valid");
    assert!(
        other.is_allowed() && other.remaining() == limit.burst() - 1,
        "{limit}: key 2 affected by key 1's debt"
    );
}

/// A clock that goes back never admits more than the drained state allows, and once it is
/// back where it was, decisions are as if it had never moved.
pub fn clock_backwards_never_admits_more<A: Algorithm>(limit: Limit, refill: Refill) {
    let (limiter, clock) = direct::<A>(limit);
    drain(&limiter);
    for back in [1, 1_000, START_NS] {
        clock.set(START_NS - back);
        assert!(
            limiter.check().expect("valid").is_denied(),
            "{limit}: admitted after going back {back} ns"
        );
    }
    clock.set(START_NS);
    clock.advance(refill.wait());
    expect_exactly(
        &limiter,
        refill.units(&limit),
        &format!("{limit}: after going back and returning"),
    );
}

/// Costs above the burst are an error, not a denial; extreme readings never panic.
pub fn bad_input_is_an_error<A: Algorithm>(limit: Limit) {
    let (limiter, clock) = direct::<A>(limit);
    for cost in [limit.burst().saturating_add(1), u64::MAX] {
        if cost > limit.burst() {
            assert_eq!(
                limiter.check_n(cost),
                Err(DecisionError::CostExceedsBurst {
                    cost,
                    burst: limit.burst()
                }),
                "{limit}"
            );
        }
    }
    clock.set(u64::MAX);
    // Either decided or refused as out of range; never a panic, never more than the burst.
    match limiter.check_n(limit.burst()) {
        Ok(d) => assert!(d.remaining() <= limit.burst()),
        Err(DecisionError::ClockOutOfRange { .. }) => {}
        Err(other) => panic!("{limit}: unexpected error at u64::MAX: {other}"),
    }
    clock.set(0);
    let _ = limiter.check().expect("cost 1 is valid");
}

/// A drain, a wait of one period, and a second drain agree with the reference model exactly
/// (for a limit the algorithm counts conservatively, they keep the model's bound and the
/// algorithm's own exact waits: see [`run_conservative`](crate::harness::run_conservative)).
pub fn matches_model_on_a_drain_and_refill<A: Algorithm, M: Model>(limit: Limit) {
    use crate::ops::Op;
    let period = limit.period_nanos();
    let ops = [
        Op::Check(limit.burst()),
        Op::Check(1),
        Op::Advance(period / 2),
        Op::Check(0),
        Op::Check(1),
        Op::Advance(period),
        Op::Check(limit.burst()),
        Op::Back(period),
        Op::Check(1),
    ];
    if let Err(e) = crate::harness::run_conservative::<A, M>(limit, START_NS, &ops) {
        panic!("{e}");
    }
}

/// `threads` real threads each ask once, at one instant, for a unit of a `burst`-unit limit,
/// directly and on one shared key: exactly `burst` are admitted.
pub fn race_admits_exactly_burst<A: Algorithm>(threads: usize, burst: u64) {
    let limit = Limit::per_hour(burst);
    let (limiter, _) = direct::<A>(limit);
    let admitted = race(threads, || limiter.check().expect("valid").is_allowed());
    assert_eq!(
        admitted,
        burst,
        "{} direct: {threads} racers on a {burst}-unit limit",
        A::NAME
    );

    race_on_store::<A, _>(limit, threads, ShardedStore::new());
    race_on_store::<A, _>(limit, threads, bounded_store());
}

/// `threads` real threads at one instant on one cell of a `burst`-unit limit, half recording a
/// unit each and half asking for one: checks are admitted only while the limit has room, every
/// record lands (none is lost to a race), and the word ends exactly as if the admitted checks
/// and the records had come one by one.
pub fn race_records_and_checks<A: Algorithm>(threads: usize, burst: u64) {
    let limit = Limit::per_hour(burst);
    let algorithm = A::new(limit).unwrap_or_else(|e| panic!("{} refused {limit}: {e}", A::NAME));
    let cell = StateCell::new(A::FRESH);
    let roles = AtomicUsize::new(0);
    let recorders = threads.div_ceil(2) as u64;
    let admitted = race(threads, || {
        // Relaxed: only hands out distinct numbers.
        if roles.fetch_add(1, Ordering::Relaxed).is_multiple_of(2) {
            let recorded = cell.apply(&Recording(&algorithm), 1, START_NS);
            assert!(recorded.is_ok(), "a record is never refused");
            false
        } else {
            cell.apply(&algorithm, 1, START_NS)
                .expect("valid")
                .is_allowed()
        }
    });
    assert!(
        admitted <= burst,
        "{}: admitted {admitted} of {burst}",
        A::NAME
    );
    let sequential = algorithm
        .record(A::FRESH, admitted + recorders, START_NS)
        .expect("valid")
        .next;
    assert_eq!(
        Some(cell.load()),
        sequential,
        "{}: {recorders} records and {admitted} admissions raced; a write was lost",
        A::NAME
    );
}

fn race_on_store<A: Algorithm, St: Store<u64>>(limit: Limit, threads: usize, store: St) {
    let keyed = keyed_on::<A, St>(limit, store);
    let admitted = race(threads, || keyed.check_key(&7).expect("valid").is_allowed());
    assert_eq!(
        admitted,
        limit.burst(),
        "{} keyed on {}: {threads} racers on a {}-unit key",
        A::NAME,
        std::any::type_name::<St>(),
        limit.burst()
    );
}

fn race(threads: usize, call: impl Fn() -> bool + Sync) -> u64 {
    let start = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    call()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| u64::from(h.join().expect("racer panicked")))
            .sum()
    })
}
