//! A policy's answer beside its calendar quotas on Redis (kept apart from its stack, whose
//! script knows no calendar): the stack's answer and each quota's folded by the stack's own
//! rule, and the stack's errors numbering its limits as the policy's one layer in memory does,
//! so a policy answers on Redis as the same limits in one stack answer in memory.

use limiter_core::{Clock, Decision, DecisionError};
use limiter_stack::{CallError, LayerInfo, Origin};

use super::decide::Resolved;
use super::{Answer, Charge, Engine, Item, Target};
use crate::stacks::PolicyStack;
use crate::store::quotas::{CountedIn, QuotaTaken};

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    /// `error` from `item`'s policy stack, its limit numbered as in memory: where a layer's
    /// limits include calendar quotas (kept beside the stack on Redis), the stack's limits
    /// after one are numbered one less than the same layer's in memory.
    pub(super) fn numbered_as_in_memory(&self, item: &Item, error: CallError) -> CallError {
        let CallError::Decision {
            layer,
            limit_index,
            source,
        } = error
        else {
            return error;
        };
        let entry = match &item.target {
            Target::Policy(id) => self.policies.get(id.0),
            Target::AdHoc { .. } => None,
        };
        let limit_index = entry
            .filter(|entry| !entry.quotas.is_empty())
            .and_then(|entry| {
                entry
                    .spec
                    .limits
                    .iter()
                    .filter(|l| l.keying.layer_name() == layer)
                    .enumerate()
                    .filter(|(_, l)| !l.limit.is_quota_beside_stack())
                    .nth(limit_index)
                    .map(|(in_memory, _)| in_memory)
            })
            .unwrap_or(limit_index);
        CallError::Decision {
            layer,
            limit_index,
            source,
        }
    }

    /// The item a batch's `error` came from (a batch's error does not name one), and the
    /// error numbered as in memory: the first take whose policy stack refuses its cost before
    /// anything is counted, as the batch refuses the first (on Redis, the error the stack
    /// answers before sending; in memory, a cost above the burst the error names, of a limit
    /// of the layer it names). No item where none refuses alike.
    pub(super) fn batch_error_located(
        &self,
        items: &[Item],
        resolved: &[Resolved<'_>],
        error: CallError,
    ) -> (Option<usize>, CallError) {
        for (index, (item, (stack, call, _))) in items.iter().zip(resolved).enumerate() {
            if item.charge != Charge::Take || item.cost == 0 {
                continue;
            }
            match stack.per_call() {
                Some(on_redis) => {
                    if let Err(refused) = on_redis.check_cost(call, item.cost) {
                        if refused != error {
                            return (None, error);
                        }
                        return (Some(index), self.numbered_as_in_memory(item, refused));
                    }
                }
                None if refuses_in_memory(stack, item.cost, &error) => {
                    return (Some(index), error);
                }
                None => {}
            }
        }
        (None, error)
    }
}

/// Whether `error` is an in-process `stack`'s refusal of a take of `cost`: a cost above the
/// burst it names, that of a limit at the position it names in a layer of the name it names.
fn refuses_in_memory(stack: &PolicyStack, cost: u64, error: &CallError) -> bool {
    let CallError::Decision {
        layer,
        limit_index,
        source:
            DecisionError::CostExceedsBurst {
                cost: refused,
                burst,
            },
    } = error
    else {
        return false;
    };
    let names_a_limit = |plan: &Vec<limiter_core::Limit>| {
        plan.get(*limit_index)
            .is_some_and(|limit| limit.burst() == *burst)
    };
    let names_the_layer =
        |info: &LayerInfo| info.name == *layer && info.plans.iter().any(names_a_limit);
    *refused == cost && stack.layers().iter().any(names_the_layer)
}

/// `answer` and `quota`'s, as a stack folds two layers: admitted only if both are; bound by a
/// denial over an admission, the longer wait of two denials, else the fewer left (a tie keeps
/// `answer`'s); the fewest left; full again when both are. Measured from the binding one's
/// reading (a quota's, measured from its own, names the window's end exactly) and answered by
/// whoever bound it.
pub(super) fn tighter(answer: Answer, quota: &QuotaTaken) -> Answer {
    let quota_answer = Answer {
        decision: quota.decision,
        origin: quota_origin(quota.place),
        at_unix_ns: quota.at_unix_ns,
    };
    folded(answer, quota_answer)
}

/// `answer` beside a gate's (a quota's, or permits whose store failed open), folded as
/// [`tighter`] folds a quota's.
pub(super) fn folded(answer: Answer, gate: Answer) -> Answer {
    let (ours, theirs) = (answer.decision, gate.decision);
    if ours.limit() == u64::MAX {
        // No limit of the stack applied: the gate's answer alone.
        return gate;
    }
    let retry_at = |a: &Answer| a.at_unix_ns.saturating_add(a.decision.retry_after_nanos());
    let gate_binds = match (theirs.is_denied(), ours.is_denied()) {
        (true, false) => true,
        (false, true) => false,
        (true, true) => retry_at(&gate) > retry_at(&answer),
        (false, false) => theirs.remaining() < ours.remaining(),
    };
    let reset_at = |a: &Answer| a.at_unix_ns.saturating_add(a.decision.reset_after_nanos());
    let full_at = reset_at(&answer).max(reset_at(&gate));
    let binding = if gate_binds { gate } else { answer };
    let origin = answered_by([answer.origin, gate.origin], binding.origin);
    let bound = binding.decision;
    let reset = full_at.saturating_sub(binding.at_unix_ns);
    let remaining = ours.remaining().min(theirs.remaining());
    let decision = if ours.is_allowed() && theirs.is_allowed() {
        Decision::allow(bound.limit(), remaining, reset)
    } else {
        Decision::deny(bound.limit(), remaining, bound.retry_after_nanos(), reset)
    };
    Answer {
        decision,
        origin,
        ..binding
    }
}

