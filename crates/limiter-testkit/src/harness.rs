//! The operation-sequence harness: runs an algorithm's pure transition and a reference model
//! side by side and checks every invariant the design promises.

use limiter_core::{Algorithm, Decision, DecisionError, Limit, StateCell, Step};

use crate::model::Model;
use crate::ops::Op;

/// Runs `ops` from a fresh state at clock reading `start` against algorithm `A` and model `M`.
///
/// Checks, after every step: identical results (decision or error) for checks and records; a
/// denial and a peek write nothing, a record of a positive cost always writes; a denial has a
/// positive `retry_after` (for a record: the exact wait until one unit is admitted) and an
/// admission a zero one; `remaining` never exceeds the burst; and, over the whole run, the
/// admission bound [`Model::max_admitted`] for every span of the state's own time, counting the
/// units each record kept with the admitted ones. A refusal as `ClockOutOfRange` is accepted
/// only for a reading past the range it states. Returns a description of the first violation.
pub fn run<A: Algorithm, M: Model>(limit: Limit, start: u64, ops: &[Op]) -> Result<(), String> {
    let algorithm = A::new(limit).map_err(|e| format!("limit {limit} refused: {e}"))?;
    let mut model = M::new(limit);
    let mut state = A::FRESH;
    let mut now = start;
    let mut admissions = AdmissionLog::default();
    for (index, op) in ops.iter().enumerate() {
        let Some((cost, recorded)) = step_clock(*op, &mut now, 0, u64::MAX) else {
            continue;
        };
        let context = || format!("step {index} ({op:?}) at {now} ns on {limit}");
        let got = apply(&algorithm, state, cost, now, recorded);
        // Models have no clock range; an algorithm may refuse a reading past its stated range,
        // and then neither side decides anything.
        if let Err(DecisionError::ClockOutOfRange { now_ns, max_ns }) = got {
            if now_ns == now && now > max_ns {
                continue;
            }
            return Err(format!(
                "{}: refused {now_ns} as out of range {max_ns}",
                context()
            ));
        }
        let want = if recorded {
            model.record(cost, now)
        } else {
            model.decide(cost, now)
        };
        let got_decision = got.clone().map(|step| step.decision);
        if got_decision != want {
            return Err(format!(
                "{}: algorithm {got_decision:?}, model {want:?}",
                context()
            ));
        }
        let Ok(step) = got else { continue };
        state = checked_step::<A, M>(
            &algorithm,
            &mut admissions,
            (state, now),
            cost,
            recorded,
            step,
        )
        .map_err(|e| format!("{}: {e}", context()))?;
    }
    Ok(())
}

/// Like [`run`], for a limit the algorithm counts conservatively (its
/// [`accuracy`](Algorithm::accuracy) is not exact): decisions may differ from the exact model,
/// but every other check holds, the admission bound is the *exact* model's, and every denial's
/// `retry_after` is the algorithm's own exact first admitting instant (admitted then, denied one
/// nanosecond before, when nothing else consumes). An exact algorithm must also match the model
/// call for call, so this runs [`run`] for it.
///
/// Where the accuracy states a horizon (a wrapping window number), the claim holds for states
/// read within the horizon of their writing, either way, so every reading is kept within a
/// band of a quarter of the horizon around `start` (steps are cut short at its edges). Beyond
/// it a state is read as one written a horizon earlier or later, as the algorithm documents.
pub fn run_conservative<A: Algorithm, M: Model>(
    limit: Limit,
    start: u64,
    ops: &[Op],
) -> Result<(), String> {
    let algorithm = A::new(limit).map_err(|e| format!("limit {limit} refused: {e}"))?;
    let accuracy = algorithm.accuracy();
    if accuracy.is_exact() {
        return run::<A, M>(limit, start, ops);
    }
    let (low, high) = match accuracy.horizon_nanos() {
        Some(horizon) => {
            let low = start.min(u64::MAX - horizon / 4);
            (low, low + horizon / 4)
        }
        None => (0, u64::MAX),
    };
    let mut state = A::FRESH;
    let mut now = start;
    let mut admissions = AdmissionLog::default();
    for (index, op) in ops.iter().enumerate() {
        let Some((cost, recorded)) = step_clock(*op, &mut now, low, high) else {
            continue;
        };
        let context = || format!("step {index} ({op:?}) at {now} ns on {limit}");
        let step = match apply(&algorithm, state, cost, now, recorded) {
            Ok(step) => step,
            Err(DecisionError::ClockOutOfRange { now_ns, max_ns })
                if now_ns == now && now > max_ns =>
            {
                continue;
            }
            Err(DecisionError::CostExceedsBurst { cost: c, burst })
                if !recorded && c == cost && cost > limit.burst() && burst == limit.burst() =>
            {
                continue;
            }
            Err(e) => return Err(format!("{}: unexpected error {e}", context())),
        };
        state = checked_step::<A, M>(
            &algorithm,
            &mut admissions,
            (state, now),
            cost,
            recorded,
            step,
        )
        .map_err(|e| format!("{}: {e}", context()))?;
    }
    Ok(())
}

