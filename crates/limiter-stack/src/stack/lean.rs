//! The lean path: a stack of more than four layers (fewer take the fixed-plan path) whose every
//! plan has one limit decides each layer's one word without its lock, straight into the answer, and writes only if no entry changed since it was read;
//! anything else goes to the general path with the targets it found.

use std::hash::Hash;

use limiter_core::{Clock, Decision};
use limiter_store::table::ShardReadGuard;

use super::plan::{Call, GLOBAL, LeanTargets, SKIPPED, ShardOrder, fill_shard_order};
use super::{Entry, Member, Stack};
use crate::algorithms::DynAlgorithm;
use crate::cells::{Cells, EntryCells};
use crate::decision::{Answer, LayerDecision};
use crate::error::CallError;
use crate::layer::KeySource;

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides a call of a lean stack of at most `N` layers on the lean path or, if it cannot
    /// finish there, on the general path with the targets it found (keyers and plan functions
    /// run once per call).
    #[inline(always)]
    pub(super) fn decide_sized<const N: usize>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<(), CallError> {
        let mut targets = LeanTargets::<K, N>::new();
        self.fill_lean(request, &mut targets)?;
        if self.decide_lean(&targets, cost, now, out)? {
            return Ok(());
        }
        let mut call = Call::new();
        targets.into_targets(&self.members, &mut call.targets);
        fill_shard_order(&call.targets[..self.layers.len()], &mut call.order);
        self.decide_general(&mut call, cost, now)?;
        out.replace(call.outcome.decision, &call.outcome.layers);
        Ok(())
    }

    /// Each layer's key, hash, shard and plan for `request`, as
    /// [`fill_targets`](Self::fill_targets) finds them, into `targets` (new).
    #[inline(always)]
    pub(super) fn fill_lean<const N: usize>(
        &self,
        request: &R,
        targets: &mut LeanTargets<K, N>,
    ) -> Result<(), CallError> {
        for (index, layer) in self.layers.iter().enumerate().take(N) {
            let lead = self.members[index].lead;
            if lead != index {
                // Shares its lead's key and entry: takes part exactly when the lead does.
                if targets.plans[lead] == SKIPPED {
                    continue;
                }
            } else if let KeySource::Keyed(keyer) = &layer.keyer {
                let Some(key) = keyer.key(request) else {
                    continue;
                };
                let hash = self.table.hash_one((index as u32, &key));
                targets.hashes[index] = hash;
                targets.shards[index] = self.table.shard_index(hash);
                targets.keys[index] = Some(key);
            }
            let plan = layer.plan_for(request)?;
            targets.plans[index] = plan;
        }
        Ok(())
    }

    /// Decides a call of a stack whose every plan has one limit, the usual stack, in the fewest
    /// steps: under the shard read locks each entry's one word is read without its lock and
    /// decided once, into `out` (new), before any entry is locked; if
    /// every layer admits, the entries are held ([`commit_lean`](Self::commit_lean)) and
    /// written only if none changed since it was read. Returns `false`, having changed no
    /// entry, when the call needs more (a key to insert, a plan to change, an entry another
    /// call changed): the general path then decides it from the start, into a new answer.
    #[inline(always)]
    pub(super) fn decide_lean<const N: usize>(
        &self,
        targets: &LeanTargets<K, N>,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<bool, CallError> {
        let mut order = ShardOrder::<N>::new();
        for &shard in &targets.shards {
            if shard != GLOBAL {
                order.insert(shard);
            }
        }
        let mut guards: [Option<ShardReadGuard<'_, Entry<K>>>; N] = [const { None }; N];
        for (guard, shard) in guards.iter_mut().zip(order.shards()) {
            *guard = Some(self.table.read(shard));
        }
        let mut cells: [Option<&Cells>; N] = [None; N];
        // Each lead's entry, for the rest of its group (which comes after it).
        let mut entries: [Option<&EntryCells>; N] = [None; N];
        // Each layer's word as read, and as the call would leave it.
        let mut seen = [0_u64; N];
        let mut next = [0_u64; N];
        for slot in 0..N {
            let plan = targets.plans[slot];
            if plan == SKIPPED {
                continue;
            }
            let Some(cell) = self.lean_cell(targets, slot, &order, &guards, &mut entries) else {
                return Ok(false);
            };
            let (read_plan, word) = cell.read_first();
            if read_plan != plan {
                return Ok(false);
            }
            cells[slot] = Some(cell);
            seen[slot] = word;
            let layer = &self.layers[slot];
            let algorithm = &layer.plan(plan).limits[0];
            match algorithm.decide_inline(word, cost, now) {
                Some((answer, after)) => {
                    next[slot] = after;
                    out.take(LayerDecision::from_one(slot, plan, answer));
                }
                None => {
                    let mut answer = Decision::allow(0, 0, 0);
                    let mut after = word;
                    return algorithm
                        .decide(&mut after, cost, now, &mut answer)
                        .map_err(|source| CallError::Decision {
                            layer: layer.name.clone(),
                            limit_index: 0,
                            source,
                        })
                        .map(|()| false);
                }
            }
        }
        // Layers that take no part keep the admission they started with.
        if out.decision.is_allowed()
            && cost > 0
            && !self.commit_lean(&cells, &targets.plans, &seen, &next)
        {
            return Ok(false);
        }
        drop(guards);
        Ok(true)
    }

    /// The cell a lean call decides at `slot`: a group member's from its lead's entry (read
    /// before it, into `entries`), a global layer's own, or the keyed entry found under its
    /// shard's read guard; `None` when the key is not held.
    #[inline(always)]
    fn lean_cell<'s: 'g, 'g, const N: usize>(
        &'s self,
        targets: &LeanTargets<K, N>,
        slot: usize,
        order: &ShardOrder<N>,
        guards: &'g [Option<ShardReadGuard<'s, Entry<K>>>; N],
        entries: &mut [Option<&'g EntryCells>; N],
    ) -> Option<&'g Cells> {
        let shard = targets.shards[slot];
        let Member { lead, position } = self.members[slot];
        if lead != slot {
            return entries[lead].map(|e| e.get(position));
        }
        if shard == GLOBAL {
            return self.globals[slot].as_deref();
        }
        entries[slot] = guards[order.position(shard)]
            .as_ref()
            .and_then(|g| {
                g.find(targets.hashes[slot], |e| {
                    e.layer as usize == slot && Some(&e.key) == targets.keys[slot].as_ref()
                })
            })
            .map(|e| &e.cells);
        entries[slot].map(|e| e.get(0))
    }

    /// Writes a lean call's `next` words into its `cells` (by slot; `plans` and `seen` what each
    /// was decided under and on) if none changed since it was read; whether it did. Held as
    /// every commit holds them ([`hold`](Self::hold)): under the commit lock where the stack
    /// has one, else with each group's lead locked in address order.
    #[inline(always)]
    pub(super) fn commit_lean<const N: usize>(
        &self,
        cells: &[Option<&Cells>; N],
        plans: &[usize; N],
        seen: &[u64; N],
        next: &[u64; N],
    ) -> bool {
        let mut cells = *cells;
        let mut held = self.hold(&mut cells, N);
        let mut unchanged = true;
        for slot in 0..N {
            if let (Some(cell), Some(held)) = (cells[slot], &held[slot]) {
                unchanged &= cell.first_still(held, plans[slot], seen[slot]);
            }
        }
        for slot in self.release_order(N) {
            if let (Some(cell), Some(held)) = (cells[slot], held[slot].take()) {
                if unchanged {
                    cell.write_first_and_unlock(held, next[slot]);
                } else {
                    cell.unlock(held);
                }
            }
        }
        unchanged
    }
}
