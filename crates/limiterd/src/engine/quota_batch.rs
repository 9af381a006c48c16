//! A batch with calendar quotas on Redis (`POST /v1/ratelimit/many`), all or nothing across
//! the quotas and the stacks. Each taking item's quotas are counted first, in order, all or
//! nothing per item as a call alone counts them; a quota that denies gives back every unit
//! counted before it and refuses the batch, whose other items report what they hold (nothing
//! of theirs was taken). Then the stacks decide the batch as any batch, and a refused batch
//! gives every quota's units back. An admitted item's answer is its stack's tightened by its
//! quotas'; an item that takes nothing (a peek, a record, a unit refund, a shadow check)
//! reports its quotas' state beside its stack's (a record counted in them), as it would alone.

use super::decide::counted;
use super::permitted::refund_quotas;
use super::quota_answer::tighter;
use super::*;
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
        let mut taken_so_far: CountedQuotas<'_> = Vec::new();
        for (place, item) in items.iter().enumerate() {
            let quotas = self.gates_of(item).1;
            if quotas.is_empty() || item.cost == 0 || item.never_denies() {
                continue;
            }
            match self.take_quotas(item, quotas).await {
                Ok(taken) => taken_so_far.push((place, taken)),
                Err(answered) => {
                    self.give_back(items, &taken_so_far).await;
                    let (denied, _) = answered.map_err(|e| e.in_item(place))?;
                    return self.refused_by_quota(items, place, denied, time_ms).await;
                }
            }
        }
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

    /// Gives back every unit `taken` holds.
    async fn give_back(&self, items: &[Item], taken: &CountedQuotas<'_>) {
        for (place, quotas) in taken {
            refund_quotas(&items[*place], quotas, self.now_unix_ns()).await;
        }
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
    /// closed refuses, open reports without it).
    async fn report_quotas(
        &self,
        items: &[Item],
        answers: &mut [Answer],
    ) -> Result<(), DecideError> {
        for (item, answer) in items.iter().zip(answers) {
            if item.cost > 0 && !item.never_denies() {
                continue;
            }
            for quota in self.gates_of(item).1 {
                let state = match self.quota_state(item, quota).await {
                    Ok(state) => state,
                    Err(failure) => self.quota_failed(quota, failure)?,
                };
                *answer = tighter(*answer, &state);
            }
        }
        Ok(())
    }
}