/// Moves the clock for an `Advance` or `Back` (within `[low, high]`) and returns `None`; for a
/// call, its cost and whether it records.
fn step_clock(op: Op, now: &mut u64, low: u64, high: u64) -> Option<(u64, bool)> {
    match op {
        Op::Advance(by) => {
            *now = now.saturating_add(by).min(high);
            None
        }
        Op::Back(by) => {
            *now = now.saturating_sub(by).max(low);
            None
        }
        Op::Check(cost) => Some((cost, false)),
        Op::Record(cost) => Some((cost, true)),
    }
}

/// The algorithm's step for a check, or for a record.
fn apply<A: Algorithm>(
    algorithm: &A,
    state: u64,
    cost: u64,
    now: u64,
    recorded: bool,
) -> Result<Step, DecisionError> {
    if recorded {
        algorithm.record(state, cost, now)
    } else {
        algorithm.decide(state, cost, now)
    }
}

/// Every check of one decided step taken at `now` on `state`: a full state is fresh, the
/// decision's own invariants, the exact retry instant, what it writes, and the admission bound
/// over every span it ends. Returns the state after it.
fn checked_step<A: Algorithm, M: Model>(
    algorithm: &A,
    admissions: &mut AdmissionLog,
    (state, now): (u64, u64),
    cost: u64,
    recorded: bool,
    step: Step,
) -> Result<u64, String> {
    check_full_is_fresh(algorithm, state, now, cost)?;
    check_decision(&step.decision, cost, *algorithm.limit())?;
    // A retry instant past u64::MAX ns is reported saturated and not checked. A check's retry
    // is for its own cost from the state it read; a record's, for one unit from the state it
    // left.
    let (from, retry_cost) = match (recorded && cost > 0, step.next) {
        (true, Some(next)) => (next, 1),
        _ => (state, cost),
    };
    let retry_at = now
        .checked_add(step.decision.retry_after_nanos())
        .filter(|_| step.decision.retry_after_nanos() != u64::MAX);
    if let Some(at) = retry_at.filter(|_| step.decision.is_denied()) {
        let then = algorithm.decide(from, retry_cost, at);
        if at <= algorithm_max(algorithm, at)
            && !then.as_ref().is_ok_and(|s| s.decision.is_allowed())
        {
            return Err(format!(
                "denied, but retrying after {} ns gives {then:?}",
                step.decision.retry_after_nanos()
            ));
        }
        let before = algorithm.decide(from, retry_cost, at.saturating_sub(1));
        if before.as_ref().is_ok_and(|s| s.decision.is_allowed()) {
            return Err(format!(
                "retry_after {} ns is later than the first admitting instant",
                step.decision.retry_after_nanos()
            ));
        }
    }
    if recorded {
        let next = recorded_word(&step, cost)?;
        let Some(next) = next else { return Ok(state) };
        let limit = algorithm.limit();
        admissions.recorded(now, kept_units(algorithm, limit, (state, next), now));
        return Ok(next);
    }
    let Some(next) = written(&step, cost)? else {
        return Ok(state);
    };
    admissions.admit::<M>(algorithm.limit(), now, cost)?;
    Ok(next)
}

