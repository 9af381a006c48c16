//! Calls on a policy with a concurrency limit: a permit is taken with the rate limits (if the
//! policy has any), all or nothing: a call refused for want of a permit takes no rate units,
//! and a call the rate limits deny gives its permit back at once. In process the permit is
//! taken first, then the rate limits decide; on Redis the permit, the calendar quotas and the
//! stack are asked at once (one round trip), and whichever refuses, what the others took goes
//! back. The admitted call's answer carries the permit's id, which the caller releases when
//! its work ends (or which expires after the limit's `ttl`). Such a call is decided alone: a
//! batch, envoy's protocol and unkey's API cannot hand a permit back, so they refuse the
//! policy.

use futures_util::future::{join, join_all, join3};
use limiter_core::{Clock, Decision};
use limiter_stack::{Charge, Origin};

use crate::metrics::{Counted, FailurePolicy};
use crate::store::permits::{PermitFailure, PolicyPermits, Taken};
use crate::store::quotas::{PolicyQuota, QuotaFailure, QuotaTaken};

use super::quota_answer::{answered_by, folded, tighter};
use super::quota_take::TakenTogether;

use super::*;

/// One call's answer and its permit's id, or why it could not be decided.
type Answered = Result<(Answer, Option<String>), DecideError>;

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    /// Decides one item, as [`decide_at`](Self::decide_at) does, and on a policy with a
    /// concurrency limit takes a permit with it: the answer and the permit's id (`None` when
    /// nothing was taken, or the policy has no concurrency limit). A policy's calendar quotas
    /// on Redis are counted beside its stack here too, all or nothing with it.
    pub async fn decide_one(&self, item: &Item, time_ms: Option<u64>) -> Answered {
        let (permits, quotas) = self.gates_of(item);
        if permits.is_none() && quotas.is_empty() {
            // Known to take no permit: no second look at the policy's gates.
            let answer = self.decide_checked_one(item, time_ms).await?;
            return Ok((answer, None));
        }
        // The gated paths' futures are boxed: their state (answers held across store calls)
        // would make every request's future kilobytes (6.2 KB unboxed), moved whole wherever
        // the request's future is, gated or not.
        // Reports, records, unit refunds and shadow checks take no permit and count no quota:
        // they report the rate limits' answer tightened by the permits held and the quotas.
        if item.cost == 0 || item.charge != Charge::Take || item.shadow {
            return Box::pin(self.report_gated(item, time_ms, permits, quotas)).await;
        }
        match permits {
            Some(permits) if permits.on_redis() => {
                Box::pin(self.take_permitted_on_redis(item, time_ms, permits, quotas)).await
            }
            Some(permits) => Box::pin(self.take_permitted(item, time_ms, permits, quotas)).await,
            // The quotas and the stack at once, all or nothing (`quota_take.rs`).
            None => Ok((
                Box::pin(self.take_with_quotas(item, time_ms, quotas)).await?,
                None,
            )),
        }
    }

    /// A take on a policy whose permits are in this process: the permit first, then the rate
    /// limits (and any quotas, at once), the permit given back if they refuse.
    async fn take_permitted(
        &self,
        item: &Item,
        time_ms: Option<u64>,
        permits: &PolicyPermits,
        quotas: &[PolicyQuota],
    ) -> Answered {
        let acquired = permits.acquire(&item.identifier).await;
        let held = match self.permit_taken(item, permits, acquired) {
            Ok(held) => held,
            Err(answered) => return answered,
        };
        let decided = if quotas.is_empty() {
            self.decide_checked_one(item, time_ms).await
        } else {
            self.take_with_quotas(item, time_ms, quotas).await
        };
        self.with_permit_held(item, permits, held, decided).await
    }

    /// What acquiring a permit answered, read: the permit (its id and the permits then held),
    /// or `None` when its store failed and the policy fails open (no permit; all reported
    /// free); or the call's answer now: every permit held (a denial, counted), or the store
    /// failing closed.
    fn permit_taken(
        &self,
        item: &Item,
        permits: &PolicyPermits,
        acquired: Result<(Taken, Option<String>), PermitFailure>,
    ) -> Result<Option<(String, PermitsHeld)>, Answered> {
        match acquired {
            Ok((taken, fell_back)) => match taken {
                Taken::Held { id, held } => {
                    Ok(Some((id, self.held_as_answered(permits, held, fell_back))))
                }
                Taken::Busy {
                    held,
                    retry_after_ns,
                } => {
                    let held = self.held_as_answered(permits, held, fell_back);
                    Err(Ok((self.busy(item, permits, held, retry_after_ns), None)))
                }
            },
            Err(failure) => match self.gate_failed(failure.closed, failure.message) {
                Ok(()) => Ok(None),
                Err(refused) => Err(Err(refused)),
            },
        }
    }

    /// The rate limits' answer (`decided`, counted) beside the permit `held`: an admission
    /// carries the permit (or, with none as its store failed open, reports all free); a
    /// denial, failure or error gives the permit back now.
    async fn with_permit_held(
        &self,
        item: &Item,
        permits: &PolicyPermits,
        held: Option<(String, PermitsHeld)>,
        decided: Result<Answer, DecideError>,
    ) -> Answered {
        match (decided, held) {
            (Ok(answer), Some((id, held))) if answer.decision.is_allowed() => {
                Ok((with_permit(answer, permits, held), Some(id)))
            }
            (Ok(answer), None) => {
                Ok((folded(answer, none_held(permits, self.now_unix_ns())), None))
            }
            (other, held) => {
                if let Some((id, _)) = held {
                    let _ = permits.release(&item.identifier, &id).await;
                }
                other.map(|answer| (answer, None))
            }
        }
    }

    /// A take on a policy whose permits are on Redis: the permit, the quotas and the stack
    /// asked at once, one round trip for all (`quota_take.rs`), all or nothing; the answer is
    /// the one asking them in turn gives: the permits' (every one held, or their store failing
    /// closed) first, then the quotas', then the stack's.
    async fn take_permitted_on_redis(
        &self,
        item: &Item,
        time_ms: Option<u64>,
        permits: &PolicyPermits,
        quotas: &[PolicyQuota],
    ) -> Answered {
        self.quota_cost_refused(item, quotas)?;
        let reading = self.reading_for(time_ms)?;
        let resolved = self.resolve(item)?;
        let (acquired, together) = join(
            permits.acquire(&item.identifier),
            self.take_together(item, reading, &resolved, quotas),
        )
        .await;
        let held = match self.permit_taken(item, permits, acquired) {
            Ok(held) => held,
            Err(answered) => {
                together.give_back(item, self.now_unix_ns()).await;
                return answered;
            }
        };
        let TakenTogether { answer, .. } = together;
        self.count_one(item, resolved.2, &answer);
        self.with_permit_held(item, permits, held, answer).await
    }

    /// A call that took nothing on a policy with permits or quotas: the rate limits' answer,
    /// tightened by the permits held and each quota's state.
    async fn report_gated(
        &self,
        item: &Item,
        time_ms: Option<u64>,
        permits: Option<&PolicyPermits>,
        quotas: &[PolicyQuota],
    ) -> Answered {
        // The stack, the quotas and the permits asked at once: one round trip on Redis.
        let held = async {
            match permits {
                Some(permits) => Some((permits, permits.held(&item.identifier).await)),
                None => None,
            }
        };
        let (answer, states, held) = join3(
            self.decide_checked_one(item, time_ms),
            self.quota_states(item, quotas),
            held,
        )
        .await;
        let mut answer = self.tightened(answer?, quotas, states)?;
        match held {
            Some((permits, Ok((held, fell_back)))) => {
                let held = self.held_as_answered(permits, held, fell_back);
                answer = reported(answer, permits, held);
            }
            Some((permits, Err(failure))) => {
                self.gate_failed(failure.closed, failure.message)?;
                answer = folded(answer, none_held(permits, self.now_unix_ns()));
            }
            None => {}
        }
        Ok((answer, None))
    }

    /// What each of `quotas` holds for `item`, which takes nothing ([`quota_state`]), all
    /// asked at once.
    ///
    /// [`quota_state`]: Self::quota_state
    pub(super) async fn quota_states(
        &self,
        item: &Item,
        quotas: &[PolicyQuota],
    ) -> Vec<Result<QuotaTaken, QuotaFailure>> {
        join_all(quotas.iter().map(|quota| self.quota_state(item, quota))).await
    }

    /// `answer` tightened by each quota's `states` (a quota whose store failed answers by its
    /// failure policy: closed refuses, open reports without it).
    pub(super) fn tightened(
        &self,
        mut answer: Answer,
        quotas: &[PolicyQuota],
        states: Vec<Result<QuotaTaken, QuotaFailure>>,
    ) -> Result<Answer, DecideError> {
        for (quota, state) in quotas.iter().zip(states) {
            let state = match state {
                Ok(state) => {
                    self.count_fallback(state.fell_back.as_deref());
                    state
                }
                Err(failure) => self.quota_failed(quota, failure)?,
            };
            answer = tighter(answer, &state);
        }
        Ok(answer)
    }

    /// What `quota` holds for an item that takes nothing: a record's units counted in it
    /// (whatever it holds, as a record counts on every limit), else its state.
    pub(super) async fn quota_state(
        &self,
        item: &Item,
        quota: &PolicyQuota,
    ) -> Result<QuotaTaken, QuotaFailure> {
        let now = self.now_unix_ns();
        if item.charge == Charge::Record && item.cost > 0 && !item.shadow {
            quota.record(&item.identifier, item.cost, now).await
        } else {
            quota.take(&item.identifier, 0, now).await
        }
    }

    /// Counts a gate's answer made by a falling-back policy's table while Redis failed with
    /// `fell_back` as the failure policy's (the failure logged, paced), as the stacks count
    /// their fallback's; `None`: the store answered, nothing to count.
    pub(super) fn count_fallback(&self, fell_back: Option<&str>) {
        if let Some(why) = fell_back {
            self.metrics.store_failed(&why);
            self.metrics.failure_policy(FailurePolicy::Fallback);
        }
    }

    /// `held` permits as `permits`' store (or, where it failed with `fell_back`, the fallback
    /// table, counted as the failure policy's answer) answered them.
    fn held_as_answered(
        &self,
        permits: &PolicyPermits,
        held: u64,
        fell_back: Option<String>,
    ) -> PermitsHeld {
        self.count_fallback(fell_back.as_deref());
        let by = match (fell_back, permits.on_redis()) {
            (Some(_), _) => Origin::Fallback,
            (None, true) => Origin::Remote,
            (None, false) => Origin::InProcess,
        };
        PermitsHeld { held, by }
    }

    /// A gate's store (permits, a quota) failed: a closed policy refuses (503), an open one
    /// goes on without the gate (it counts nothing while its store fails). Counted as the
    /// policy's answer to a failure.
    pub(super) fn gate_failed(&self, closed: bool, message: String) -> Result<(), DecideError> {
        self.metrics.store_failed(&message);
        if closed {
            self.metrics.failure_policy(FailurePolicy::Closed);
            return Err(DecideError::Unavailable(message));
        }
        self.metrics.failure_policy(FailurePolicy::Open);
        Ok(())
    }

    /// A quota whose store failed: a closed policy refuses (503); an open one counts nothing
    /// and reports the whole window left, answered as failing open.
    pub(super) fn quota_failed(
        &self,
        quota: &PolicyQuota,
        failure: QuotaFailure,
    ) -> Result<QuotaTaken, DecideError> {
        self.gate_failed(failure.closed, failure.message)?;
        Ok(quota.failed_open(self.now_unix_ns()))
    }

    /// Every permit of the item's key held: the answer, counted as a denial.
    fn busy(
        &self,
        item: &Item,
        permits: &PolicyPermits,
        held: PermitsHeld,
        retry_after_ns: u64,
    ) -> Answer {
        self.counters_of(item)
            .count(Counted::Denied { shadow: false }, &item.identifier);
        let count = permits.limit().count;
        let wait = retry_after_ns.max(1);
        Answer {
            decision: Decision::deny(count, count.saturating_sub(held.held), wait, wait),
            origin: Some(held.by),
            at_unix_ns: self.now_unix_ns(),
        }
    }

    /// Releases `identifier`'s permit `permit` of the configured policy `policy`: whether it
    /// was held (false once it expired or was released already: a release is idempotent).
    pub async fn release(
        &self,
        policy: &str,
        identifier: &str,
        permit: &str,
    ) -> Result<bool, DecideError> {
        let invalid = DecideError::invalid;
        let id = self
            .policy_id(policy)
            .ok_or_else(|| invalid("policy", format!("no policy named `{policy}`")))?;
        let permits = self.policies[id.0].permits.as_ref().ok_or_else(|| {
            invalid(
                "policy",
                format!("policy `{policy}` has no concurrency limit: it holds no permits"),
            )
        })?;
        let held = permits
            .release(identifier, permit)
            .await
            .map_err(DecideError::Unavailable)?;
        self.policies[id.0].counters.count_release(held);
        Ok(held)
    }

    /// Permits held now, by policy with a concurrency limit: in this process's memory, or on
    /// Redis the fleet's (the error when Redis does not answer or the count cannot be read).
    pub async fn permits_held(&self) -> Vec<(&str, Result<u64, String>)> {
        let mut held = Vec::new();
        for policy in &self.policies {
            if let Some(permits) = &policy.permits {
                held.push((policy.name.as_str(), permits.held_total().await));
            }
        }
        held
    }

    /// The concurrency limit's permits and the calendar quotas beside the stack of `item`'s
    /// policy (none for an ad-hoc limit).
    pub(super) fn gates_of(&self, item: &Item) -> (Option<&PolicyPermits>, &[PolicyQuota]) {
        match &item.target {
            Target::Policy(id) => self
                .policies
                .get(id.0)
                .map_or((None, &[][..]), |e| (e.permits.as_ref(), &e.quotas[..])),
            Target::AdHoc { .. } => (None, &[]),
        }
    }

    /// Why `items` cannot be decided together: one of them is on a policy with a concurrency
    /// limit, whose permit only [`decide_one`](Self::decide_one) can hand back.
    pub(super) fn refuse_permits(&self, items: &[Item]) -> Result<(), DecideError> {
        let gated = |item: &Item| self.gates_of(item).0.is_some();
        let Some(index) = items.iter().position(gated) else {
            return Ok(());
        };
        let item = &items[index];
        let name = match &item.target {
            Target::Policy(id) => self.policy_name(*id).unwrap_or("?"),
            Target::AdHoc { .. } => "?",
        };
        let message = format!(
            "policy `{name}` has a concurrency limit: decide it alone with POST /v1/ratelimit (whose answer carries a permit to release)"
        );
        Err(DecideError::invalid("policy", message).in_item(index))
    }

    pub(super) fn counters_of(&self, item: &Item) -> &PolicyCounters {
        match &item.target {
            Target::Policy(id) => self
                .policies
                .get(id.0)
                .map_or(&self.ad_hoc_counters, |e| &e.counters),
            Target::AdHoc { .. } => &self.ad_hoc_counters,
        }
    }

    pub(super) fn now_unix_ns(&self) -> u64 {
        self.unix_origin_ns
            .saturating_add(self.stacks.clock().now())
    }
}

