//! A call's calendar quotas on Redis, taken together and with its policy's stack: a call waits
//! one round trip for all of them, where it waited one for each quota and one more for the
//! stack. The quotas are counted at once, all or nothing among themselves, and the stack's take
//! is undoable, so whichever denies, what the others took goes back. The answer is the one the
//! quotas and then the stack, asked in turn, would give: a quota's denial (or its store failing
//! closed) first, the first by the policy's order; then the stack's denial or error; an
//! admission tightened by every quota's answer. A batch's items count their quotas at once
//! the same way (`quota_batch.rs`).

use futures_util::future::{join, join_all};
use limiter_core::Clock;
use limiter_stack::{Outcome, Taken};

use super::decide::call_error;
use super::permitted::refund_quotas;
use super::quota_answer::{quota_origin, tighter};
use super::{Answer, DecideError, Engine, Item};
use crate::metrics::Counted;
use crate::store::quotas::{CountedIn, PolicyQuota, QuotaTaken};

/// What every quota of an item counted (a quota whose store failed open counted nothing).
pub(super) type QuotasCounted<'q> = Vec<(&'q PolicyQuota, QuotaTaken)>;

/// Why an item's quotas counted nothing.
pub(super) enum NotCounted {
    /// A quota denied (the first, by the policy's order): its answer.
    Denied(Answer),
    /// A quota's store failed and its policy fails closed.
    Refused(DecideError),
}

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    /// `item`'s cost above a quota's count (no window can ever admit it): the error, before
    /// anything is taken, as in memory.
    pub(super) fn quota_cost_refused(
        &self,
        item: &Item,
        quotas: &[PolicyQuota],
    ) -> Result<(), DecideError> {
        match quotas.iter().find_map(|quota| quota.unreachable(item.cost)) {
            Some(error) => Err(call_error(&error)),
            None => Ok(()),
        }
    }

    /// Counts `item`'s cost in every quota at once, all or nothing: when one denies or fails
    /// closed, the others give back what they counted. Nothing is counted in the metrics but
    /// the stores' failures and fallbacks; the caller counts the call.
    pub(super) async fn count_quotas<'q>(
        &self,
        item: &Item,
        quotas: &'q [PolicyQuota],
    ) -> Result<QuotasCounted<'q>, NotCounted> {
        let now = self.now_unix_ns();
        let takes = quotas
            .iter()
            .map(|quota| quota.take(&item.identifier, item.cost, now));
        let answers = join_all(takes).await;
        let mut counted = Vec::with_capacity(quotas.len());
        let mut refused = None;
        for (quota, answer) in quotas.iter().zip(answers) {
            let not_counted = match answer {
                Ok(taken) => {
                    self.count_fallback(matches!(taken.place, CountedIn::Fallback { .. }));
                    if taken.decision.is_allowed() {
                        counted.push((quota, taken));
                        continue;
                    }
                    NotCounted::Denied(Answer {
                        decision: taken.decision,
                        origin: quota_origin(taken.place),
                        at_unix_ns: taken.at_unix_ns,
                    })
                }
                // Open: this quota counts nothing while its store fails (a falling-back
                // policy's stand-in answered instead of failing).
                Err(failure) => match self.quota_failed(quota, failure) {
                    Ok(nothing_counted) => {
                        counted.push((quota, nothing_counted));
                        continue;
                    }
                    Err(closed) => NotCounted::Refused(closed),
                },
            };
            refused.get_or_insert(not_counted);
        }
        match refused {
            None => Ok(counted),
            Some(refused) => {
                refund_quotas(item, &counted, self.now_unix_ns()).await;
                Err(refused)
            }
        }
    }

    /// Takes `item`'s cost in its `quotas` and its stack at once (see the module docs): the
    /// answer, counted; when it is not an admission, nothing stays taken.
    pub(super) async fn take_with_quotas(
        &self,
        item: &Item,
        time_ms: Option<u64>,
        quotas: &[PolicyQuota],
    ) -> Result<Answer, DecideError> {
        self.quota_cost_refused(item, quotas)?;
        let reading = self.reading_for(time_ms)?;
        let resolved = self.resolve(item)?;
        let (stack, call, counters) = &resolved;
        let take = stack.take_undoable(call, item.cost, Some(reading));
        let (quotas_counted, taken) = join(self.count_quotas(item, quotas), take).await;
        let (outcome, undo): (Result<Outcome, _>, _) = match taken {
            Ok(Taken { outcome, undo }) => (Ok(outcome), undo),
            Err(error) => (Err(error), None),
        };
        let denied = match quotas_counted {
            Ok(counted) => {
                return match self.read_one(item, outcome, &resolved, reading) {
                    Ok(answer) if answer.decision.is_allowed() => {
                        Ok(counted.iter().fold(answer, |a, (_, q)| tighter(a, q)))
                    }
                    // Denied, failed or undecidable: the quotas go back.
                    other => {
                        refund_quotas(item, &counted, self.now_unix_ns()).await;
                        other
                    }
                };
            }
            Err(NotCounted::Denied(answer)) => Ok(answer),
            Err(NotCounted::Refused(error)) => Err(error),
        };
        // A quota denied: whatever the stack took goes back, and the stack's answer is not
        // read (asked in turn, the stack would not have been asked).
        if let Some(undo) = undo {
            let _ = undo().await;
        }
        if denied.is_ok() {
            counters.count(Counted::Denied { shadow: false }, &item.identifier);
        }
        denied
    }
}
