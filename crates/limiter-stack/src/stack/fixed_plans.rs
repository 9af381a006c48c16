//! The fixed-plan path: a stack of at most four layers, each with one plan (of one limit or
//! several) and no plan function, keyed on any number of keys, with any number of global layers
//! beside them. A call finds each key's entry by one lookup (the shards read-locked in
//! ascending order, a shard two keys share once), reads each layer's words without a lock (a
//! layer with one plan never changes plan, so no sequence lock is needed: every word read is one
//! a commit wrote), decides each, and commits only if no word changed since it was read: under
//! the commit lock where the stack has a global layer, else under each key's lead, locked in
//! ascending address order (one lock when every keyed layer is on one key). The answer is folded
//! into the caller's as each layer is decided, before any lock is taken, so no store of it
//! happens while a lock is held (keeping each layer's answers and folding them after the commit
//! measured 15% slower on a stack of three). Anything else (a key to insert, a word another call
//! changed) goes to the general path from the start, which replaces the answer whole.

use std::hash::Hash;

use limiter_core::{Clock, Decision};
use limiter_store::table::ShardReadGuard;

use super::locks::lock_in_address_order;
use super::plan::{GLOBAL, ShardOrder};
use super::{Entry, Stack};
use crate::algorithms::DynAlgorithm;
use crate::cells::{Cells, EntryCells, Held, MAX_LIMITS_PER_LAYER};
use crate::decision::{Answer, LayerDecision};
use crate::error::CallError;
use crate::layer::{KeySource, Layer};

/// The most layers the fixed-plan path takes.
const MOST_LAYERS: usize = 4;

/// Whether `layers` take the fixed-plan path: at most four layers, each with one plan and no
/// plan function.
pub(super) fn fits<R, K>(layers: &[Layer<R, K>]) -> bool {
    let fixed = layers
        .iter()
        .all(|layer| layer.plans.len() == 1 && layer.choose.is_none() && layer.open.is_none());
    layers.len() <= MOST_LAYERS && fixed
}

/// The group leads of `layers`' keyed layers, in layer order (`leads`: each layer's lead).
fn keyed_leads<'a, R, K>(
    layers: &'a [Layer<R, K>],
    leads: &'a [usize],
) -> impl Iterator<Item = usize> + 'a {
    layers
        .iter()
        .zip(leads)
        .filter(|(layer, _)| !layer.is_global())
        .map(|(_, &lead)| lead)
}

/// Whether `layers`' keyed layers are on several keys (`leads`: each layer's group lead).
pub(super) fn several_keys<R, K>(layers: &[Layer<R, K>], leads: &[usize]) -> bool {
    let mut keyed = keyed_leads(layers, leads);
    let first = keyed.next();
    !keyed.all(|lead| Some(lead) == first)
}