/// Who answered a call decided in parts (its rate limits, a calendar quota, permits): where a
/// part's store failed, its failure policy's answer, whichever part bound (failing open,
/// `None`, over a fallback), so a caller sees a degraded answer as one; else `binding`, who
/// answered the part that bound.
pub(super) fn answered_by(parts: [Option<Origin>; 2], binding: Option<Origin>) -> Option<Origin> {
    if parts.contains(&None) {
        None
    } else if parts.contains(&Some(Origin::Fallback)) {
        Some(Origin::Fallback)
    } else {
        binding
    }
}

/// Who answered for a quota: Redis, this node's stand-in while Redis failed, or nobody (its
/// policy failed open).
pub(super) fn quota_origin(place: CountedIn) -> Option<Origin> {
    match place {
        CountedIn::Redis { .. } => Some(Origin::Remote),
        CountedIn::Fallback { .. } => Some(Origin::Fallback),
        CountedIn::Nowhere => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn stack(decision: Decision, at: u64) -> Answer {
        Answer {
            decision,
            origin: Some(Origin::Remote),
            at_unix_ns: at,
        }
    }

    fn quota(decision: Decision, at: u64) -> QuotaTaken {
        QuotaTaken {
            decision,
            place: CountedIn::Redis { window: 7 },
            at_unix_ns: at,
            fell_back: None,
        }
    }

    #[test]
    fn the_fewer_left_binds_and_the_answer_is_full_again_when_both_are() {
        // A bucket of 15 with 5 left, full in 40 s; a month of 100 with 90 left, ending in
        // 2 days (its reading a millisecond later).
        let (at, month_end) = (1_000 * S, 1_000 * S + 2 * 86_400 * S);
        let bucket = stack(Decision::allow(15, 5, 40 * S), at);
        let month = quota(
            Decision::allow(100, 90, month_end - at - 1_000_000),
            at + 1_000_000,
        );
        let both = tighter(bucket, &month);
        assert!(both.decision.is_allowed());
        assert_eq!((both.decision.limit(), both.decision.remaining()), (15, 5));
        assert_eq!(
            both.at_unix_ns + both.decision.reset_after_nanos(),
            month_end
        );
        // The month with fewer left binds, answered by Redis from its own reading.
        let month = quota(Decision::allow(100, 2, month_end - at), at);
        let both = tighter(bucket, &month);
        assert_eq!((both.decision.limit(), both.decision.remaining()), (100, 2));
        assert_eq!(
            both.at_unix_ns + both.decision.reset_after_nanos(),
            month_end
        );
    }

    #[test]
    fn a_denial_binds_and_of_two_denials_the_longer_wait() {
        let at = 1_000 * S;
        let bucket_denied = stack(Decision::deny(15, 0, 4 * S, 60 * S), at);
        let month_left = quota(Decision::allow(100, 90, 86_400 * S), at);
        let both = tighter(bucket_denied, &month_left);
        assert!(both.decision.is_denied());
        assert_eq!(both.decision.limit(), 15);
        assert_eq!(both.decision.retry_after_nanos(), 4 * S);
        assert_eq!(both.decision.reset_after_nanos(), 86_400 * S);
        let month_spent = quota(Decision::deny(100, 0, 86_400 * S, 86_400 * S), at);
        let both = tighter(bucket_denied, &month_spent);
        assert_eq!(both.decision.limit(), 100);
        assert_eq!(both.decision.retry_after_nanos(), 86_400 * S);
        assert_eq!(both.origin, Some(Origin::Remote));
        // No limit of the stack applied: the quota's answer alone.
        let unbound = stack(Decision::allow(u64::MAX, u64::MAX, 0), at);
        assert_eq!(tighter(unbound, &month_left).decision, month_left.decision);
    }

    /// A part its store's failure answered for names the answer, whichever part bound: the
    /// caller sees a degraded answer as one (failing open over a fallback).
    #[test]
    fn a_part_answered_by_its_failure_policy_names_the_answer_whichever_binds() {
        let at = 1_000 * S;
        let by = |origin| Answer {
            origin,
            ..stack(Decision::allow(15, 10, S), at)
        };
        // The month with fewer left binds, counted on Redis; the stack fell back.
        let month = quota(Decision::allow(100, 2, 86_400 * S), at);
        let both = tighter(by(Some(Origin::Fallback)), &month);
        assert_eq!(both.decision.remaining(), 2, "the month binds");
        assert_eq!(both.origin, Some(Origin::Fallback));
        // The stack binds; the month was counted by this node's stand-in.
        let stood_in = QuotaTaken {
            place: CountedIn::Fallback { at_unix_ns: at },
            ..quota(Decision::allow(100, 90, 86_400 * S), at)
        };
        let both = tighter(by(Some(Origin::Remote)), &stood_in);
        assert_eq!(both.decision.remaining(), 10, "the stack binds");
        assert_eq!(both.origin, Some(Origin::Fallback));
        // Failing open (nothing counted) over a fallback.
        assert_eq!(tighter(by(None), &stood_in).origin, None);
        // Nothing failed: whoever answered the part that bound.
        assert_eq!(
            tighter(by(Some(Origin::Lease)), &month).origin,
            Some(Origin::Remote)
        );
        assert_eq!(
            tighter(
                by(Some(Origin::Lease)),
                &quota(Decision::allow(100, 90, S), at)
            )
            .origin,
            Some(Origin::Lease)
        );
    }
}
