//! The fixed-plan path: a stack of at most four layers, each with one plan (of one limit or
//! several) and no plan function, or with plans that a plan function chooses among per call,
//! keyed on any number of keys, with any number of global layers beside them.
//! A call finds each key's entry by one lookup (the shards read-locked in ascending order, a
//! shard two keys share once), reads each layer's words (without a lock where the layer has one
//! plan, which never changes, so every word read is one a commit wrote; under the sequence lock
//! where a plan function chooses, so the words and their plan are of one commit, and an entry
//! in another plan than the call's goes to the general path), decides each, and commits only if
//! no word and no plan changed since it was read: under the commit lock where the stack has a
//! global layer, else under each key's lead, locked in ascending address order (one lock when
//! every keyed layer is on one key). The answer is folded into the caller's as each layer is
//! decided, before any lock is taken, so no store of it happens while a lock is held (keeping
//! each layer's answers and folding them after the commit measured 15% slower on a stack of
//! three). A call with a key that has no entry yet is decided apart (`first_sight.rs`).
//! Anything else (a plan to change, a word another call changed) goes to the general path from
//! the start, which replaces the answer whole.

use std::hash::Hash;

use limiter_core::{Clock, Decision};
use limiter_store::table::ShardReadGuard;

use super::chosen::chosen_only;
use super::first_sight::LeadKeys;
use super::locks::lock_in_address_order;
use super::plan::{GLOBAL, ShardOrder};
use super::{Entry, Stack};
use crate::algorithms::{DynAlgorithm, PlanLimit};
use crate::cells::{Cells, EntryCells, Held, MAX_LIMITS_PER_LAYER};
use crate::decision::{Answer, LayerDecision};
use crate::error::CallError;
use crate::layer::{KeySource, Layer};

/// A key's hash and its shard, read-locked.
pub(super) type Found<'a, K> = Option<(ShardReadGuard<'a, Entry<K>>, u64)>;

/// The most layers the fixed-plan path takes.
const MOST_LAYERS: usize = 4;

/// Whether `layers` take the fixed-plan path: at most four layers (with plan functions or
/// without: `chosen.rs` takes those).
pub(super) fn fits<R, K>(layers: &[Layer<R, K>]) -> bool {
    layers.len() <= MOST_LAYERS
}

/// `seen` where `chosen` (the word was read with its plan), else what `read` reads.
#[inline(always)]
fn read_unless(chosen: bool, seen: u64, read: impl FnOnce() -> u64) -> u64 {
    if chosen { seen } else { read() }
}

