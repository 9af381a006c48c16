//! Items resolved to their policies and decided through the seam, all or nothing (one ask, or
//! a batch by [`stacks::decide_batch`](crate::stacks::decide_batch): one Redis script when
//! every policy is on Redis, takes and refunds otherwise), and every store's outcome read as
//! an [`Answer`] in one place.

use std::borrow::Cow;

use limiter_core::{Clock, Decision, Limit};
use limiter_stack::{Ask, BatchItem, CallError, Origin, Outcome};

use crate::config::Keying;
use crate::metrics::{Counted, FailurePolicy};

use super::*;

/// An item's stack (a configured policy's and the in-process ad-hoc home's borrowed: no
/// reference count every request on every core would bump; a Redis ad-hoc shape's owned), its
/// call, and its counters.
pub(super) type Resolved<'a> = (Cow<'a, PolicyStack>, Call, &'a PolicyCounters);

/// How an item's answer counts: a peek, a record, a refund, a denial, an admission, or a take
/// its batch refused (`admitted`: whether the call as a whole was).
pub(super) fn counted(item: &Item, answer: &Answer, admitted: bool) -> Counted {
    if item.cost == 0 {
        Counted::Peeked
    } else if item.charge == Charge::Record {
        Counted::Recorded
    } else if item.charge == Charge::Refund {
        Counted::GivenBack
    } else if !answer.decision.is_allowed() {
        Counted::Denied {
            shadow: item.shadow,
        }
    } else if admitted {
        Counted::Allowed
    } else {
        Counted::BatchRefused
    }
}

/// An ad-hoc limit's key for `identifier` in `namespace`: `{namespace length}:{namespace}:
/// {identifier}`, after `{algorithm}/` for an algorithm other than the token bucket. Put
/// together piece by piece (`format!` over the three cost about 600 instructions a decision)
/// in the thread's buffer, so the key is one allocation, the one the stack may keep.
fn ad_hoc_key(kind: Kind, namespace: &str, identifier: &str) -> Arc<str> {
    thread_local! {
        static KEY: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
    }
    /// The longest buffer a thread keeps between keys (a longer key's is given back).
    const KEPT: usize = 1_024;
    let algorithm = if kind == Kind::TokenBucket {
        ""
    } else {
        kind.id()
    };
    let write = |key: &mut String| {
        key.clear();
        if !algorithm.is_empty() {
            key.push_str(algorithm);
            key.push('/');
        }
        key.push_str(itoa::Buffer::new().format(namespace.len()));
        key.push(':');
        key.push_str(namespace);
        key.push(':');
        key.push_str(identifier);
        let made = Arc::from(key.as_str());
        key.shrink_to(KEPT);
        made
    };
    // A thread whose locals are being torn down writes into a buffer of its own.
    KEY.try_with(|key| key.try_borrow_mut().map(|mut key| write(&mut key)).ok())
        .ok()
        .flatten()
        .unwrap_or_else(|| write(&mut String::new()))
}

/// A call that can never be decided, as the API reports it.
pub(super) fn call_error(e: &CallError) -> DecideError {
    match e {
        // Logged where it is counted, paced (`Metrics::store_full`).
        CallError::Full { .. } => DecideError::Full(e.to_string()),
        _ => DecideError::invalid("cost", cost_refused(e).unwrap_or_else(|| e.to_string())),
    }
}