/// Gives back what each counted quota took for `item`, all at once.
pub(super) async fn refund_quotas(
    item: &Item,
    counted: &[(&PolicyQuota, QuotaTaken)],
    now_unix_ns: u64,
) {
    let refunds = counted
        .iter()
        .map(|(quota, taken)| quota.refund(&item.identifier, item.cost, taken, now_unix_ns));
    join_all(refunds).await;
}

/// The permits' answer while their store fails and their policy fails open: none taken, all
/// of the count left, answered as failing open (as a stack failing open reports its limits).
fn none_held(permits: &PolicyPermits, at_unix_ns: u64) -> Answer {
    let count = permits.limit().count;
    Answer {
        decision: Decision::allow(count, count, 0),
        origin: None,
        at_unix_ns,
    }
}

/// The permits a key holds, and who answered that: this process, Redis, or the fallback table
/// standing in while Redis fails.
#[derive(Clone, Copy, Debug)]
struct PermitsHeld {
    held: u64,
    by: Origin,
}

/// A report on a policy with permits: every permit held is a denial (when one frees is not
/// known: a retry in a millisecond), else the rate limits' answer tightened by the permits.
fn reported(answer: Answer, permits: &PolicyPermits, held: PermitsHeld) -> Answer {
    let count = permits.limit().count;
    if held.held < count || answer.decision.is_denied() {
        return with_permit(answer, permits, held);
    }
    Answer {
        decision: Decision::deny(count, 0, 1_000_000, 1_000_000),
        origin: answered_by([answer.origin, Some(held.by)], Some(held.by)),
        ..answer
    }
}

