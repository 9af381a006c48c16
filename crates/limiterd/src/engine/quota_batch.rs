//! A batch with calendar quotas on Redis (`POST /v1/ratelimit/many`), all or nothing across
//! the quotas and the stacks. Every taking item's quotas are counted first, all at once (one
//! round trip), each item's all or nothing as a call alone counts them; when an item's quotas
//! deny, every unit the others counted goes back and the first such item (in order) refuses
//! the batch, whose other items report what they hold (nothing of theirs stays taken). Then
//! the stacks decide the batch as any batch, and a refused batch gives every quota's units
//! back. An admitted item's answer is its stack's tightened by its quotas'; an item that
//! takes nothing (a peek, a record, a unit refund, a shadow check) reports its quotas' state
//! beside its stack's (a record counted in them), as it would alone.

use futures_util::future::join_all;

use super::decide::counted;
use super::permitted::refund_quotas;
use super::quota_answer::tighter;
use super::quota_take::NotCounted;
use super::*;
use crate::metrics::Counted;
use crate::store::quotas::{PolicyQuota, QuotaTaken};

/// What one item's quotas counted, by the item's place in its batch.
type CountedQuotas<'q> = Vec<(usize, Vec<(&'q PolicyQuota, QuotaTaken)>)>;

impl<C: Clock + Clone + Send + Sync + 'static> Engine<C> {
    /// Decides `items`, some on policies with calendar quotas on Redis (none with a
    /// concurrency limit), all or nothing (see the module docs).
    pub(super) async fn decide_with_quotas(
        &self,
        items: &[Item],
        time_ms: Option<u64>,
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        if let [item] = items {
            let (answer, _) = self.decide_one(item, time_ms).await?;
            return Ok((
                answer.decision.is_allowed() || item.never_denies(),
                vec![answer],
            ));
        }
        let taking = self.taking_quotas(items);
        for (place, quotas) in &taking {
            self.quota_cost_refused(&items[*place], quotas)
                .map_err(|e| e.in_item(*place))?;
        }
        let taken_so_far = match self.count_batch_quotas(items, &taking).await {
            Ok(taken) => taken,
            Err((place, NotCounted::Refused(error))) => return Err(error.in_item(place)),
            Err((place, NotCounted::Denied(denied))) => {
                let item = &items[place];
                self.counters_of(item)
                    .count(Counted::Denied { shadow: false }, &item.identifier);
                return self.refused_by_quota(items, place, denied, time_ms).await;
            }
        };
        let decided = self.decide_checked(items, time_ms).await;
        let admitted = matches!(decided, Ok((true, _)));
        if !admitted {
            self.give_back(items, &taken_so_far).await;
        }
        let (admitted, mut answers) = decided?;
        if admitted {
            for (place, taken) in &taken_so_far {
                answers[*place] = taken
                    .iter()
                    .fold(answers[*place], |answer, (_, q)| tighter(answer, q));
            }
        }
        // Records stay written whatever the batch's answer, in the stacks and the quotas.
        self.report_quotas(items, &mut answers).await?;
        Ok((admitted, answers))
    }

    /// The items that take units from their quotas (an enforced take of a cost), by place,
    /// with their quotas.
    fn taking_quotas<'e>(&'e self, items: &[Item]) -> Vec<(usize, &'e [PolicyQuota])> {
        let takes = |item: &Item| item.cost > 0 && !item.never_denies();
        items
            .iter()
            .enumerate()
            .filter(|(_, item)| takes(item))
            .map(|(place, item)| (place, self.gates_of(item).1))
            .filter(|(_, quotas)| !quotas.is_empty())
            .collect()
    }

    /// Counts every `taking` item's quotas at once, each item's all or nothing: what each
    /// counted, or the first item (in order) whose quotas counted nothing, and why, with
    /// every other item's units given back.
    async fn count_batch_quotas<'q>(
        &'q self,
        items: &[Item],
        taking: &[(usize, &'q [PolicyQuota])],
    ) -> Result<CountedQuotas<'q>, (usize, NotCounted)> {
        let counts = taking
            .iter()
            .map(|(place, quotas)| self.count_quotas(&items[*place], quotas));
        let mut taken_so_far: CountedQuotas<'_> = Vec::new();
        let mut refused = None;
        for ((place, _), counted) in taking.iter().zip(join_all(counts).await) {
            match counted {
                Ok(taken) => taken_so_far.push((*place, taken)),
                Err(not_counted) => {
                    refused.get_or_insert((*place, not_counted));
                }
            }
        }
        match refused {
            None => Ok(taken_so_far),
            Some(refused) => {
                self.give_back(items, &taken_so_far).await;
                Err(refused)
            }
        }
    }

    /// Gives back every unit `taken` holds, all at once.
    async fn give_back(&self, items: &[Item], taken: &CountedQuotas<'_>) {
        let now = self.now_unix_ns();
        let refunds = taken
            .iter()
            .map(|(place, quotas)| refund_quotas(&items[*place], quotas, now));
        join_all(refunds).await;
    }

    /// The batch refused by the quota of the item at `place` (its answer `denied`, counted):
    /// every other take reports what it holds, records are written as in any refused batch,
    /// and each counts as its refused batch's.
    async fn refused_by_quota(
        &self,
        items: &[Item],
        place: usize,
        denied: Answer,
        time_ms: Option<u64>,
    ) -> Result<(bool, Vec<Answer>), DecideError> {
        let reading = self.reading_for(time_ms)?;
        let peeks: Vec<Item> = items
            .iter()
            .map(|item| match item.charge {
                Charge::Take => Item {
                    cost: 0,
                    shadow: false,
                    ..item.clone()
                },
                _ => item.clone(),
            })
            .collect();
        let resolved = peeks
            .iter()
            .map(|item| self.resolve(item))
            .collect::<Result<Vec<_>, _>>()?;
        let (_, mut answers) = self.decide_batch(&peeks, &resolved, reading).await?;
        for (at, ((item, (_, _, counters)), answer)) in
            items.iter().zip(&resolved).zip(&answers).enumerate()
        {
            if at != place {
                counters.count(counted(item, answer, false), &item.identifier);
            }
        }
        self.report_quotas(items, &mut answers).await?;
        answers[place] = denied;
        Ok((false, answers))
    }

    /// Tightens the answer of each item that takes nothing by its quotas' state, a record's
    /// units counted in them first (a quota whose store fails answers by its failure policy:
    /// closed refuses, open reports without it); every item's quotas asked at once.
    async fn report_quotas(
        &self,
        items: &[Item],
        answers: &mut [Answer],
    ) -> Result<(), DecideError> {
        let reporting: Vec<(usize, &[PolicyQuota])> = items
            .iter()
            .enumerate()
            .filter(|(_, item)| item.cost == 0 || item.never_denies())
            .map(|(place, item)| (place, self.gates_of(item).1))
            .filter(|(_, quotas)| !quotas.is_empty())
            .collect();
        let states = reporting
            .iter()
            .map(|(place, quotas)| self.quota_states(&items[*place], quotas));
        for ((place, quotas), states) in reporting.iter().zip(join_all(states).await) {
            answers[*place] = self.tightened(answers[*place], quotas, states)?;
        }
        Ok(())
    }
}
