//! The one-key path: a stack whose keyed layers all share one keyer (per customer: a
//! per-second and a per-minute limit), any number of global layers beside them, at most four
//! layers, each with one plan of one limit and no plan function. A call finds its one entry
//! by one lookup, reads each layer's word without a lock (a layer with one plan never changes
//! plan, so no sequence lock is needed: every word read is one a commit wrote), decides each
//! into a local answer, and commits under one lock (the commit lock, or the entry's lead)
//! only if no word changed since it was read. The answer is built after the last locked
//! instruction, so no store of it delays one. Anything else (a key to insert, a word another
//! call changed) goes to the general path from the start.

use std::hash::Hash;

use limiter_core::{Algorithm, Clock, Decision};

use super::Stack;
use crate::algorithms::{DynAlgorithm, PlanLimit};
use crate::cells::Cells;
use crate::decision::{Answer, LayerDecision};
use crate::error::CallError;
use crate::layer::{KeySource, Layer};

/// The most layers the one-key path takes.
const MOST_LAYERS: usize = 4;

/// Whether `layers` (with each layer's group lead in `leads`) take the one-key path: at most
/// four layers, each with one plan of one limit and no plan function, and every keyed layer
/// in one group.
pub(super) fn fits<R, K>(layers: &[Layer<R, K>], leads: &[usize]) -> bool {
    let keyed_leads = || {
        layers
            .iter()
            .zip(leads)
            .filter(|(layer, _)| !layer.is_global())
            .map(|(_, &lead)| lead)
    };
    let one_group = keyed_leads().min() == keyed_leads().max();
    let simple = layers.iter().all(|layer| {
        layer.plans.len() == 1
            && layer.plans[0].limits.len() == 1
            && layer.choose.is_none()
            && layer.open.is_none()
    });
    layers.len() <= MOST_LAYERS && one_group && simple
}

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides a call of a one-key stack of `N` layers into `out` (new); on the general
    /// path, from the start, when the one-key path cannot finish it.
    #[inline(always)]
    pub(super) fn decide_one_key<const N: usize>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<(), CallError> {
        if self.one_key_path::<N>(request, cost, now, out)? {
            return Ok(());
        }
        self.decide_from_scratch(request, cost, now, false, out)
    }

    /// The one-key path (see the module docs); `false`, having changed and answered nothing,
    /// when the call needs the general path. The usual limit, a token bucket, is decided
    /// inline, so its answer stays in registers (a helper returning it measured 10 ns slower
    /// on a stack of three).
    #[inline(always)]
    fn one_key_path<const N: usize>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<bool, CallError> {
        let key = match self.one_key.map(|lead| (lead, &self.layers[lead].keyer)) {
            Some((lead, KeySource::Keyed(keyer))) => keyer.key(request).map(|key| (lead, key)),
            _ => None,
        };
        let found = key.as_ref().map(|(lead, key)| {
            let hash = self.table.hash_one((*lead as u32, key));
            let guard = self.table.read(self.table.shard_index(hash));
            (guard, hash)
        });
        let entry = match (&found, &key) {
            (Some((guard, hash)), Some((lead, key))) => {
                match guard.find(*hash, |e| e.layer as usize == *lead && e.key == *key) {
                    Some(entry) => Some(&entry.cells),
                    None => return Ok(false),
                }
            }
            _ => None,
        };
        let mut cells: [Option<&Cells>; N] = [None; N];
        let mut seen = [0_u64; N];
        let mut next = [0_u64; N];
        let mut answers = [Decision::allow(0, 0, 0); N];
        let mut allowed = true;
        for slot in 0..N {
            let cell = match &self.globals[slot] {
                Some(global) => &**global,
                None => match entry {
                    Some(entry) => entry.get(self.members[slot].position),
                    None => continue,
                },
            };
            let word = cell.read_only_plan();
            let decided = match &self.layers[slot].plans[0].limits[0] {
                PlanLimit::TokenBucket(bucket) => Algorithm::decide(bucket, word, cost, now)
                    .ok()
                    .map(|step| (step.decision, step.next.unwrap_or(word))),
                other => {
                    let mut answer = Decision::allow(0, 0, 0);
                    other
                        .decide_word(word, cost, now, &mut answer)
                        .map(|after| (answer, after))
                }
            };
            let Some((answer, after)) = decided else {
                return Err(self.decision_error(slot, word, cost, now));
            };
            allowed &= answer.is_allowed();
            answers[slot] = answer;
            next[slot] = after;
            seen[slot] = word;
            cells[slot] = Some(cell);
        }
        if allowed && cost > 0 && !self.commit_one_key(&cells, &seen, &next) {
            return Ok(false);
        }
        let took_part = cells.map(|cell| cell.is_some());
        drop(found);
        for (slot, answer) in answers.into_iter().enumerate() {
            if took_part[slot] {
                out.take(LayerDecision::from_one(slot, 0, answer));
            }
        }
        Ok(true)
    }

    /// Writes `next` into `cells` (by slot) if none changed from `seen`, under one lock: the
    /// commit lock where the stack has a global layer (every global layer takes part in every
    /// call), else the entry's lead (every keyed layer is in its group). Whether it wrote.
    #[inline(always)]
    fn commit_one_key<const N: usize>(
        &self,
        cells: &[Option<&Cells>; N],
        seen: &[u64; N],
        next: &[u64; N],
    ) -> bool {
        let lock_slot = self.commit_layer.or(self.one_key).filter(|&slot| slot < N);
        let Some((lock_slot, lock)) = lock_slot.and_then(|slot| Some((slot, cells[slot]?))) else {
            // Nothing took part (a keyed layer skipped, no global one): nothing to write.
            return cells.iter().all(Option::is_none);
        };
        let held = lock.lock();
        let unchanged = (0..N).all(|slot| cells[slot].is_none_or(|c| c.word_held() == seen[slot]));
        if unchanged {
            for slot in 0..N {
                if let (false, Some(cell)) = (slot == lock_slot, cells[slot]) {
                    cell.write_word_held(next[slot]);
                }
            }
            lock.write_first_and_unlock(held, next[lock_slot]);
        } else {
            lock.unlock(held);
        }
        unchanged
    }

    /// The error layer `slot`'s one limit gives for `cost` units on `word` at `now`.
    #[cold]
    fn decision_error(&self, slot: usize, mut word: u64, cost: u64, now: u64) -> CallError {
        let layer = &self.layers[slot];
        let mut answer = Decision::allow(0, 0, 0);
        match layer.plans[0].limits[0].decide(&mut word, cost, now, &mut answer) {
            Err(source) => CallError::Decision {
                layer: layer.name.clone(),
                limit_index: 0,
                source,
            },
            // Unreachable: `decide_word` refuses exactly what `decide` does.
            Ok(()) => CallError::NoSuchPlan {
                layer: layer.name.clone(),
                chosen: 0,
                plans: layer.plan_count(),
            },
        }
    }
}
