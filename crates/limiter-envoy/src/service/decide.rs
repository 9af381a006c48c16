//! A request decided on the [`Decider`], all or nothing: the descriptors within their limits move
//! together or not at all, hits that go over are counted as the reference counts them, and
//! negative hits are given back first.

use std::collections::HashSet;

use crate::decider::{Answer, Charge, Decider, Item, RuleStats};

use super::*;

impl<L: Copy + PartialEq, S: RuleStats> Envoy<L, S> {
    /// Decides `request` on `engine`, all or nothing across its enforced descriptors.
    pub async fn decide<D: Decider<Limit = L, Stats = S>>(
        &self,
        engine: &D,
        request: &Request,
    ) -> Result<Response, EnvoyError> {
        Self::check(request)?;
        if request.descriptors.len() > MAX_DESCRIPTORS {
            return Ok(self.too_many(request));
        }
        let plans = self.plans(engine, request).await?;
        let enforced = |stats: &Stats<'_, S>| !(stats.shadow || stats.quota || self.global(stats));
        let refused = plans
            .iter()
            .any(|p| matches!(p, Plan::Refused { stats, .. } if enforced(stats)));
        // Something is over before counting: only report the others (cost 0), so nothing moves.
        let (slots, items) = items_to_decide(&plans, refused);
        let (admitted, mut answers) = if items.is_empty() {
            (true, Vec::new())
        } else {
            engine.decide(&items).await?
        };
        // Hits over a counter are rare: recorded behind a box, so the usual request's future
        // does not hold the engine's recording calls.
        let counters = counters_charged(&plans, &slots, &answers, refused);
        let recorded = if counters.iter().any(|c| c.over) {
            let taken = !refused && admitted;
            Box::pin(self.count_over_hits(engine, &plans, &counters, &mut answers, taken)).await?
        } else {
            vec![None; plans.len()]
        };
        let mut outcome = Outcome::default();
        let statuses = plans
            .iter()
            .zip(&slots)
            .enumerate()
            .map(|(index, (plan, slot))| {
                let decided = slot.and_then(|i| answers.get(i));
                let over_hits = recorded.get(index).copied().flatten();
                self.status(index, plan, (decided, over_hits), &mut outcome, engine)
            })
            .collect::<Vec<_>>();
        if outcome.shadowed_globally && !(refused || outcome.over) {
            engine.stat("", "global_shadow_mode", 1);
        }
        let overall = if refused || outcome.over {
            Code::OverLimit
        } else {
            Code::Ok
        };
        Ok(Response {
            overall,
            headers: self.headers(&statuses),
            dynamic_metadata: self.metadata(request, &outcome),
            statuses,
        })
    }