/// A cost above a burst, worded for the API's caller: a limit of the policy, named by its
/// burst and how it counts, not by the stack's layer and index (which number neither a
/// policy's concurrency limit nor its order); `None` for any other error.
fn cost_refused(e: &CallError) -> Option<String> {
    let CallError::Decision {
        layer,
        source: limiter_core::DecisionError::CostExceedsBurst { cost, burst },
        ..
    } = e
    else {
        return None;
    };
    // A policy's layers are named by their keying (`stacks/limits.rs`).
    let counted = match layer.as_str() {
        name if name == Keying::Identifier.layer_name() => "counted per identifier",
        name if name == Keying::Global.layer_name() => "counted for every identifier together",
        _ => return None,
    };
    Some(format!(
        "`cost` {cost} is above the burst of {burst} of a limit of the policy {counted}, so it \
         could never be admitted; split the request into parts of at most {burst} units or \
         raise that limit's burst; to record usage that already happened, add `\"record\": true`"
    ))
}

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    pub(super) fn resolve(&self, item: &Item) -> Result<Resolved<'_>, DecideError> {
        match &item.target {
            Target::Policy(id) => {
                let entry = self.policies.get(id.0).ok_or_else(|| {
                    DecideError::invalid("policy", format!("no policy number {}", id.0))
                })?;
                let call = Call {
                    identifier: Arc::clone(&item.identifier),
                    plan: entry.plan,
                };
                Ok((Cow::Borrowed(&entry.stack), call, &entry.counters))
            }
            Target::AdHoc {
                kind,
                limit,
                duration_ms,
                namespace,
            } => {
                let (stack, plan) = self.ad_hoc_stack(*kind, *limit, *duration_ms)?;
                // The namespace keeps callers apart, its length first, so the separator cannot
                // be forged into another namespace's key; an algorithm other than the token
                // bucket (the native API's) names itself first, so no key is ever counted by
                // two algorithms (a token bucket's key starts with a digit, the others' with
                // the algorithm's name).
                let call = Call {
                    identifier: ad_hoc_key(*kind, namespace, &item.identifier),
                    plan,
                };
                Ok((stack, call, &self.ad_hoc_counters))
            }
        }
    }

    /// The clock's reading for a request's `time` (ms since the Unix epoch), as the engine
    /// decides it: a time before what the clock counts from is refused, and so is one more
    /// than [`MAX_TIME_AHEAD_MS`] ahead of the clock; one ahead by less is the clock's own
    /// reading (a time cannot spend what has not come back yet). `None`: now.
    pub(super) fn reading_for(&self, time_ms: Option<u64>) -> Result<u64, DecideError> {
        let now = self.stacks.clock().now();
        let Some(time_ms) = time_ms else {
            return Ok(now);
        };
        let invalid = |message: String| DecideError::invalid("time", message);
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
        self.refuse_permits(items)?;
        let quotas = items.iter().any(|item| !self.gates_of(item).1.is_empty());
        let decided = if quotas {
            // Boxed: its state (several stacks' answers held across store calls) would make
            // every request's future kilobytes, moved whole wherever the request's future is.
            Box::pin(self.decide_with_quotas(items, time_ms)).await
        } else {
            self.decide_checked(items, time_ms).await
        };
        match items {
            // One item: whatever was wrong was its own.
            [_] => decided.map_err(|e| e.in_item(0)),
            _ => decided,
        }
    }

    /// [`decide_at`](Self::decide_at) once the items are known to take no permit.
    pub(super) async fn decide_checked(
        &self,
        items: &[Item],
        time_ms: Option<u64>,
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        if let [item] = items {
            let answer = self.decide_checked_one(item, time_ms).await?;
            let admitted = answer.decision.is_allowed() || item.never_denies();
            return Ok((admitted, vec![answer]));
        }
        let reading = self.reading_for(time_ms)?;
        let resolved = items
            .iter()
            .enumerate()
            .map(|(i, item)| self.resolve(item).map_err(|e| e.in_item(i)))
            .collect::<Result<Vec<_>, _>>()?;
        // Boxed, as the quotas' path above: a batch's state is kilobytes, and most requests
        // ask one item.
        let result = Box::pin(self.decide_batch(items, &resolved, reading)).await;
        match &result {
            Ok((admitted, answers)) => {
                for ((item, (_, _, counters)), answer) in items.iter().zip(&resolved).zip(answers) {
                    counters.count(counted(item, answer, *admitted), &item.identifier);
                }
            }
            Err(e) => self.count_error(e),
        }
        result
    }

    /// One item known to take no permit: one ask of its stack, with nothing collected.
    pub(super) async fn decide_checked_one(
        &self,
        item: &Item,
        time_ms: Option<u64>,
    ) -> Result<Answer, DecideError> {
        let reading = self.reading_for(time_ms)?;
        let resolved = self.resolve(item)?;
        let ask = Ask::new(item.cost, item.charge).at(Some(reading));
        let asked = resolved.0.ask(&resolved.1, ask).await;
        let result = self.read_outcome(item, asked, &resolved, reading);
        self.count_one(item, resolved.2, &result);
        result
    }

    /// What one item's stack answered (`asked`, at the clock's `reading`), as the API reports
    /// it (not counted yet: [`count_one`](Self::count_one)).
    pub(super) fn read_outcome(
        &self,
        item: &Item,
        asked: Result<Outcome, CallError>,
        (stack, call, _): &Resolved<'_>,
        reading: u64,
    ) -> Result<Answer, DecideError> {
        let asked = asked.map_err(|e| self.numbered_as_in_memory(item, e));
        self.answer(asked, stack, call, reading)
    }

    /// Counts one item's `result` where the metrics count it.
    pub(super) fn count_one(
        &self,
        item: &Item,
        counters: &PolicyCounters,
        result: &Result<Answer, DecideError>,
    ) {
        match result {
            // One item is admitted whenever its stack admits it.
            Ok(answer) => counters.count(counted(item, answer, true), &item.identifier),
            Err(e) => self.count_error(e),
        }
    }

    /// Counts a decision that could not be made where the metrics name it (a full store).
    fn count_error(&self, e: &DecideError) {
        if let DecideError::Full(why) = e {
            self.metrics.store_full(why);
        }
    }

    /// Several items, all or nothing, decided by the first item's store (one script call on
    /// Redis, takes and refunds otherwise).
    pub(super) async fn decide_batch(
        &self,
        items: &[Item],
        resolved: &[Resolved<'_>],
        reading: u64,
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        let batch: Vec<BatchItem<'_, Call>> = items
            .iter()
            .zip(resolved)
            .map(|(item, (stack, call, _))| BatchItem {
                limiter: &***stack,
                request: call,
                cost: item.cost,
                charge: item.charge,
                shadow: item.shadow,
            })
            .collect();
        let stacks: Vec<&PolicyStack> = resolved.iter().map(|(stack, _, _)| &**stack).collect();
        let decided = crate::stacks::decide_batch(&batch, &stacks, Some(reading))
            .await
            .map_err(|e| {
                let (item, error) = self.batch_error_located(items, resolved, e);
                let error = call_error(&error);
                match item {
                    Some(i) => error.in_item(i),
                    None => error,
                }
            })?;
        // A refused batch's admitted takes were refunded and report what they hold after the
        // refund, read at the clock's reading then (no earlier than the batch's).
        let refunded_at = self.stacks.clock().now().max(reading);
        let answers = decided
            .outcomes
            .into_iter()
            .zip(items.iter().zip(resolved))
            .map(|(outcome, (item, (stack, call, _)))| {
                let refunded = !decided.admitted
                    && item.cost > 0
                    && item.charge == Charge::Take
                    && matches!(&outcome, Outcome::Decided { decision, .. } if decision.is_allowed());
                let at = if refunded { refunded_at } else { reading };
                self.answer(Ok(outcome), stack, call, at)
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((decided.admitted, answers))
    }

    /// An [`Outcome`] as the API reports it, counting backend failures and failure-policy
    /// answers: the one place a store's answer is read. A remote store's answer is at the
    /// instant it decided it; one of this process at the clock's `reading`.
    fn answer(
        &self,
        outcome: Result<Outcome, CallError>,
        stack: &PolicyStack,
        call: &Call,
        reading: u64,
    ) -> Result<Answer, DecideError> {
        let here = |reading: u64| self.unix_origin_ns.saturating_add(reading);
        // `why`: the store's error (every failure policy's answer carries it).
        let failed = |policy: FailurePolicy, why: &dyn std::fmt::Display| {
            self.metrics.store_failed(why);
            self.metrics.failure_policy(policy);
        };
        match outcome.map_err(|e| call_error(&e))? {
            Outcome::Decided {
                decision,
                origin,
                at_unix_us,
                failure,
            } => {
                if origin == Origin::Fallback {
                    let unknown = "the store failed (no error given)";
                    match &failure {
                        Some(error) => failed(FailurePolicy::Fallback, error),
                        None => failed(FailurePolicy::Fallback, &unknown),
                    }
                }
                let at_unix_ns = match (at_unix_us, origin) {
                    (Some(us), _) => us.saturating_mul(1_000),
                    (None, Origin::InProcess) => here(reading),
                    (None, _) => here(self.stacks.clock().now()),
                };
                Ok(Answer {
                    decision: decision.decision(),
                    origin: Some(origin),
                    at_unix_ns,
                })
            }
            Outcome::FailedOpen(e) => {
                failed(FailurePolicy::Open, &e);
                // Admitted without counting: the policy's tightest limit, with nothing taken.
                let limit = policy_limit(&**stack, call.plan);
                Ok(Answer {
                    decision: Decision::allow(limit, limit, 0),
                    origin: None,
                    at_unix_ns: here(self.stacks.clock().now()),
                })
            }
            Outcome::FailedClosed(e) => {
                failed(FailurePolicy::Closed, &e);
                Err(DecideError::Unavailable(e.to_string()))
            }
        }
    }
}

/// The smallest count among the limits `stack` applies under `plan` (a configured policy's
/// one plan, or an ad-hoc shape's): what a fail-open answer reports as its limit.
fn policy_limit(stack: &dyn AsyncLimiter<Call>, plan: usize) -> u64 {
    stack
        .layers()
        .iter()
        .filter_map(|layer| layer.plans.get(plan).or_else(|| layer.plans.first()))
        .flatten()
        .map(Limit::count)
        .min()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ad_hoc_keys_keep_namespaces_and_algorithms_apart() {
        assert_eq!(
            &*ad_hoc_key(Kind::TokenBucket, "email", "u-1"),
            "5:email:u-1"
        );
        assert_eq!(
            &*ad_hoc_key(Kind::SlidingWindow, "email", "u-1"),
            "sliding_window/5:email:u-1"
        );
        // The separator cannot be forged: the namespace's length comes first.
        assert_ne!(
            ad_hoc_key(Kind::TokenBucket, "a:b", "c"),
            ad_hoc_key(Kind::TokenBucket, "a", "b:c")
        );
        let long = "n".repeat(1234);
        assert!(ad_hoc_key(Kind::FixedWindow, &long, "x").starts_with("fixed_window/1234:nnn"));
        // The thread's buffer, reused after a long key, holds the next key alone.
        assert_eq!(&*ad_hoc_key(Kind::TokenBucket, "e", "u"), "1:e:u");
    }
}