/// The word a record writes: every record of a positive cost writes one (never the reserved
/// [`StateCell::RETIRED`]); a record of cost 0 is a peek and writes nothing.
fn recorded_word(step: &Step, cost: u64) -> Result<Option<u64>, &'static str> {
    match (step.next, cost > 0) {
        (Some(next), true) if next == StateCell::RETIRED => Err("wrote the reserved RETIRED word"),
        (Some(next), true) => Ok(Some(next)),
        (Some(_), false) => Err("a record of cost 0 wrote state"),
        (None, true) => Err("a record wrote nothing"),
        (None, false) => Ok(None),
    }
}

/// The whole units a record kept, moving `state` to `next` at `now`: the difference in use, in
/// the limit's units (a record past the debt cap keeps less than its cost).
fn kept_units<A: Algorithm>(
    algorithm: &A,
    limit: &Limit,
    (state, next): (u64, u64),
    now: u64,
) -> u64 {
    let before = algorithm.usage(state, now);
    let after = algorithm.usage(next, now);
    let added = after.used().saturating_sub(before.used());
    let units = u128::from(added) * u128::from(limit.burst()) / u128::from(after.capacity().max(1));
    u64::try_from(units).unwrap_or(u64::MAX)
}

/// The word `step` writes, checking that exactly an admission of a positive cost writes one,
/// and never the reserved [`StateCell::RETIRED`] word.
fn written(step: &Step, cost: u64) -> Result<Option<u64>, &'static str> {
    let consumed = step.decision.is_allowed() && cost > 0;
    match (step.next, consumed) {
        (Some(next), true) if next == StateCell::RETIRED => Err("wrote the reserved RETIRED word"),
        (Some(next), true) => Ok(Some(next)),
        (Some(_), false) => Err("a denial or a peek wrote state"),
        (None, true) => Err("an admission wrote nothing"),
        (None, false) => Ok(None),
    }
}

/// `at` if the algorithm can decide at `at`, else 0 (so the caller skips the retry check).
fn algorithm_max<A: Algorithm>(algorithm: &A, at: u64) -> u64 {
    match algorithm.decide(A::FRESH, 0, at) {
        Err(DecisionError::ClockOutOfRange { .. }) => 0,
        _ => at,
    }
}

/// A greedy caller from `start`: takes the whole burst, then `units` more one at a time, each
/// at once if admitted, else at the instant its `retry_after` names. Returns the nanoseconds the `units` took, or an error
/// if a retry was not admitted. Over that span the exact limit admits at least `units`, so the
/// span is at most `units / rate`, stretched by at most the algorithm's stated shortfall.
pub fn greedy_span<A: Algorithm>(algorithm: &A, start: u64, units: u64) -> Result<u64, String> {
    let burst = algorithm.limit().burst();
    let mut state = algorithm
        .decide(A::FRESH, burst, start)
        .map_err(|e| e.to_string())?
        .next
        .ok_or("the full burst was not admitted")?;
    let mut now = start;
    for taken in 0..units {
        // Several units a nanosecond come back at once: wait only when denied.
        let first = algorithm.decide(state, 1, now).map_err(|e| e.to_string())?;
        if first.decision.is_denied() {
            now = now.saturating_add(first.decision.retry_after_nanos());
        }
        let step = algorithm.decide(state, 1, now).map_err(|e| e.to_string())?;
        state = step
            .next
            .filter(|_| step.decision.is_allowed())
            .ok_or_else(|| format!("unit {taken} denied at its retry instant {now}"))?;
    }
    Ok(now - start)
}

