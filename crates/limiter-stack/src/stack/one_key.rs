//! The one-key path: a stack whose keyed layers all share one keyer (per customer: a
//! per-second and a per-minute limit), any number of global layers beside them, at most four
//! layers, each with one plan (of one limit or several) and no plan function. A call finds its
//! one entry by one lookup, reads each layer's words without a lock (a layer with one plan
//! never changes plan, so no sequence lock is needed: every word read is one a commit wrote),
//! decides each, and commits under one lock (the commit lock, or the entry's lead) only if no
//! word changed since it was read. The answer is folded into the caller's as each layer is
//! decided, before the lock is taken, so no store of it happens while the lock is held
//! (keeping each layer's answers and folding them after the commit measured 15% slower on a
//! stack of three). Anything else (a key to insert, a word another call changed) goes to the
//! general path from the start, which replaces the answer whole.

use std::hash::Hash;

use limiter_core::{Clock, Decision};

use super::Stack;
use crate::algorithms::DynAlgorithm;
use crate::cells::Cells;
use crate::decision::{Answer, LayerDecision};
use crate::error::CallError;
use crate::layer::{KeySource, Layer};

/// The most layers the one-key path takes.
const MOST_LAYERS: usize = 4;

/// Whether `layers` (with each layer's group lead in `leads`) take the one-key path: at most
/// four layers, each with one plan and no plan function, and every keyed layer in one group.
pub(super) fn fits<R, K>(layers: &[Layer<R, K>], leads: &[usize]) -> bool {
    let keyed_leads = || {
        layers
            .iter()
            .zip(leads)
            .filter(|(layer, _)| !layer.is_global())
            .map(|(_, &lead)| lead)
    };
    let one_group = keyed_leads().min() == keyed_leads().max();
    let simple = layers
        .iter()
        .all(|layer| layer.plans.len() == 1 && layer.choose.is_none() && layer.open.is_none());
    layers.len() <= MOST_LAYERS && one_group && simple
}

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides a call of a one-key stack of `N` layers, each of at most `W` limits, into `out`
    /// (new); on the general path, from the start, when the one-key path cannot finish it.
    #[inline(always)]
    pub(super) fn decide_one_key<const N: usize, const W: usize>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<(), CallError> {
        if self.one_key_path::<N, W>(request, cost, now, out)? {
            return Ok(());
        }
        self.decide_from_scratch(request, cost, now, false, out)
    }

    /// The one-key path (see the module docs); `false`, having changed nothing, when the call
    /// needs the general path (which replaces the part of the answer folded so far). The usual limit, a token bucket, is decided
    /// inline (`PlanLimit::decide_inline`), so its answer stays in registers.
    #[inline(always)]
    fn one_key_path<const N: usize, const W: usize>(
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
        // Each layer's words as read, and as the call would leave them.
        let mut seen = [[0_u64; W]; N];
        let mut next = [[0_u64; W]; N];
        // The answer is folded in place as each layer is decided (stack order, as `push`
        // asks), before the commit's lock is taken: nothing of it is built while the lock is
        // held. A call that then needs the general path has it replaced there.
        let Answer {
            decision: answer,
            each,
        } = out;
        for slot in 0..N {
            let cell = match &self.globals[slot] {
                Some(global) => &**global,
                None => match entry {
                    Some(entry) => entry.get(self.members[slot].position),
                    None => continue,
                },
            };
            let limits = &self.layers[slot].plans[0].limits;
            let mut parts = [Decision::allow(0, 0, 0); W];
            for (limit, algorithm) in limits.iter().enumerate().take(W) {
                let word = cell.read_only_plan(limit);
                let Some((decision, after)) = algorithm.decide_inline(word, cost, now) else {
                    return Err(self.decision_error(slot, limit, word, cost, now));
                };
                parts[limit] = decision;
                seen[slot][limit] = word;
                next[slot][limit] = after;
            }
            let layer = if W == 1 {
                LayerDecision::from_one(slot, 0, parts[0])
            } else {
                match LayerDecision::from_limits(slot, 0, &parts[..limits.len().min(W)]) {
                    Some(layer) => layer,
                    // Unreachable: a layer has at least one limit (checked when built).
                    None => return Ok(false),
                }
            };
            answer.push(layer);
            if let Some(each) = each.as_deref_mut() {
                // Kept as decided; a call the general path finishes replaces them all.
                each.set(layer);
            }
            cells[slot] = Some(cell);
        }
        if answer.is_allowed() && cost > 0 && !self.commit_one_key(&cells, &seen, &next) {
            return Ok(false);
        }
        drop(found);
        Ok(true)
    }

    /// Writes `next` into `cells` (by slot, each layer's words) if none changed from `seen`,
    /// under one lock: the commit lock where the stack has a global layer (every global layer
    /// takes part in every call), else the entry's lead (every keyed layer is in its group).
    /// Whether it wrote.
    #[inline(always)]
    fn commit_one_key<const N: usize, const W: usize>(
        &self,
        cells: &[Option<&Cells>; N],
        seen: &[[u64; W]; N],
        next: &[[u64; W]; N],
    ) -> bool {
        let lock_slot = self.commit_layer.or(self.one_key).filter(|&slot| slot < N);
        let Some((lock_slot, lock)) = lock_slot.and_then(|slot| Some((slot, cells[slot]?))) else {
            // Nothing took part (a keyed layer skipped, no global one): nothing to write.
            return cells.iter().all(Option::is_none);
        };
        // Each layer's limits (W is 1 for stacks whose layers all have one).
        let width = |slot: usize| {
            if W == 1 {
                1
            } else {
                self.layers[slot].plans[0].limits.len().min(W)
            }
        };
        let held = lock.lock();
        // Over slices: ranges and `take` adapters here were called out of line, under the lock.
        let mut unchanged = true;
        for slot in 0..N {
            if let Some(cell) = cells[slot] {
                for (j, &word) in seen[slot][..width(slot)].iter().enumerate() {
                    unchanged &= cell.word_held(j) == word;
                }
            }
        }
        if unchanged {
            for slot in 0..N {
                let Some(cell) = cells[slot] else { continue };
                // The lock's own first word goes last, with the release.
                let first = usize::from(slot == lock_slot);
                for (j, &word) in next[slot][..width(slot)].iter().enumerate().skip(first) {
                    cell.write_word_held(j, word);
                }
            }
            lock.write_first_and_unlock(held, next[lock_slot][0]);
        } else {
            lock.unlock(held);
        }
        unchanged
    }

    /// The error layer `slot`'s limit `limit` gives for `cost` units on `word` at `now`.
    #[cold]
    fn decision_error(
        &self,
        slot: usize,
        limit: usize,
        mut word: u64,
        cost: u64,
        now: u64,
    ) -> CallError {
        let layer = &self.layers[slot];
        let mut answer = Decision::allow(0, 0, 0);
        match layer.plans[0].limits[limit].decide(&mut word, cost, now, &mut answer) {
            Err(source) => CallError::Decision {
                layer: layer.name.clone(),
                limit_index: limit,
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
