//! The lock protocol, beside the cells it guards (`crate::cells`): shard locks in ascending
//! shard order; entry locks (a group's lead's) in ascending address order, or, with a global
//! layer, that layer's entry lock alone (the commit lock), under which the other entries are
//! held and which is released last.

use std::hash::Hash;

use limiter_core::Clock;

use super::Stack;
use super::plan::{Guard, Outcome, ShardOrder, Targets};
use crate::cells::{Cells, Held, Snapshot};
use crate::decision::MAX_LAYERS;
use crate::error::CallError;

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Locks the shards in ascending order, write locks where `order` asks for them.
    #[inline]
    pub(super) fn lock_shards<'s, const N: usize>(
        &'s self,
        order: &ShardOrder<N>,
        guards: &mut [Option<Guard<'s, K>>; N],
    ) {
        for (position, guard) in guards[..order.len].iter_mut().enumerate() {
            let shard = order.shards[position];
            *guard = Some(if order.write[position] {
                Guard::Write(self.table.write(shard))
            } else {
                Guard::Read(self.table.read(shard))
            });
        }
    }

    /// Locks every entry, decides again if any changed since `snapshots`, and writes the
    /// states if every layer still admits (a record writes them whatever the answer).
    #[inline]
    pub(super) fn commit(
        &self,
        targets: &Targets<K>,
        cells: &[Option<&Cells>; MAX_LAYERS],
        snapshots: &[Option<Snapshot>; MAX_LAYERS],
        outcome: &mut Outcome,
        cost: u64,
        now: u64,
    ) -> Result<(), CallError> {
        let layers = self.layers.len();
        let mut cells = *cells;
        let mut held = self.hold(&mut cells, layers);
        let changed = (0..layers).any(|slot| match (cells[slot], &held[slot], &snapshots[slot]) {
            (Some(cell), Some(held), Some(seen)) => !cell.still_holds(held, seen),
            (Some(_), Some(_), None) => true,
            _ => false,
        });
        let decided = if changed {
            for slot in 0..layers {
                outcome.next[slot] = match (cells[slot], &held[slot]) {
                    (Some(cell), Some(held)) => Some(cell.read_held(held)),
                    _ => None,
                };
            }
            outcome.restart();
            self.decide_all(targets, cost, now, outcome)
        } else {
            Ok(())
        };
        let write = decided.is_ok() && outcome.writes(cost);
        for slot in self.release_order(layers) {
            if let (Some(cell), Some(held)) = (cells[slot], held[slot].take()) {
                match &outcome.next[slot] {
                    Some(next) if write => cell.write_and_unlock(held, next),
                    _ => cell.unlock(held),
                }
            }
        }
        decided
    }

    /// Holds every present entry of `cells` (the first `layers` slots) for a commit.
    ///
    /// In a stack with a global layer, that layer's entry lock is the commit lock: every call
    /// that writes touches every global layer, so it takes that one lock, and holds its other
    /// entries through it without locking them (no writer of them goes without it). The
    /// calls were serialised by the global entry already; each now takes one locked
    /// instruction instead of one per layer. A stack of keyed layers alone locks each group's
    /// lead, in ascending address order, and holds the rest of the group through it (a call
    /// touches all of a group or none of it). Release the holds in
    /// [`release_order`](Self::release_order).
    #[inline]
    pub(super) fn hold<'c, const N: usize>(
        &'c self,
        cells: &mut [Option<&'c Cells>; N],
        layers: usize,
    ) -> [Option<Held>; N] {
        let commit = self
            .commit_layer
            .and_then(|slot| Some((slot, self.globals.get(slot)?.as_deref()?)));
        let mut held = match commit.filter(|&(slot, _)| slot < layers) {
            Some((commit, lock)) => {
                // A global layer takes part in every call, so its slot holds this entry already.
                cells[commit] = Some(lock);
                let mut held: [Option<Held>; N] = [const { None }; N];
                held[commit] = Some(lock.lock());
                held
            }
            None => {
                let mut leads = *cells;
                for (slot, lead) in leads[..layers].iter_mut().enumerate() {
                    if !self.leads(slot) {
                        *lead = None;
                    }
                }
                lock_in_address_order(&leads, layers)
            }
        };
        for (cell, held) in cells[..layers].iter().zip(&mut held) {
            if let (None, Some(cell)) = (&held, cell) {
                *held = Some(cell.hold_under_guard());
            }
        }
        held
    }

    /// The first `layers` slots in the order their holds are released: those held through a
    /// guard first, then the locks (the commit layer's, or each group's lead), so the writes made
    /// under a lock are all published when it is let go.
    #[inline]
    pub(super) fn release_order(&self, layers: usize) -> impl Iterator<Item = usize> + '_ {
        let commit = self.commit_layer.filter(|&slot| slot < layers);
        let locked = move |slot: usize| match commit {
            Some(commit) => slot == commit,
            None => self.leads(slot),
        };
        let guarded = (0..layers).filter(move |&slot| !locked(slot));
        guarded.chain((0..layers).filter(move |&slot| locked(slot)))
    }
}

/// Locks the present entries in ascending address order, returning each one's hold by slot.
#[inline]
pub(super) fn lock_in_address_order<const N: usize>(
    cells: &[Option<&Cells>; N],
    layers: usize,
) -> [Option<Held>; N] {
    // Insertion sort of the present slots by address: at most `MAX_LAYERS`, usually one to
    // three, where a general sort costs more than the locking.
    let mut slots = [0; N];
    let mut len = 0;
    for (slot, cell) in cells[..layers].iter().enumerate() {
        let Some(cell) = cell else { continue };
        let mut at = len;
        while at > 0
            && cells[slots[at - 1]]
                .is_some_and(|c| std::ptr::from_ref(c) > std::ptr::from_ref(*cell))
        {
            slots[at] = slots[at - 1];
            at -= 1;
        }
        slots[at] = slot;
        len += 1;
    }
    let mut held: [Option<Held>; N] = [const { None }; N];
    for &slot in &slots[..len] {
        if let Some(cell) = cells[slot] {
            held[slot] = Some(cell.lock());
        }
    }
    held
}
