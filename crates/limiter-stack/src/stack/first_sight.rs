//! A key's first call on the fixed-plan path, for a stack whose keyed layers are on one key:
//! the key has no entry yet (never seen, or forgotten by a sweep since it was full). The call
//! builds the key's entry fresh, apart from the table, then takes its shard's write lock,
//! decides and commits on it as the fixed-plan path does on an entry it found, and inserts it
//! only if the call wrote it (admitted at a cost): a denial leaves nothing behind. While the
//! write lock is held nobody else can find the key, so the entry it inserts is exactly the
//! state the call committed, as if the call had found it fresh; a key inserted by another call
//! meanwhile, a plan the call cannot decide here, or a commit that lost its race sends the call
//! to the general path, which replaces the answer whole. (The general path inserts a key fresh
//! under the write lock, decides again and commits, or takes the key out again: about three
//! times the instructions of a call that found its entry.)
//!
//! Lock order is the general path's: the shard's lock first, then the commit's (a global
//! layer's entry, or the new entry's own, which nobody else can see).

use std::hash::Hash;

use limiter_core::Clock;

use super::{Entry, Stack, fresh};
use crate::cells::{EntryCells, MAX_LIMITS_PER_LAYER, Snapshot};
use crate::decision::{Answer, MAX_LAYERS};
use crate::error::CallError;

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides a call whose keyed layers are all on `key` (of hash `hash`, led by layer
    /// `lead`), which has no entry, into `out` (new); `false`, having changed nothing, when
    /// the general path must decide it. Out of line: the one-key path's arms stay as small as
    /// they were.
    #[inline(never)]
    pub(super) fn first_sight<const N: usize, const W: usize, const CHOSEN: bool>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
        (lead, key, hash): (usize, K, u64),
    ) -> Result<bool, CallError> {
        let Some(entry) = self.fresh_for(CHOSEN, request, lead, key) else {
            return Ok(false);
        };
        // With `max_keys`: a place reserved for the entry, or the general path (which drops
        // full entries to make one, or answers that the table is full).
        if let Some(max) = self.max_keys
            && !self.reserve_key(max)
        {
            return Ok(false);
        }
        let mut shard = self.table.write(self.table.shard_index(hash));
        let inserted_meanwhile = shard
            .find(hash, |e| e.layer == entry.layer && e.key == entry.key)
            .is_some();
        let decided = if inserted_meanwhile {
            Ok(false)
        } else {
            self.decide_cells::<N, W, CHOSEN>(
                |slot| Some(entry.cells.get(self.members[slot].position)),
                request,
                cost,
                now,
                out,
            )
        };
        if matches!(decided, Ok(true)) && out.decision.is_allowed() && cost > 0 {
            let before = shard.len();
            shard.insert(
                hash,
                entry,
                |e| self.entry_is_full(e, now),
                |e| self.table.hash_one((e.layer, &e.key)),
            );
            // The insert may have dropped full entries to make room.
            self.forget_held(before.saturating_add(1).saturating_sub(shard.len()));
        } else {
            // Not inserted: its reservation goes back.
            self.forget_held(1);
        }
        decided
    }

    /// `key`'s entry, fresh: every layer of `lead`'s group at the start of the plan `request`
    /// chooses where `chosen` (the call's arm reads plan functions) and the layer's plan can
    /// change, else of its first, as the fixed-plan path decides them; `None` when a plan
    /// function refuses the request (the general path says why).
    fn fresh_for(&self, chosen: bool, request: &R, lead: usize, key: K) -> Option<Entry<K>> {
        let mut states = [Snapshot {
            plan: 0,
            words: [0; MAX_LIMITS_PER_LAYER],
        }; MAX_LAYERS];
        let mut members = 0;
        for (state, member) in states.iter_mut().zip(self.group(lead)) {
            let layer = &self.layers[member];
            let plan = if chosen && self.plan_changes(member) {
                layer.plan_for(request).ok()?
            } else {
                0
            };
            *state = fresh(layer, plan);
            members += 1;
        }
        Some(Entry {
            layer: u32::try_from(lead).ok()?,
            key,
            cells: EntryCells::new(&states[..members]),
        })
    }
}