/// The lead of `layers`' first keyed group (`None`: every layer is global).
pub(super) fn first_keyed_lead<R, K>(layers: &[Layer<R, K>], leads: &[usize]) -> Option<usize> {
    keyed_leads(layers, leads).next()
}

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides a call of a fixed-plan stack of `N` layers, each of at most `W` limits, into
    /// `out` (new); on the general path, from the start, when the fixed-plan path cannot finish
    /// it.
    #[inline(always)]
    pub(super) fn decide_fixed<const N: usize, const W: usize>(
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

    /// Decides a call of a fixed-plan stack whose keyed layers are on several keys, into `out`
    /// (new); on the general path, from the start, when the fixed-plan path cannot finish it.
    /// Out of line, apart from the one-key path's arms: inlined beside them it made their
    /// lookups calls (375 → 408 instructions a stack of one, callgrind).
    #[inline(never)]
    pub(super) fn decide_on_keys(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<(), CallError> {
        let done = match (self.layers.len(), self.lean) {
            (2, true) => self.fixed_path_on_keys::<2, 1>(request, cost, now, out)?,
            (3, true) => self.fixed_path_on_keys::<3, 1>(request, cost, now, out)?,
            (_, true) => self.fixed_path_on_keys::<4, 1>(request, cost, now, out)?,
            (2, false) => {
                self.fixed_path_on_keys::<2, MAX_LIMITS_PER_LAYER>(request, cost, now, out)?
            }
            (3, false) => {
                self.fixed_path_on_keys::<3, MAX_LIMITS_PER_LAYER>(request, cost, now, out)?
            }
            (_, false) => {
                self.fixed_path_on_keys::<4, MAX_LIMITS_PER_LAYER>(request, cost, now, out)?
            }
        };
        if done {
            return Ok(());
        }
        self.decide_from_scratch(request, cost, now, false, out)
    }

    /// The fixed-plan path for keyed layers on one key (see the module docs); `false`, having
    /// changed nothing, when the call needs the general path (which replaces the part of the
    /// answer folded so far). The usual limit, a token bucket, is decided inline
    /// (`PlanLimit::decide_inline`), so its answer stays in registers.
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
        if answer.is_allowed() && cost > 0 && !self.commit_fixed(&cells, &seen, &next) {
            return Ok(false);
        }
        drop(found);
        Ok(true)
    }

    /// [`one_key_path`](Self::one_key_path) for keyed layers on several keys: each key's entry
    /// found under its shard's read lock, the shards locked in ascending order.
    #[inline(always)]
    fn fixed_path_on_keys<const N: usize, const W: usize>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<bool, CallError> {
        // Each key's lead: its key, hash and shard (`GLOBAL`: not a lead, or no key).
        let mut keys: [Option<K>; N] = [const { None }; N];
        let mut hashes = [0_u64; N];
        let mut shards = [GLOBAL; N];
        let mut order = ShardOrder::<N>::new();
        for slot in 0..N {
            let KeySource::Keyed(keyer) = &self.layers[slot].keyer else {
                continue;
            };
            if self.members[slot].lead != slot {
                continue;
            }
            let Some(key) = keyer.key(request) else {
                continue;
            };
            hashes[slot] = self.table.hash_one((slot as u32, &key));
            shards[slot] = self.table.shard_index(hashes[slot]);
            order.insert(shards[slot]);
            keys[slot] = Some(key);
        }
        let mut guards: [Option<ShardReadGuard<'_, Entry<K>>>; N] = [const { None }; N];
        for (guard, shard) in guards.iter_mut().zip(order.shards()) {
            *guard = Some(self.table.read(shard));
        }
        // Each lead's entry, for the rest of its group (which comes after it).
        let mut entries: [Option<&EntryCells>; N] = [None; N];
        for slot in 0..N {
            let Some(key) = &keys[slot] else { continue };
            let found = guards[order.position(shards[slot])]
                .as_ref()
                .and_then(|g| g.find(hashes[slot], |e| e.layer as usize == slot && e.key == *key));
            match found {
                Some(entry) => entries[slot] = Some(&entry.cells),
                None => return Ok(false),
            }
        }
        let done = self.decide_cells::<N, W>(
            |slot| {
                let member = self.members[slot];
                entries[member.lead].map(|e| e.get(member.position))
            },
            cost,
            now,
            out,
        );
        drop(guards);
        done
    }

    /// Decides each layer on its cell (a global layer's own, a keyed one's from `keyed`, or
    /// none: the layer takes no part), folding the answer into `out`, and commits an admission;
    /// `false`, having changed nothing, when the call needs the general path. The one-key path
    /// keeps its own copy of this loop: calling this one cost it 25–35 instructions a call
    /// (callgrind, stacks of one to three layers).
    #[inline(always)]
    fn decide_cells<'c, const N: usize, const W: usize>(
        &'c self,
        keyed: impl Fn(usize) -> Option<&'c Cells>,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<bool, CallError> {
        let mut cells: [Option<&Cells>; N] = [None; N];
        // Each layer's words as read, and as the call would leave them.
        let mut seen = [[0_u64; W]; N];
        let mut next = [[0_u64; W]; N];
        // The answer is folded in place as each layer is decided (stack order, as `push`
        // asks), before any lock is taken: nothing of it is built while a lock is held. A
        // call that then needs the general path has it replaced there.
        let Answer {
            decision: answer,
            each,
        } = out;
        for slot in 0..N {
            let cell = match &self.globals[slot] {
                Some(global) => &**global,
                None => match keyed(slot) {
                    Some(cell) => cell,
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
        Ok(!(answer.is_allowed() && cost > 0) || self.commit_fixed(&cells, &seen, &next))
    }

    /// Writes `next` into `cells` (by slot, each layer's words) if none changed from `seen`:
    /// under one lock where the stack has a global layer (every global layer takes part in every
    /// call) or its keyed layers are on one key, else under each key's lead. Whether it wrote.
    #[inline(always)]
    fn commit_fixed<const N: usize, const W: usize>(
        &self,
        cells: &[Option<&Cells>; N],
        seen: &[[u64; W]; N],
        next: &[[u64; W]; N],
    ) -> bool {
        let Some(lock_slot) = self.lone_lock else {
            return self.commit_under_leads(cells, seen, next);
        };
        let Some(lock) = cells.get(lock_slot).copied().flatten() else {
            // Nothing took part (a keyed layer skipped, no global one): nothing to write.
            return cells.iter().all(Option::is_none);
        };
        let held = lock.lock();
        if self.still_seen(cells, seen) {
            self.write_held(cells, next, |slot| slot == lock_slot);
            lock.write_first_and_unlock(held, next[lock_slot][0]);
            true
        } else {
            lock.unlock(held);
            false
        }
    }

    /// [`commit_fixed`](Self::commit_fixed) for keyed layers on several keys and no global
    /// layer: each key's lead locked in ascending address order, the rest held through them.
    /// Out of line, as [`fixed_path_on_keys`](Self::fixed_path_on_keys) is.
    #[inline(never)]
    fn commit_under_leads<const N: usize, const W: usize>(
        &self,
        cells: &[Option<&Cells>; N],
        seen: &[[u64; W]; N],
        next: &[[u64; W]; N],
    ) -> bool {
        let mut leads = *cells;
        for (slot, lead) in leads.iter_mut().enumerate() {
            if !self.leads(slot) {
                *lead = None;
            }
        }
        let mut held: [Option<Held>; N] = lock_in_address_order(&leads, N);
        let unchanged = self.still_seen(cells, seen);
        if unchanged {
            self.write_held(cells, next, |slot| leads[slot].is_some());
        }
        for slot in 0..N {
            if let (Some(lead), Some(held)) = (leads[slot], held[slot].take()) {
                if unchanged {
                    lead.write_first_and_unlock(held, next[slot][0]);
                } else {
                    lead.unlock(held);
                }
            }
        }
        unchanged
    }

    /// Whether every word of `cells` (by slot) is still as `seen`, read under the locks that
    /// guard them. Over slices: ranges and `take` adapters here were called out of line, under
    /// the lock.
    #[inline(always)]
    fn still_seen<const N: usize, const W: usize>(
        &self,
        cells: &[Option<&Cells>; N],
        seen: &[[u64; W]; N],
    ) -> bool {
        let mut unchanged = true;
        for slot in 0..N {
            if let Some(cell) = cells[slot] {
                for (j, &word) in seen[slot][..self.width::<W>(slot)].iter().enumerate() {
                    unchanged &= cell.word_held(j) == word;
                }
            }
        }
        unchanged
    }

    /// Writes `next` into `cells` (by slot) under the locks that guard them, except the first
    /// word of each slot `locked` names: it goes with that lock's release.
    #[inline(always)]
    fn write_held<const N: usize, const W: usize>(
        &self,
        cells: &[Option<&Cells>; N],
        next: &[[u64; W]; N],
        locked: impl Fn(usize) -> bool,
    ) {
        for slot in 0..N {
            let Some(cell) = cells[slot] else { continue };
            let first = usize::from(locked(slot));
            for (j, &word) in next[slot][..self.width::<W>(slot)]
                .iter()
                .enumerate()
                .skip(first)
            {
                cell.write_word_held(j, word);
            }
        }
    }

    /// The limits of layer `slot` (W is 1 for stacks whose layers all have one).
    #[inline(always)]
    fn width<const W: usize>(&self, slot: usize) -> usize {
        if W == 1 {
            1
        } else {
            self.layers[slot].plans[0].limits.len().min(W)
        }
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