/// Layer `slot`'s answer under plan `plan` from its `limits` limits' answers in `parts` (a
/// plan of one limit, as every plan of a stack of `W` 1, is that limit's answer); `None` for no
/// limits (unreachable: a layer has at least one, checked when built).
#[inline(always)]
fn layer_decision<const W: usize>(
    slot: usize,
    plan: usize,
    parts: &[Decision; W],
    limits: usize,
) -> Option<LayerDecision> {
    if W == 1 {
        Some(LayerDecision::from_one(slot, plan, parts[0]))
    } else {
        LayerDecision::from_limits(slot, plan, &parts[..limits.min(W)])
    }
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
    pub(super) fn decide_fixed<const N: usize, const W: usize, const CHOSEN: bool>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<(), CallError> {
        if self.one_key_path::<N, W, CHOSEN>(request, cost, now, out)? {
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
        const MAX: usize = MAX_LIMITS_PER_LAYER;
        let done = match (self.layers.len(), self.lean) {
            (2, true) => self.fixed_path_on_keys::<2, 1, false>(request, cost, now, out)?,
            (3, true) => self.fixed_path_on_keys::<3, 1, false>(request, cost, now, out)?,
            (_, true) => self.fixed_path_on_keys::<4, 1, false>(request, cost, now, out)?,
            (2, false) => self.fixed_path_on_keys::<2, MAX, false>(request, cost, now, out)?,
            (3, false) => self.fixed_path_on_keys::<3, MAX, false>(request, cost, now, out)?,
            (_, false) => self.fixed_path_on_keys::<4, MAX, false>(request, cost, now, out)?,
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
    pub(super) fn one_key_path<const N: usize, const W: usize, const CHOSEN: bool>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<bool, CallError> {
        let (key, found) = self.one_key_found(request);
        // `None`: the key has no entry. `Some(None)`: no keyed layer takes part.
        let entry = match (&found, &key) {
            (Some((guard, hash)), Some((lead, key))) => guard
                .find(*hash, |e| e.layer as usize == *lead && e.key == *key)
                .map(|entry| Some(&entry.cells)),
            _ => Some(None),
        };
        let Some(entry) = entry else {
            // The key's first call (or its first since a sweep forgot it).
            return self.first_sight::<N, W, CHOSEN>(request, cost, now, out, key, found);
        };
        let mut cells: [Option<&Cells>; N] = [None; N];
        // Each layer's plan, its words as read, and as the call would leave them.
        let mut plans = [0_usize; N];
        let mut seen = [[0_u64; W]; N];
        let mut next = [[0_u64; W]; N];
        // The answer is folded in place as each layer is decided (stack order, as `push` asks),
        // before the lock: none of it is built under it (the general path replaces it).
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
            let chosen = CHOSEN && self.plan_changes(slot);
            let Some((plan, limits)) =
                self.plan_of::<W>(chosen, slot, cell, request, &mut seen[slot])
            else {
                return Ok(false);
            };
            let mut parts = [Decision::allow(0, 0, 0); W];
            for (limit, algorithm) in limits.iter().enumerate().take(W) {
                let word = read_unless(chosen, seen[slot][limit], || cell.read_only_plan(limit));
                let Some((decision, after)) = algorithm.decide_inline(word, cost, now) else {
                    return Err(self.decision_error(slot, plan, limit, word, cost, now));
                };
                parts[limit] = decision;
                seen[slot][limit] = word;
                next[slot][limit] = after;
            }
            let Some(layer) = layer_decision(slot, plan, &parts, limits.len()) else {
                return Ok(false);
            };
            answer.push(layer);
            if let Some(each) = each.as_deref_mut() {
                // Kept as decided; a call the general path finishes replaces them all.
                each.set(layer);
            }
            plans[slot] = plan;
            cells[slot] = Some(cell);
        }
        if answer.is_allowed()
            && cost > 0
            && !self.commit_fixed::<N, W, CHOSEN>(&cells, &plans, &seen, &next)
        {
            return Ok(false);
        }
        drop(found);
        Ok(true)
    }

    /// The call's one key with its lead, and its hash with its shard read-locked (`None` for
    /// both where no keyed layer takes part).
    #[inline(always)]
    fn one_key_found(&self, request: &R) -> (Option<(usize, K)>, Found<'_, K>) {
        let key = match self.one_key.map(|lead| (lead, &self.layers[lead].keyer)) {
            Some((lead, KeySource::Keyed(keyer))) => keyer.key(request).map(|key| (lead, key)),
            _ => None,
        };
        let found = key.as_ref().map(|(lead, key)| {
            let hash = self.table.hash_one((*lead as u32, key));
            let guard = self.table.read(self.table.shard_index(hash));
            (guard, hash)
        });
        (key, found)
    }

    /// [`one_key_path`](Self::one_key_path) for keyed layers on several keys: each key's entry
    /// found under its shard's read lock, the shards locked in ascending order.
    #[inline(always)]
    pub(super) fn fixed_path_on_keys<const N: usize, const W: usize, const CHOSEN: bool>(
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
        let mut missing = [false; N];
        for slot in 0..N {
            let Some(key) = &keys[slot] else { continue };
            let found = guards[order.position(shards[slot])]
                .as_ref()
                .and_then(|g| g.find(hashes[slot], |e| e.layer as usize == slot && e.key == *key));
            match found {
                Some(entry) => entries[slot] = Some(&entry.cells),
                None => missing[slot] = true,
            }
        }
        if missing.contains(&true) {
            // A key's first call (or its first since a sweep forgot it): the read locks let
            // go, then its shard's write lock taken with the others.
            drop(guards);
            let leads = LeadKeys {
                keys,
                hashes,
                shards,
                order,
                missing,
            };
            return self.first_sight_on_keys::<N, W, CHOSEN>(request, cost, now, out, leads);
        }
        let done = self.decide_cells::<N, W, CHOSEN>(
            |slot| {
                let member = self.members[slot];
                entries[member.lead].map(|e| e.get(member.position))
            },
            request,
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
    pub(super) fn decide_cells<'c, const N: usize, const W: usize, const CHOSEN: bool>(
        &'c self,
        keyed: impl Fn(usize) -> Option<&'c Cells>,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<bool, CallError> {
        let mut cells: [Option<&Cells>; N] = [None; N];
        // Each layer's plan, its words as read, and as the call would leave them.
        let mut plans = [0_usize; N];
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
            let chosen = CHOSEN && self.plan_changes(slot);
            let Some((plan, limits)) =
                self.plan_of::<W>(chosen, slot, cell, request, &mut seen[slot])
            else {
                return Ok(false);
            };
            let mut parts = [Decision::allow(0, 0, 0); W];
            for (limit, algorithm) in limits.iter().enumerate().take(W) {
                let word = read_unless(chosen, seen[slot][limit], || cell.read_only_plan(limit));
                let Some((decision, after)) = algorithm.decide_inline(word, cost, now) else {
                    return Err(self.decision_error(slot, plan, limit, word, cost, now));
                };
                parts[limit] = decision;
                seen[slot][limit] = word;
                next[slot][limit] = after;
            }
            let Some(layer) = layer_decision(slot, plan, &parts, limits.len()) else {
                return Ok(false);
            };
            answer.push(layer);
            if let Some(each) = each.as_deref_mut() {
                // Kept as decided; a call the general path finishes replaces them all.
                each.set(layer);
            }
            plans[slot] = plan;
            cells[slot] = Some(cell);
        }
        Ok(!(answer.is_allowed() && cost > 0)
            || self.commit_fixed::<N, W, CHOSEN>(&cells, &plans, &seen, &next))
    }

    /// The plan layer `slot` is decided under and its limits: with `chosen` (its plan function
    /// chooses), the plan chosen for `request`, its words read into `seen` under the sequence
    /// lock, or `None` for the general path (the entry is in another plan, or the layer holds
    /// no such plan: the general path says so); else the first, read word by word.
    #[inline(always)]
    fn plan_of<const W: usize>(
        &self,
        chosen: bool,
        slot: usize,
        cell: &Cells,
        request: &R,
        seen: &mut [u64; W],
    ) -> Option<(usize, &[PlanLimit])> {
        if !chosen {
            return Some((0, &self.layers[slot].plans[0].limits));
        }
        let plan = self.read_chosen(slot, cell, request, seen)?;
        Some((plan, &self.layers[slot].plan(plan).limits))
    }

    /// Writes `next` into `cells` (by slot, each layer's words) if none changed from `seen`:
    /// under one lock where the stack has a global layer (every global layer takes part in every
    /// call) or its keyed layers are on one key, else under each key's lead. Whether it wrote.
    #[inline(always)]
    fn commit_fixed<const N: usize, const W: usize, const CHOSEN: bool>(
        &self,
        cells: &[Option<&Cells>; N],
        plans: &[usize; N],
        seen: &[[u64; W]; N],
        next: &[[u64; W]; N],
    ) -> bool {
        // Without `CHOSEN` every plan is the first and no array need be kept.
        let plans = chosen_only::<N, CHOSEN>(plans);
        let Some(lock_slot) = self.lone_lock else {
            return self.commit_under_leads::<N, W, CHOSEN>(cells, plans, seen, next);
        };
        let Some(lock) = cells.get(lock_slot).copied().flatten() else {
            // Nothing took part (a keyed layer skipped, no global one): nothing to write.
            return cells.iter().all(Option::is_none);
        };
        let held = lock.lock();
        if self.still_seen::<N, W, CHOSEN>(cells, plans, seen) {
            self.write_held::<N, W, CHOSEN>(cells, next, |slot| slot == lock_slot);
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
    fn commit_under_leads<const N: usize, const W: usize, const CHOSEN: bool>(
        &self,
        cells: &[Option<&Cells>; N],
        plans: &[usize; N],
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
        let unchanged = self.still_seen::<N, W, CHOSEN>(cells, plans, seen);
        if unchanged {
            self.write_held::<N, W, CHOSEN>(cells, next, |slot| leads[slot].is_some());
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

    /// Whether every word of `cells` (by slot) is still as `seen`, and in the plan `plans`
    /// names where a layer's plan can change, read under the locks that guard them (a change
    /// of plan is written under them too). Over slices: ranges and `take` adapters here were
    /// called out of line, under the lock.
    #[inline(always)]
    fn still_seen<const N: usize, const W: usize, const CHOSEN: bool>(
        &self,
        cells: &[Option<&Cells>; N],
        plans: &[usize; N],
        seen: &[[u64; W]; N],
    ) -> bool {
        let mut unchanged = true;
        for slot in 0..N {
            if let Some(cell) = cells[slot] {
                if CHOSEN && self.plan_changes(slot) {
                    unchanged &= cell.plan_held() == plans[slot];
                }
                for (j, &word) in seen[slot][..self.width::<W, CHOSEN>(slot)]
                    .iter()
                    .enumerate()
                {
                    unchanged &= cell.word_held(j) == word;
                }
            }
        }
        unchanged
    }

    /// Writes `next` into `cells` (by slot) under the locks that guard them, except the first
    /// word of each slot `locked` names: it goes with that lock's release.
    #[inline(always)]
    fn write_held<const N: usize, const W: usize, const CHOSEN: bool>(
        &self,
        cells: &[Option<&Cells>; N],
        next: &[[u64; W]; N],
        locked: impl Fn(usize) -> bool,
    ) {
        for slot in 0..N {
            let Some(cell) = cells[slot] else { continue };
            let first = usize::from(locked(slot));
            for (j, &word) in next[slot][..self.width::<W, CHOSEN>(slot)]
                .iter()
                .enumerate()
                .skip(first)
            {
                cell.write_word_held(j, word);
            }
        }
    }

    /// The limits in each plan of layer `slot` (W is 1 for stacks whose layers all have one;
    /// without `CHOSEN`, every layer has one plan).
    #[inline(always)]
    fn width<const W: usize, const CHOSEN: bool>(&self, slot: usize) -> usize {
        if W == 1 {
            1
        } else if CHOSEN {
            self.layers[slot].limits_per_plan().min(W)
        } else {
            self.layers[slot].plans[0].limits.len().min(W)
        }
    }

    /// The error layer `slot`'s limit `limit` of plan `plan` gives for `cost` units on `word`
    /// at `now`.
    #[cold]
    fn decision_error(
        &self,
        slot: usize,
        plan: usize,
        limit: usize,
        mut word: u64,
        cost: u64,
        now: u64,
    ) -> CallError {
        let layer = &self.layers[slot];
        let mut answer = Decision::allow(0, 0, 0);
        match layer.plan(plan).limits[limit].decide(&mut word, cost, now, &mut answer) {
            Err(source) => CallError::Decision {
                layer: layer.name.clone(),
                limit_index: limit,
                source,
            },
            // Unreachable: `decide_word` refuses exactly what `decide` does.
            Ok(()) => CallError::NoSuchPlan {
                layer: layer.name.clone(),
                chosen: plan,
                plans: layer.plan_count(),
            },
        }
    }
}