    /// Each descriptor's plan, negative hits given back first; a matched limit named in
    /// another matched limit's `replaces` does not apply, whether that other limit counts,
    /// refuses before counting, or is unlimited.
    async fn plans<'a, D: Decider<Limit = L, Stats = S>>(
        &'a self,
        engine: &D,
        request: &Request,
    ) -> Result<Vec<Plan<'a, L, S>>, EnvoyError> {
        let mut plans = Vec::with_capacity(request.descriptors.len());
        let mut replaced: HashSet<&str> = HashSet::new();
        for descriptor in &request.descriptors {
            let (plan, replaces) = self.plan(request, descriptor);
            replaced.extend(replaces.iter().map(String::as_str));
            let plan = if descriptor.negative_hits {
                // Rare: behind a box, as the recording of hits over a counter.
                Box::pin(self.refund_units(engine, plan)).await?
            } else {
                plan
            };
            plans.push(plan);
        }
        if !replaced.is_empty() {
            for plan in &mut plans {
                let name = match plan {
                    Plan::Counted { shown, .. } | Plan::Refused { shown, .. } => &shown.name,
                    _ => continue,
                };
                if !name.is_empty() && replaced.contains(name.as_str()) {
                    *plan = Plan::Free;
                }
            }
        }
        Ok(plans)
    }

    /// A descriptor's hits given back (`is_negative_hits`), before the rest of the request is
    /// decided: its counter takes them back (never above full), whatever else the request
    /// asks, and the descriptor answers `OK` with what the counter holds after.
    async fn refund_units<'a, D: Decider<Limit = L, Stats = S>>(
        &self,
        engine: &D,
        plan: Plan<'a, L, S>,
    ) -> Result<Plan<'a, L, S>, EnvoyError> {
        let (shown, item) = match plan {
            Plan::Counted { shown, item, .. }
            | Plan::Refused {
                shown,
                item: Some(item),
                ..
            } => (shown, item),
            Plan::Refused {
                shown, item: None, ..
            } => {
                return Ok(Plan::GivenBack {
                    shown,
                    answer: None,
                });
            }
            other => return Ok(other),
        };
        let give = Item {
            charge: Charge::Refund,
            shadow: false,
            ..item
        };
        let (_, mut answers) = engine.decide(std::slice::from_ref(&give)).await?;
        Ok(Plan::GivenBack {
            shown,
            answer: answers.pop(),
        })
    }

    /// Whether global shadow mode keeps this limit from denying: every configured limit, never
    /// one envoy sent with the request (as the reference's `SHADOW_MODE`).
    pub(super) fn global(&self, stats: &Stats<'_, S>) -> bool {
        self.options.shadow_mode && stats.limit.is_some()
    }

    /// Counts the hits on every counter of `counters` (those the plans charge) they take over
    /// its limit, as the reference counts them, and returns, by descriptor, the answer of each
    /// one refused before counting whose hits were recorded.
    ///
    /// A counter is over when it cannot take all the hits the request names on it: one of
    /// its charges was denied, or (a request refused before counting, whose items were only
    /// peeked) it is in debt or the hits are more than it had left. Each of its charges then
    /// records its hits in order (the first may still fit, a later one is over) and reports
    /// what it found. In an admitted request only the charges not taken (a shadow or quota
    /// limit over) are recorded; in one that is over (`taken` false) nothing was taken, and a
    /// counter within its limit takes nothing (all or nothing).
    async fn count_over_hits<D: Decider<Limit = L, Stats = S>>(
        &self,
        engine: &D,
        plans: &[Plan<'_, L, S>],
        counters: &[Counter<'_, L>],
        answers: &mut [Answer],
        taken: bool,
    ) -> Result<Vec<Option<Answer>>, EnvoyError> {
        let mut recorded = vec![None; plans.len()];
        for counter in counters.iter().filter(|c| c.over) {
            for &(index, slot, denied) in &counter.charges {
                if taken && !denied {
                    continue; // admitted and taken already
                }
                let item = match &plans[index] {
                    Plan::Counted { item, .. }
                    | Plan::Refused {
                        item: Some(item), ..
                    } => item,
                    _ => continue,
                };
                let record = Item {
                    charge: Charge::Record,
                    ..item.clone()
                };
                let (_, mut answer) = engine.decide(std::slice::from_ref(&record)).await?;
                let Some(answer) = answer.pop() else { continue };
                match slot.and_then(|i| answers.get_mut(i)) {
                    Some(to) => *to = answer,
                    None => recorded[index] = Some(answer),
                }
            }
        }
        Ok(recorded)
    }
}

/// The items the engine decides, one per counted plan (reporting only, cost 0, when something
/// was `refused` before counting), and by plan the index of its item.
fn items_to_decide<L: Clone, S>(
    plans: &[Plan<'_, L, S>],
    refused: bool,
) -> (Vec<Option<usize>>, Vec<Item<L>>) {
    let mut slots = Vec::with_capacity(plans.len());
    let mut items = Vec::new();
    for plan in plans {
        if let Plan::Counted { item, .. } = plan {
            let mut item = item.clone();
            if refused {
                item.cost = 0;
            }
            slots.push(Some(items.len()));
            items.push(item);
        } else {
            slots.push(None);
        }
    }
    (slots, items)
}

/// One counter a request charges, with every charge on it.
struct Counter<'i, L> {
    item: &'i Item<L>,
    /// (descriptor, its answer's index, whether that answer denied it)
    charges: Vec<(usize, Option<usize>, bool)>,
    hits: u64,
    over: bool,
}

/// The counters the plans charge (hits above 0, or refused before counting), each over when
/// a charge on it was denied or, when the request was only `peeked`, when its hits are more
/// than it had left.
fn counters_charged<'i, L: PartialEq, S>(
    plans: &'i [Plan<'_, L, S>],
    slots: &[Option<usize>],
    answers: &[Answer],
    peeked: bool,
) -> Vec<Counter<'i, L>> {
    let mut counters: Vec<Counter<'i, L>> = Vec::new();
    for (index, (plan, slot)) in plans.iter().zip(slots).enumerate() {
        let (item, answer, over) = match (plan, slot) {
            (Plan::Counted { item, .. }, Some(i)) if item.cost > 0 => {
                let answer = answers.get(*i);
                let denied = answer.is_none_or(|a| !a.decision.is_allowed());
                (
                    item,
                    Some((*i, answer.map_or(0, |a| a.decision.remaining()))),
                    denied,
                )
            }
            (
                Plan::Refused {
                    item: Some(item), ..
                },
                _,
            ) => (item, None, true),
            _ => continue,
        };
        let at = counters
            .iter()
            .position(|c| c.item.target == item.target && c.item.identifier == item.identifier)
            .unwrap_or_else(|| {
                counters.push(Counter {
                    item,
                    charges: Vec::new(),
                    hits: 0,
                    over: false,
                });
                counters.len() - 1
            });
        let counter = &mut counters[at];
        counter.hits = counter.hits.saturating_add(item.cost);
        counter.over |= over;
        if let (true, Some((_, left))) = (peeked, answer) {
            // A peek: over when its hits are more than the counter had left.
            counter.over |= counter.hits > left;
        }
        counter.charges.push((index, answer.map(|(i, _)| i), over));
    }
    counters
}

/// What the statuses of one request add up to.
#[derive(Default)]
pub(super) struct Outcome {
    /// An enforced descriptor is over.
    pub(super) over: bool,
    /// A `quota_mode` limit matched.
    pub(super) quota_mode: bool,
    /// The descriptors whose `quota_mode` limit was over, by index.
    pub(super) quota_violations: Vec<usize>,
    /// A descriptor was over but global shadow mode kept it from denying.
    pub(super) shadowed_globally: bool,
}
