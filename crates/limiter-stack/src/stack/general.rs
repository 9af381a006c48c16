//! The general path: every layer's entry read under the shard read locks and decided with its
//! plan's limits; an admitted call's entries held and re-read before they are written; a key
//! not yet in the table inserted under its shard's write lock and removed again if the call is
//! denied.

use std::hash::Hash;

use limiter_core::{Clock, Decision};

use super::plan::{Call, Guard, Guards, Outcome, Place, ShardOrder, Target, Targets};
use super::{Entry, Stack, fresh};
use crate::algorithms::DynAlgorithm;
use crate::cells::{Cells, EntryCells, MAX_LIMITS_PER_LAYER, Snapshot};
use crate::decision::{LayerDecision, MAX_LAYERS};
use crate::error::CallError;

/// What inserting a call's missing keys came to.
enum Inserted {
    /// Every missing key is in.
    All,
    /// A shard needs its write lock: lock again and retry.
    Retry,
    /// This layer's new key found no room under `max_keys`.
    Full(usize),
}

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides `call` (targets and shard order filled, the rest fresh) on the general path,
    /// leaving the answer in `call.outcome.decision`.
    #[inline]
    pub(super) fn decide_general(
        &self,
        call: &mut Call<K>,
        cost: u64,
        now: u64,
    ) -> Result<(), CallError> {
        if self.decide_present(call, cost, now)? {
            return Ok(());
        }
        self.decide_inserting(call, cost, now)
    }

    /// Decides under shard read locks, as every call whose keys are all held ends. Returns
    /// `false`, with the shards of the absent keys marked for writing, when the call admits
    /// and needs a key inserted.
    #[inline]
    pub(super) fn decide_present(
        &self,
        call: &mut Call<K>,
        cost: u64,
        now: u64,
    ) -> Result<bool, CallError> {
        let mut guards: Guards<'_, K> = [const { None }; MAX_LAYERS];
        self.lock_shards(&call.order, &mut guards);
        let mut cells = [None; MAX_LAYERS];
        self.find(&call.targets, &call.order, &guards, &mut cells);
        self.read_all(&cells, &mut call.seen, &mut call.outcome.next);
        self.decide_all(&call.targets, cost, now, &mut call.outcome)?;
        if !call.outcome.writes(cost) {
            return Ok(true);
        }
        let mut all_present = true;
        for (target, cell) in call.targets[..self.layers.len()].iter().zip(&cells) {
            if let (
                Some(Target {
                    place: Place::Keyed { shard, .. },
                    ..
                }),
                None,
            ) = (target, cell)
            {
                let position = call.order.position(*shard);
                call.order.write[position] = true;
                all_present = false;
            }
        }
        if all_present {
            self.commit(
                &call.targets,
                &cells,
                &call.seen,
                &mut call.outcome,
                cost,
                now,
            )?;
        }
        Ok(all_present)
    }

    /// Decides a call that admits with some keys absent: takes their shards' write locks,
    /// inserts the keys, decides again and commits, or takes the new keys out again.
    #[inline]
    pub(super) fn decide_inserting(
        &self,
        call: &mut Call<K>,
        cost: u64,
        now: u64,
    ) -> Result<(), CallError> {
        let Call {
            targets,
            order,
            seen,
            outcome,
        } = call;
        // With `max_keys`: whether every shard's full entries were dropped to make room.
        let mut reclaimed = false;
        loop {
            let mut guards: Guards<'_, K> = [const { None }; MAX_LAYERS];
            self.lock_shards(order, &mut guards);
            let mut inserted = [false; MAX_LAYERS];
            let full = match self.insert_missing(targets, order, &mut guards, &mut inserted, now) {
                Inserted::All => None,
                Inserted::Retry => continue,
                Inserted::Full(layer) => Some(layer),
            };
            if full.is_some() && !reclaimed {
                // Full here: take out what this call inserted, let go of the shards, drop
                // every shard's full entries, and try once more.
                self.take_out(targets, &inserted, order, &mut guards);
                drop(guards);
                self.reclaim_full();
                reclaimed = true;
                continue;
            }
            let result = if let Some(layer) = full {
                Err(CallError::Full {
                    layer: self.layers[layer].name().to_owned(),
                    max_keys: self.max_keys.unwrap_or(0),
                })
            } else {
                let mut cells = [None; MAX_LAYERS];
                self.find(targets, order, &guards, &mut cells);
                if targets
                    .iter()
                    .zip(&cells)
                    .any(|(t, c)| t.is_some() && c.is_none())
                {
                    // Unreachable while the sweep spares this call's entries; never commit
                    // without every layer's entry.
                    continue;
                }
                // The first look's answer stands: the commit checks every entry against
                // what it was decided on, and decides again only if one changed.
                self.assume_fresh(targets, seen);
                self.commit(targets, &cells, seen, outcome, cost, now)
            };
            let written = result.is_ok() && outcome.writes(cost);
            if !written {
                // Nobody else has seen the new entries (their shards are write-locked): take
                // them out again, so a denial leaves nothing behind.
                self.take_out(targets, &inserted, order, &mut guards);
            }
            return result;
        }
    }

    /// Inserts every key of `targets` not yet held, fresh, under its shard's write lock,
    /// marking each in `inserted`. A shard read-locked where a key is missing (reclaimed since
    /// the first look) is marked for writing and the call retries; with `max_keys`, a key
    /// with no room even after dropping the shard's full entries stops the inserts.
    #[inline]
    fn insert_missing(
        &self,
        targets: &Targets<K>,
        order: &mut ShardOrder,
        guards: &mut Guards<'_, K>,
        inserted: &mut [bool; MAX_LAYERS],
        now: u64,
    ) -> Inserted {
        for (slot, target) in targets.iter().enumerate() {
            let Some(Target {
                layer,
                plan,
                place: Place::Keyed { key, hash, shard },
            }) = target
            else {
                continue;
            };
            let position = order.position(*shard);
            let Some(guard) = guards[position].as_mut() else {
                continue;
            };
            if guard
                .find(*hash, |e| e.layer as usize == *layer && e.key == *key)
                .is_some()
            {
                continue;
            }
            let Guard::Write(shard) = guard else {
                // Reclaimed since the first look: this shard needs its write lock too.
                order.write[position] = true;
                return Inserted::Retry;
            };
            let entry = self.fresh_entry(targets, *layer, *plan, key);
            // The entries this call inserted are fresh, so full: the sweep an insert may
            // run must spare them, or a second insert could drop the first.
            let ours = |e: &Entry<K>| {
                targets.iter().zip(inserted.iter()).any(|(t, &mine)| {
                    mine && t.as_ref().is_some_and(|t| {
                        t.layer == e.layer as usize
                            && matches!(&t.place, Place::Keyed { key, .. } if *key == e.key)
                    })
                })
            };
            if let Some(max) = self.max_keys
                && !self.reserve_key(max)
            {
                let dropped = shard.sweep(|e| !ours(e) && self.entry_is_full(e, now));
                self.forget_held(usize::try_from(dropped).unwrap_or(usize::MAX));
                if !self.reserve_key(max) {
                    return Inserted::Full(*layer);
                }
            }
            let before = shard.len();
            shard.insert(
                *hash,
                entry,
                |e| !ours(e) && self.entry_is_full(e, now),
                |e| self.table.hash_one((e.layer, &e.key)),
            );
            // The insert may have dropped full entries to make room.
            self.forget_held(before.saturating_add(1).saturating_sub(shard.len()));
            inserted[slot] = true;
        }
        Inserted::All
    }

    /// A fresh entry for `key` at `layer`: it holds the whole group, each layer fresh under
    /// the plan it chose (the group takes part as one: every member has its target).
    #[inline]
    fn fresh_entry(&self, targets: &Targets<K>, layer: usize, plan: usize, key: &K) -> Entry<K> {
        self.group_entry(layer, key.clone(), |member| {
            targets[member].as_ref().map_or(plan, |t| t.plan)
        })
    }

    /// Takes the entries this call `inserted` out again, under their shards' write locks: nobody
    /// else has seen them, so the call leaves nothing behind (and gives their places back).
    fn take_out(
        &self,
        targets: &Targets<K>,
        inserted: &[bool; MAX_LAYERS],
        order: &ShardOrder,
        guards: &mut Guards<'_, K>,
    ) {
        for (target, _) in targets.iter().zip(inserted).filter(|(_, mine)| **mine) {
            if let Some(Target {
                layer,
                place: Place::Keyed { key, hash, shard },
                ..
            }) = target
                && let Some(Guard::Write(g)) = &mut guards[order.position(*shard)]
                && g.remove(*hash, |e| e.layer as usize == *layer && e.key == *key)
                    .is_some()
            {
                self.forget_held(1);
            }
        }
    }

    /// Marks each key absent at the first look as seen fresh under its chosen plan: the state
    /// it was decided on there. An entry this call inserted is still that state at the commit
    /// (nobody else has seen it), so the first answer stands without deciding again; a key
    /// another call inserted meanwhile differs, and the commit decides again.
    fn assume_fresh(&self, targets: &Targets<K>, seen: &mut [Option<Snapshot>; MAX_LAYERS]) {
        for (target, seen) in targets[..self.layers.len()].iter().zip(seen.iter_mut()) {
            if let (Some(target), None) = (target, &seen) {
                *seen = Some(fresh(&self.layers[target.layer], target.plan));
            }
        }
    }

    /// Each target's entry, under the guards, into `cells`; `None` for a key not in the table.
    #[inline]
    pub(super) fn find<'g>(
        &'g self,
        targets: &Targets<K>,
        order: &ShardOrder,
        guards: &'g Guards<'_, K>,
        cells: &mut [Option<&'g Cells>; MAX_LAYERS],
    ) {
        // Each lead's entry, for the rest of its group (which comes after it).
        let mut entries: [Option<&EntryCells>; MAX_LAYERS] = [None; MAX_LAYERS];
        for (slot, (cell, target)) in cells
            .iter_mut()
            .zip(&targets[..self.layers.len()])
            .enumerate()
        {
            let Some(target) = target else { continue };
            *cell = match &target.place {
                Place::Global => self.globals[target.layer].as_deref(),
                Place::Keyed { key, hash, shard } => {
                    entries[slot] = guards[order.position(*shard)]
                        .as_ref()
                        .and_then(|g| {
                            g.find(*hash, |e| e.layer as usize == target.layer && e.key == *key)
                        })
                        .map(|e| &e.cells);
                    entries[slot].map(|e| e.get(0))
                }
                Place::InGroup { lead, position } => entries[*lead].map(|e| e.get(*position)),
            };
        }
    }

    /// Decides every target on its state in `out.next` (`None` there: an absent key, which
    /// starts fresh under the chosen plan), in place, leaving there the state to write, and
    /// carrying a key's consumption over to the chosen plan when it changed. Adds each layer's
    /// answer to `out` (new, or restarted by the caller). The states are read straight into
    /// `out.next` and decided in place.
    #[inline]
    pub(super) fn decide_all(
        &self,
        targets: &Targets<K>,
        cost: u64,
        now: u64,
        out: &mut Outcome,
    ) -> Result<(), CallError> {
        for (slot, target) in targets[..self.layers.len()].iter().enumerate() {
            let Some(target) = target else { continue };
            let layer = &self.layers[target.layer];
            let limits = &layer.plan(target.plan).limits;
            // Builds the error only when there is one: the name is cloned on that path alone.
            let error = |limit_index: usize| {
                move |source| CallError::Decision {
                    layer: layer.name.clone(),
                    limit_index,
                    source,
                }
            };
            let state = match &mut out.next[slot] {
                Some(state) => state,
                absent => absent.insert(fresh(layer, target.plan)),
            };
            if state.plan != target.plan {
                let old = &layer.plan(state.plan).limits;
                for (j, (word, (from, to))) in state
                    .words
                    .iter_mut()
                    .zip(old.iter().zip(limits))
                    .enumerate()
                {
                    *word = to
                        .with_usage(from.usage(*word, now), now)
                        .map_err(error(j))?;
                }
                state.plan = target.plan;
            }
            let record = out.record;
            if let [algorithm] = limits.as_slice() {
                // One limit, the usual layer: its answer is the layer's, decided in place.
                let mut decision = Decision::allow(0, 0, 0);
                if record {
                    algorithm.record(&mut state.words[0], cost, now, &mut decision)
                } else {
                    algorithm.decide(&mut state.words[0], cost, now, &mut decision)
                }
                .map_err(error(0))?;
                out.take(LayerDecision::from_one(target.layer, target.plan, decision));
                continue;
            }
            let mut parts = [Decision::allow(0, 0, 0); MAX_LIMITS_PER_LAYER];
            for (j, (algorithm, (word, part))) in limits
                .iter()
                .zip(state.words.iter_mut().zip(&mut parts))
                .enumerate()
            {
                if record {
                    algorithm.record(word, cost, now, part).map_err(error(j))?;
                } else {
                    algorithm.decide(word, cost, now, part).map_err(error(j))?;
                }
            }
            if let Some(layer) =
                LayerDecision::from_limits(target.layer, target.plan, &parts[..limits.len()])
            {
                out.take(layer);
            }
        }
        Ok(())
    }

    /// Each present entry's state, read without its lock, into `seen` (to check at commit)
    /// and into `next` (to decide in place); `None` in both for an absent key.
    #[inline]
    pub(super) fn read_all(
        &self,
        cells: &[Option<&Cells>; MAX_LAYERS],
        seen: &mut [Option<Snapshot>; MAX_LAYERS],
        next: &mut [Option<Snapshot>; MAX_LAYERS],
    ) {
        for (slot, cell) in cells[..self.layers.len()].iter().enumerate() {
            let snapshot = cell.map(Cells::read);
            seen[slot] = snapshot;
            next[slot] = snapshot;
        }
    }
}