/// The rate limits' admission, tightened by the permits when fewer of them are left: the
/// permit's answer then (its limit, what is left, and its time to live as when it frees),
/// answered by whoever answered the part that bound (or failed: [`answered_by`]).
fn with_permit(answer: Answer, permits: &PolicyPermits, held: PermitsHeld) -> Answer {
    let limit = permits.limit();
    let origin = |binding| answered_by([answer.origin, Some(held.by)], binding);
    if answer.decision.is_denied() {
        return Answer {
            origin: origin(answer.origin),
            ..answer
        };
    }
    let left = limit.count.saturating_sub(held.held);
    if left >= answer.decision.remaining() && answer.decision.limit() != u64::MAX {
        return Answer {
            origin: origin(answer.origin),
            ..answer
        };
    }
    let ttl = u64::try_from(limit.ttl.as_nanos()).unwrap_or(u64::MAX);
    Answer {
        decision: Decision::allow(limit.count, left, ttl),
        origin: origin(Some(held.by)),
        ..answer
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use limiter_core::ManualClock;

    use super::*;
    use crate::config::Config;
    use crate::metrics::Metrics;

    use super::super::tests::item;

    fn engine(limits: &str) -> (Engine<ManualClock>, ManualClock) {
        super::super::tests::engine(&format!("[policies.p]\nlimits = [{limits}]\n"))
    }

    fn one(engine: &Engine<ManualClock>, id: &str, cost: u64) -> (Answer, Option<String>) {
        decided_at_once(engine.decide_one(&item(id, cost), None)).expect("decidable")
    }

    fn release(engine: &Engine<ManualClock>, id: &str, permit: &str) -> bool {
        decided_at_once(engine.release("p", id, permit)).expect("a policy with permits")
    }

    #[test]
    fn permits_are_counted_released_once_and_expire_after_their_ttl() {
        let (engine, clock) = engine("{ algorithm = \"concurrency\", count = 2, ttl = \"30s\" }");
        let (first, a) = one(&engine, "ann", 1);
        assert!(first.decision.is_allowed());
        assert_eq!((first.decision.limit(), first.decision.remaining()), (2, 1));
        let (_, b) = one(&engine, "ann", 1);
        let (busy, none) = one(&engine, "ann", 1);
        assert!(busy.decision.is_denied() && none.is_none());
        assert_eq!(busy.decision.retry_after(), Duration::from_secs(30));
        assert!(one(&engine, "bob", 1).1.is_some(), "another identifier");
        assert_eq!(decided_at_once(engine.permits_held()), [("p", Ok(3))]);

        let (a, b) = (a.expect("a permit"), b.expect("a permit"));
        assert!(release(&engine, "ann", &a));
        assert!(!release(&engine, "ann", &a), "released once");
        assert!(!release(&engine, "bob", &b), "another identifier's permit");
        assert!(one(&engine, "ann", 1).1.is_some());
        // Nobody releases: after 30 s every permit is gone, and a late release says so.
        clock.advance(Duration::from_secs(30));
        assert_eq!(decided_at_once(engine.permits_held()), [("p", Ok(0))]);
        assert!(!release(&engine, "ann", &b), "expired");
        assert!(one(&engine, "ann", 1).0.decision.is_allowed());
    }

    #[test]
    fn rates_and_permits_are_all_or_nothing() {
        let (engine, _) = engine(
            "{ algorithm = \"concurrency\", count = 1, ttl = \"1m\" }, { algorithm = \"fixed_window\", count = 3, period = \"1h\" }",
        );
        let (first, permit) = one(&engine, "ann", 1);
        assert_eq!(first.decision.remaining(), 0, "the tighter: no permit left");
        // Refused for want of a permit: no rate unit taken.
        assert!(one(&engine, "ann", 1).0.decision.is_denied());
        assert!(release(&engine, "ann", &permit.expect("a permit")));
        let (second, permit) = one(&engine, "ann", 2);
        assert!(second.decision.is_allowed());
        assert!(release(&engine, "ann", &permit.expect("a permit")));
        // The window has 0 left: denied by the rate limit, and the permit goes back.
        let (denied, none) = one(&engine, "ann", 1);
        assert!(denied.decision.is_denied() && none.is_none());
        assert_eq!(denied.decision.limit(), 3);
        assert_eq!(decided_at_once(engine.permits_held()), [("p", Ok(0))]);
        // A report takes nothing, no permit either, and says what is left.
        let (report, none) = one(&engine, "ann", 0);
        assert_eq!((report.decision.remaining(), none), (0, None));
        assert_eq!(decided_at_once(engine.permits_held()), [("p", Ok(0))]);
    }

    #[test]
    fn a_policy_with_permits_is_decided_alone() {
        let (engine, _) = engine("{ algorithm = \"concurrency\", count = 5 }");
        let err = decided_at_once(engine.decide(&[item("ann", 1)])).expect_err("refused");
        assert!(err.to_string().contains("decide it alone"), "{err}");
        let err = decided_at_once(engine.release("nope", "ann", "x")).expect_err("no policy");
        assert!(err.to_string().contains("no policy named"), "{err}");
    }

    #[test]
    fn permits_held_survive_a_reload() {
        let text = "[policies.p]\nlimits = [{ algorithm = \"concurrency\", count = 1 }]\n";
        let config = Config::parse(text).expect("valid");
        let clock = ManualClock::new();
        let stacks = Stacks::open(&config.store, clock.clone(), None).expect("memory");
        let engine = Engine::new(&config, stacks, Arc::new(Metrics::new())).expect("builds");
        let (_, permit) = one(&engine, "ann", 1);
        let reloaded = engine.reloaded(&config).expect("reloads");
        assert!(
            one(&reloaded, "ann", 1).0.decision.is_denied(),
            "still held"
        );
        assert!(release(&reloaded, "ann", &permit.expect("a permit")));
        assert!(one(&reloaded, "ann", 1).1.is_some());
    }
}
