//! A call's calendar quotas on Redis, taken together and with its policy's stack: a call waits
//! one round trip for all of them, where it waited one for each quota and one more for the
//! stack. The quotas are counted at once, all or nothing among themselves, and the stack's take
//! is undoable, so whichever denies, what the others took goes back. The answer is the one the
//! quotas and then the stack, asked in turn, would give: a quota's denial (or its store failing
//! closed) first, the first by the policy's order; then the stack's denial or error; an
//! admission tightened by every quota's answer. A stack deciding against leases is asked
//! after its quotas instead (its take costs no round trip, and cannot be undone; a policy with
//! a lease has no permits). A policy's permits on Redis are asked with them too
//! (`permitted.rs`), and a batch's items count their quotas at once the same way
//! (`quota_batch.rs`).

use futures_util::future::{join, join_all};
use limiter_core::Clock;
use limiter_stack::{Ask, CallError, Charge, Outcome, Taken, Undo};

use super::decide::{Resolved, call_error};
use super::permitted::refund_quotas;
use super::quota_answer::{quota_origin, tighter};
use super::{Answer, DecideError, Engine, Item};
use crate::store::quotas::{PolicyQuota, QuotaTaken};

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
                    self.count_fallback(taken.fell_back.as_deref());
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
        let together = self.take_together(item, reading, &resolved, quotas).await;
        // Admitted or not, the answer stands: what was taken stays taken.
        let TakenTogether { answer, .. } = together;
        self.count_one(item, resolved.2, &answer);
        answer
    }

    /// Takes `item`'s cost in its `quotas` (none, or checked by
    /// [`quota_cost_refused`](Self::quota_cost_refused)) and its `resolved` stack at once, at
    /// the clock's `reading`: the answer, not counted yet, and, when admitted, what to give
    /// back should a permit asked with it be refused; when not admitted, nothing stays taken.
    pub(super) async fn take_together<'r>(
        &self,
        item: &Item,
        reading: u64,
        resolved: &'r Resolved<'_>,
        quotas: &'r [PolicyQuota],
    ) -> TakenTogether<'r> {
        let (stack, call, _) = resolved;
        if stack.is_leased() {
            return self.take_leased(item, reading, resolved, quotas).await;
        }
        let take = stack.take_undoable(call, item.cost, Some(reading));
        let (quotas_counted, taken) = join(self.count_quotas(item, quotas), take).await;
        let (outcome, undo): (Result<Outcome, _>, _) = match taken {
            Ok(Taken { outcome, undo }) => (Ok(outcome), undo),
            Err(error) => (Err(error), None),
        };
        let not_counted = match quotas_counted {
            Ok(counted) => {
                return self
                    .beside_counted(item, (outcome, undo), counted, resolved, reading)
                    .await;
            }
            Err(not_counted) => not_counted,
        };
        // A quota denied: whatever the stack took goes back, and the stack's answer is not
        // read (asked in turn, the stack would not have been asked).
        if let Some(undo) = undo {
            let _ = undo().await;
        }
        TakenTogether::not_admitted(not_counted)
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    /// [`take_together`](Self::take_together) for a stack that decides against leases: the
    /// quotas first, then the lease (no round trip; a take that went to Redis to be undoable
    /// would spend a call on every decision the lease saves). Nothing of the stack's is given
    /// back, so no permit is asked with it (a policy with a lease has none).
    async fn take_leased<'r>(
        &self,
        item: &Item,
        reading: u64,
        resolved: &'r Resolved<'_>,
        quotas: &'r [PolicyQuota],
    ) -> TakenTogether<'r> {
        let counted = match self.count_quotas(item, quotas).await {
            Ok(counted) => counted,
            Err(not_counted) => return TakenTogether::not_admitted(not_counted),
        };
        let (stack, call, _) = resolved;
        let ask = Ask::new(item.cost, Charge::Take).at(Some(reading));
        let asked = stack.ask(call, ask).await;
        self.beside_counted(item, (asked, None), counted, resolved, reading)
            .await
    }

    /// The stack's answer (`asked`, with the undo of what it took) beside quotas that every
    /// one `counted`: an admission tightened by each quota's answer, holding what was taken;
    /// otherwise (denied, failed or undecidable) the quotas given back.
    async fn beside_counted<'r>(
        &self,
        item: &Item,
        (asked, undo): (Result<Outcome, CallError>, Option<Undo<'r>>),
        counted: QuotasCounted<'r>,
        resolved: &Resolved<'_>,
        reading: u64,
    ) -> TakenTogether<'r> {
        match self.read_outcome(item, asked, resolved, reading) {
            Ok(answer) if answer.decision.is_allowed() => TakenTogether {
                answer: Ok(counted.iter().fold(answer, |a, (_, q)| tighter(a, q))),
                taken: Some((undo, counted)),
            },
            other => {
                refund_quotas(item, &counted, self.now_unix_ns()).await;
                TakenTogether {
                    answer: other,
                    taken: None,
                }
            }
        }
    }
}

/// What a call's quotas and stack, taken together, answered (not counted yet), and what an
/// admission took.
pub(super) struct TakenTogether<'r> {
    /// The answer, as the quotas and then the stack, asked in turn, would give it.
    pub(super) answer: Result<Answer, DecideError>,
    /// An admission's take of the stack (to undo) and of each quota.
    taken: Option<(Option<Undo<'r>>, QuotasCounted<'r>)>,
}

impl TakenTogether<'_> {
    /// A call its quotas refused, nothing taken.
    fn not_admitted(not_counted: NotCounted) -> Self {
        Self {
            answer: match not_counted {
                NotCounted::Denied(answer) => Ok(answer),
                NotCounted::Refused(error) => Err(error),
            },
            taken: None,
        }
    }

    /// Gives back everything an admission took (nothing otherwise: a call not admitted kept
    /// nothing), leaving the answer uncounted.
    pub(super) async fn give_back(self, item: &Item, now_unix_ns: u64) {
        let Some((undo, counted)) = self.taken else {
            return;
        };
        let stack = async {
            if let Some(undo) = undo {
                let _ = undo().await;
            }
        };
        join(stack, refund_quotas(item, &counted, now_unix_ns)).await;
    }
}