/// A state that `is_full` at `now` must decide (and record) exactly like a fresh one there:
/// that is what lets a store forget it.
pub fn check_full_is_fresh<A: Algorithm>(
    algorithm: &A,
    state: u64,
    now: u64,
    cost: u64,
) -> Result<(), String> {
    if !algorithm.is_full(state, now) {
        return Ok(());
    }
    let as_is = algorithm.decide(state, cost, now).map(|s| s.decision);
    let fresh = algorithm.decide(A::FRESH, cost, now).map(|s| s.decision);
    if as_is != fresh {
        return Err(format!(
            "state {state:#x} is full but decides {as_is:?}, a fresh one {fresh:?}"
        ));
    }
    let as_is = algorithm.record(state, cost, now).map(|s| s.decision);
    let fresh = algorithm.record(A::FRESH, cost, now).map(|s| s.decision);
    if as_is != fresh {
        return Err(format!(
            "state {state:#x} is full but records {as_is:?}, a fresh one {fresh:?}"
        ));
    }
    Ok(())
}

/// The proptest settings every algorithm's property tests use: `cases` cases, with failures saved
/// beside the test file (`<test>.regressions`) and replayed first.
pub fn proptest_config(cases: u32) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        ..proptest::test_runner::Config::default()
    }
}

/// The invariants every single decision keeps, whatever the algorithm.
pub fn check_decision(decision: &Decision, cost: u64, limit: Limit) -> Result<(), String> {
    if decision.limit() != limit.burst() {
        return Err(format!(
            "limit {} is not the burst {}",
            decision.limit(),
            limit.burst()
        ));
    }
    if decision.remaining() > limit.burst() {
        return Err(format!(
            "remaining {} exceeds the burst",
            decision.remaining()
        ));
    }
    if decision.is_allowed() && decision.retry_after_nanos() != 0 {
        return Err("an admission has a non-zero retry_after".into());
    }
    if decision.is_denied() && decision.retry_after_nanos() == 0 {
        return Err("a denial has a zero retry_after".into());
    }
    if decision.is_denied() && cost == 0 && decision.remaining() > 0 {
        return Err("a peek was denied with units remaining".into());
    }
    Ok(())
}

/// Admissions and records so far, each at the running maximum of the readings at which the
/// state was written (the state's own time), to check the admission bound over every span:
/// the units admitted plus the units recorded before the span's last admission that the state
/// still carries then ([`Model::record_counts`]).
#[derive(Debug, Default)]
pub struct AdmissionLog {
    /// `(state time, units, admitted)` per admission or record, in order.
    entries: Vec<(u64, u64, bool)>,
}

impl AdmissionLog {
    fn high(&self, now: u64) -> u64 {
        self.entries.last().map_or(now, |&(high, ..)| high.max(now))
    }

    /// Notes `units` of usage recorded (and kept) at `now`; they count in the spans that end
    /// with a later admission, as [`Model::record_counts`] says.
    pub fn recorded(&mut self, now: u64, units: u64) {
        let high = self.high(now);
        self.entries.push((high, units, false));
    }

    /// Notes an admission of `cost` at `now` and checks every span that ends with it.
    pub fn admit<M: Model>(&mut self, limit: &Limit, now: u64, cost: u64) -> Result<(), String> {
        let high = self.high(now);
        self.entries.push((high, cost, true));
        let mut total = 0u128;
        for &(from, units, admitted) in self.entries.iter().rev() {
            if admitted || M::record_counts(limit, from, high) {
                total += u128::from(units);
            }
            let allowed = M::max_admitted(limit, high - from);
            if total > allowed {
                return Err(format!(
                    "admitted and recorded {total} units within {} ns; the bound is {allowed}",
                    high - from
                ));
            }
        }
        Ok(())
    }
}
