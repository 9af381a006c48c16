//! Items resolved to their policies and decided, all or nothing: in memory (grants refunded
//! when one is denied), on Redis (one batch, or item by item across a cluster's slots), and
//! every store's outcome read as an [`Answer`] in one place.

use limiter_core::{Clock, Decision, Limit};
use limiter_redis::BatchError;
use limiter_stack::{CallError, Grant, Outcome};

use crate::metrics::{Counted, FailurePolicy};

use super::*;

/// A call that can never be decided, as the API reports it.
pub(super) fn call_error(e: &CallError) -> DecideError {
    match e {
        CallError::Full { .. } => {
            tracing::warn!(error = %e, "a policy's key store is full: new identifiers are refused");
            DecideError::Full(e.to_string())
        }
        _ => DecideError::Invalid {
            field: "cost",
            message: e.to_string(),
        },
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    pub(super) fn resolve(&self, item: &Item) -> Result<(Resolved<'_, C>, Call), DecideError> {
        match &item.target {
            Target::Policy(id) => {
                let entry = self
                    .policies
                    .get(id.0)
                    .ok_or_else(|| DecideError::Invalid {
                        field: "policy",
                        message: format!("no policy number {}", id.0),
                    })?;
                let call = Call {
                    identifier: item.identifier.as_str().into(),
                    plan: entry.plan,
                };
                Ok((Resolved::Configured(&entry.backend, &entry.counters), call))
            }
            Target::AdHoc {
                kind,
                limit,
                duration_ms,
                namespace,
            } => {
                let (backend, plan) = self.ad_hoc_backend(*kind, *limit, *duration_ms)?;
                // The namespace keeps callers apart; its length is bounded, so the separator
                // cannot be forged into another namespace's key.
                let call = Call {
                    identifier: format!("{}:{namespace}:{}", namespace.len(), item.identifier)
                        .into(),
                    plan,
                };
                Ok((Resolved::AdHoc(backend, &self.ad_hoc_counters), call))
            }
        }
    }

    /// The clock's reading for a request's `time` (ms since the Unix epoch), as the engine
    /// decides it: a time before what the clock counts from is refused, and so is one more
    /// than [`MAX_TIME_AHEAD_MS`] ahead of the clock; one ahead by less is the clock's own
    /// reading (a time cannot spend what has not come back yet). `None`: now.
    fn reading_for(&self, time_ms: Option<u64>) -> Result<u64, DecideError> {
        let now = self.clock.now();
        let Some(time_ms) = time_ms else {
            return Ok(now);
        };
        let invalid = |message: String| DecideError::Invalid {
            field: "time",
            message,
        };
        let at = time_ms.saturating_mul(1_000_000);
        let origin = self.unix_origin_ns;
        if at < origin {
            return Err(invalid(format!(
                "`time` {time_ms} is before {}, where this server's clock starts counting (the \
                 start of the Unix week it started in): send the time of the request, in ms \
                 since the Unix epoch",
                origin / 1_000_000
            )));
        }
        let reading = at - origin;
        let ahead = reading.saturating_sub(now);
        if ahead > MAX_TIME_AHEAD_MS * 1_000_000 {
            return Err(invalid(format!(
                "`time` {time_ms} is {} ms ahead of this server's clock (more than \
                 {MAX_TIME_AHEAD_MS} ms): send the time of the request, in ms since the Unix \
                 epoch, or leave it out",
                ahead / 1_000_000
            )));
        }
        Ok(reading.min(now))
    }

    /// Decides `items`, all or nothing (see the module docs); one answer per item, in order.
    pub async fn decide(&self, items: &[Item]) -> Result<(bool, Vec<Answer>), DecideError> {
        self.decide_at(items, None).await
    }

    /// [`decide`](Self::decide) at a caller's `time` (ms since the Unix epoch; `None`: now).
    /// In memory the items are decided at that instant; a time ahead of the server's clock is
    /// decided at its own reading, never later. On Redis, Redis's clock decides (so a fleet
    /// agrees): the time is checked the same way and changes nothing.
    pub async fn decide_at(
        &self,
        items: &[Item],
        time_ms: Option<u64>,
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        let reading = self.reading_for(time_ms)?;
        let resolved = items
            .iter()
            .map(|item| self.resolve(item))
            .collect::<Result<Vec<_>, _>>()?;
        let result = if resolved
            .iter()
            .all(|(r, _)| matches!(r.backend(), Backend::Memory(_)))
        {
            self.decide_in_memory(items, &resolved, reading)
        } else {
            self.decide_on_redis(items, &resolved).await
        };
        match &result {
            Ok((admitted, answers)) => {
                for ((item, (target, _)), answer) in items.iter().zip(&resolved).zip(answers) {
                    let counted = if item.cost == 0 {
                        Counted::Peeked
                    } else if item.charge == Charge::Record {
                        Counted::Recorded
                    } else if item.charge == Charge::GiveBack {
                        Counted::GivenBack
                    } else if !answer.decision.is_allowed() {
                        Counted::Denied {
                            shadow: item.shadow,
                        }
                    } else if *admitted {
                        Counted::Allowed
                    } else {
                        Counted::BatchRefused
                    };
                    target.counters().count(counted, &item.identifier);
                }
            }
            Err(DecideError::Full(_)) => self.metrics.store_full(),
            Err(_) => {}
        }
        result
    }

    fn decide_in_memory(
        &self,
        items: &[Item],
        resolved: &[(Resolved<'_, C>, Call)],
        now: u64,
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        let mut answers = Vec::with_capacity(items.len());
        let mut grants: Vec<(usize, Grant)> = Vec::new();
        let mut all = true;
        for (i, (item, (backend, call))) in items.iter().zip(resolved).enumerate() {
            let Backend::Memory(stack) = backend.backend() else {
                unreachable!("checked by the caller");
            };
            let decided = match item.charge {
                Charge::Ask => stack.decide_at(call, item.cost, now),
                Charge::Record => stack.record_at(call, item.cost, now).map(|d| (d, None)),
                Charge::GiveBack => stack.give_back(call, item.cost).map(|d| (d, None)),
            };
            let (decision, grant) = match decided {
                Ok(pair) => pair,
                Err(e) => {
                    self.refund_all(resolved, grants);
                    return Err(call_error(&e));
                }
            };
            all &= decision.is_allowed() || item.never_denies();
            if let Some(grant) = grant {
                grants.push((i, grant));
            }
            answers.push(Answer {
                decision: decision.decision(),
                origin: Origin::Memory,
                at_unix_ns: self.unix_origin_ns.saturating_add(now),
            });
        }
        if !all {
            self.refund_all(resolved, grants);
            // Nothing was taken: admitted items report what they hold after the refund, read
            // at a reading no earlier than the refund's (a peek at the batch's own, earlier,
            // reading would count the refunded units as still owed).
            let now = self.clock.now().max(now);
            for ((item, (backend, call)), answer) in items.iter().zip(resolved).zip(&mut answers) {
                if answer.decision.is_allowed()
                    && item.cost > 0
                    && item.charge == Charge::Ask
                    && let Backend::Memory(stack) = backend.backend()
                    && let Ok((peek, _)) = stack.decide_at(call, 0, now)
                {
                    answer.decision = peek.decision();
                    answer.at_unix_ns = self.unix_origin_ns.saturating_add(now);
                }
            }
        }
        Ok((all, answers))
    }

    fn refund_all(&self, resolved: &[(Resolved<'_, C>, Call)], grants: Vec<(usize, Grant)>) {
        for (i, mut grant) in grants {
            let (backend, call) = &resolved[i];
            if let Backend::Memory(stack) = backend.backend() {
                let units = grant.left();
                // A grant from this stack, with its own units: a refund cannot fail.
                let _ = stack.refund(call, &mut grant, units);
            }
        }
    }

    async fn decide_on_redis(
        &self,
        items: &[Item],
        resolved: &[(Resolved<'_, C>, Call)],
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        if let [item] = items {
            let (backend, call) = &resolved[0];
            let answer = match item.charge {
                Charge::Ask => self.call_one(backend.backend(), call, item.cost).await?,
                Charge::Record => self.record_one(backend.backend(), call, item.cost).await?,
                Charge::GiveBack => {
                    self.give_back_one(backend.backend(), call, item.cost)
                        .await?
                }
            };
            let admitted = answer.decision.is_allowed() || item.never_denies();
            return Ok((admitted, vec![answer]));
        }
        let Some((first, _)) = resolved.first() else {
            return Ok((true, Vec::new()));
        };
        let Some(first) = first.backend().redis_stack() else {
            return Err(DecideError::Unavailable(
                "a batch mixes stores; every policy of one limiterd uses the same store".into(),
            ));
        };
        let mut batch = first.backend().batch();
        for (item, (backend, call)) in items.iter().zip(resolved) {
            let Some(stack) = backend.backend().redis_stack() else {
                return Err(DecideError::Unavailable(
                    "a batch mixes stores; every policy of one limiterd uses the same store".into(),
                ));
            };
            if item.charge == Charge::GiveBack {
                return Err(DecideError::Invalid {
                    field: "cost",
                    message: "units given back are decided alone, never in a batch: send them \
                              on their own"
                        .into(),
                });
            }
            if item.charge == Charge::Record {
                batch.add_record(stack, call, item.cost);
            } else if item.shadow {
                batch.add_shadow(stack, call, item.cost);
            } else {
                batch.add(stack, call, item.cost);
            }
        }
        let decided = match batch.decide().await {
            Ok(decided) => decided,
            // Keys in several slots of a cluster: decided one item at a time instead.
            Err(BatchError::CrossSlot { .. }) => {
                return self.decide_across_slots(items, resolved).await;
            }
            Err(e) => return Err(batch_error(&e)),
        };
        let admitted = decided.is_admitted();
        let answers = decided
            .into_decisions()
            .into_iter()
            .zip(resolved)
            .map(|(decision, (backend, call))| self.redis_answer(decision, backend.backend(), call))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((admitted, answers))
    }

    /// A batch whose keys span a cluster's slots (several identifiers, or envoy descriptors):
    /// no script can decide it whole, so each item is decided in turn (records written, the
    /// others taken with a grant), and if one is denied every grant is refunded and the items
    /// report what they hold after it, as in memory. Between the take and the refund the
    /// units are held (a racing call may be denied a moment early); none is ever admitted past
    /// a limit.
    async fn decide_across_slots(
        &self,
        items: &[Item],
        resolved: &[(Resolved<'_, C>, Call)],
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        let mut answers = Vec::with_capacity(items.len());
        let mut grants = Vec::new();
        let mut all = true;
        for (i, (item, (backend, call))) in items.iter().zip(resolved).enumerate() {
            let backend = backend.backend();
            let Some(stack) = backend.redis_stack() else {
                return Err(DecideError::Unavailable(
                    "a batch mixes stores; every policy of one limiterd uses the same store".into(),
                ));
            };
            let answer = if item.charge == Charge::Record {
                self.record_one(backend, call, item.cost).await?
            } else {
                let (decision, grant) = stack
                    .acquire(call, item.cost)
                    .await
                    .map_err(|e| call_error(&e.into()))?;
                if let Some(grant) = grant {
                    grants.push((i, grant));
                }
                self.redis_answer(decision, backend, call)?
            };
            all &= answer.decision.is_allowed() || item.never_denies();
            answers.push(answer);
        }
        if !all {
            for (i, mut grant) in grants {
                let (backend, call) = &resolved[i];
                let (Some(stack), units) = (backend.backend().redis_stack(), grant.left()) else {
                    continue;
                };
                // Refunded, the item reports what it holds now; a refund Redis did not take
                // leaves the units counted (never admitted twice).
                if let Ok(peek) = stack.refund(call, &mut grant, units).await {
                    answers[i] = self.redis_answer(peek, backend.backend(), call)?;
                }
            }
        }
        Ok((all, answers))
    }

    /// One call on any store: in process through the seam, on Redis keeping when Redis
    /// decided.
    async fn call_one(
        &self,
        backend: &Backend<C>,
        call: &Call,
        cost: u64,
    ) -> Result<Answer, DecideError> {
        let decided = match backend {
            Backend::Redis(stack) => stack.check_n(call, cost).await,
            Backend::Leased(stack) => stack.check_n(call, cost).await,
            Backend::Memory(_) => {
                let outcome = backend.limiter().decide_request(call, cost).await;
                return self.answer(outcome, backend, call, None);
            }
        };
        let decision = decided.map_err(|e| call_error(&e.into()))?;
        self.redis_answer(decision, backend, call)
    }

    /// A Redis store's answer, read as every answer is ([`answer`](Self::answer)), at the
    /// instant Redis decided it.
    fn redis_answer(
        &self,
        decision: limiter_redis::RedisDecision,
        backend: &Backend<C>,
        call: &Call,
    ) -> Result<Answer, DecideError> {
        let at = decision.decided_at_micros();
        self.answer(Ok(Outcome::from(decision)), backend, call, at)
    }

    /// One record of usage on a Redis store (per call, or spending the lease first).
    async fn record_one(
        &self,
        backend: &Backend<C>,
        call: &Call,
        cost: u64,
    ) -> Result<Answer, DecideError> {
        let recorded = match backend {
            Backend::Redis(stack) => stack.record(call, cost).await,
            Backend::Leased(stack) => stack.record(call, cost).await,
            Backend::Memory(stack) => {
                let outcome = stack.record(call, cost).map(Outcome::in_process);
                return self.answer(outcome, backend, call, None);
            }
        };
        let decision = recorded.map_err(|e| call_error(&e.into()))?;
        self.redis_answer(decision, backend, call)
    }

    /// Units given back on a Redis store (a leased policy's go to Redis: its leases are its own).
    async fn give_back_one(
        &self,
        backend: &Backend<C>,
        call: &Call,
        units: u64,
    ) -> Result<Answer, DecideError> {
        let stack = match backend {
            Backend::Redis(stack) => stack,
            Backend::Leased(stack) => stack.stack(),
            Backend::Memory(stack) => {
                let outcome = stack.give_back(call, units).map(Outcome::in_process);
                return self.answer(outcome, backend, call, None);
            }
        };
        match stack.give_back(call, units).await {
            Ok(decision) => self.redis_answer(decision, backend, call),
            Err(e) => {
                self.metrics.backend_error();
                Err(DecideError::Unavailable(e.to_string()))
            }
        }
    }

    /// An [`Outcome`] as the API reports it, counting backend failures and failure-policy
    /// answers: the one place a store's answer is read. `at_us` is when Redis decided it (µs
    /// since the Unix epoch); `None`: this process decided it, now.
    fn answer(
        &self,
        outcome: Result<Outcome, CallError>,
        backend: &Backend<C>,
        call: &Call,
        at_us: Option<u64>,
    ) -> Result<Answer, DecideError> {
        let at_unix_ns = match at_us {
            Some(us) => us.saturating_mul(1_000),
            None => self.unix_origin_ns.saturating_add(self.clock.now()),
        };
        let failed = |policy: FailurePolicy| {
            self.metrics.backend_error();
            self.metrics.failure_policy(policy);
        };
        match outcome.map_err(|e| call_error(&e))? {
            Outcome::Decided { decision, origin } => {
                let origin = match origin {
                    limiter_stack::Origin::InProcess => Origin::Memory,
                    limiter_stack::Origin::DenyCache => Origin::DenyCache,
                    limiter_stack::Origin::Lease => Origin::Lease,
                    limiter_stack::Origin::Fallback => {
                        failed(FailurePolicy::Fallback);
                        Origin::Fallback
                    }
                    _ => Origin::Redis,
                };
                Ok(Answer {
                    decision: decision.decision(),
                    origin,
                    at_unix_ns,
                })
            }
            Outcome::FailedOpen(_) => {
                failed(FailurePolicy::Open);
                // Admitted without counting: the policy's tightest limit, with nothing taken.
                let limit = policy_limit(backend, call.plan);
                Ok(Answer {
                    decision: Decision::allow(limit, limit, 0),
                    origin: Origin::FailOpen,
                    at_unix_ns,
                })
            }
            Outcome::FailedClosed(e) => {
                failed(FailurePolicy::Closed);
                Err(DecideError::Unavailable(e.to_string()))
            }
        }
    }
}

/// The smallest count among the limits `backend` applies under `plan` (a configured policy's
/// one plan, or an ad-hoc shape's): what a fail-open answer reports as its limit.
pub(super) fn policy_limit<C: Clock + Send + Sync + 'static>(
    backend: &Backend<C>,
    plan: usize,
) -> u64 {
    backend
        .limiter()
        .layers()
        .iter()
        .filter_map(|layer| layer.plans.get(plan).or_else(|| layer.plans.first()))
        .flatten()
        .map(Limit::count)
        .min()
        .unwrap_or(0)
}

/// A batch Redis cannot decide as the API reports it.
pub(super) fn batch_error(error: &BatchError) -> DecideError {
    match error {
        BatchError::Call { source, .. } => call_error(&source.clone().into()),
        other => DecideError::Unavailable(other.to_string()),
    }
}
