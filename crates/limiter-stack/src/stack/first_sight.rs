//! A call with a key that has no entry yet (never seen, or forgotten by a sweep since it was
//! full), on the fixed-plan path. The call builds the key's entry fresh, apart from the table,
//! then takes its shard's write lock (and the other keys' shards, in ascending order, as the
//! fixed-plan path does), decides and commits on it as on an entry it found, and inserts it
//! only if the call wrote it (admitted at a cost): a denial leaves nothing behind. While the
//! write lock is held nobody else can find the key, so the entry it inserts is exactly the
//! state the call committed, as if the call had found it fresh; a key inserted by another call
//! meanwhile, an entry swept since the first look, a plan the call cannot decide here, or a
//! commit that lost its race sends the call to the general path, which replaces the answer
//! whole. (The general path inserts a key fresh under the write lock, decides again and
//! commits, or takes the key out again: about three times the instructions of a call that
//! found its entry.)
//!
//! Lock order is the general path's: the shards' locks first, ascending, then the commit's (a
//! global layer's entry, or the keys' leads, a new entry's own lock being one nobody else can
//! see).

use std::hash::Hash;

use limiter_core::Clock;
use limiter_store::table::Shard;

use super::fixed_plans::Found;
use super::plan::{Guard, ShardOrder};
use super::{Entry, Stack};
use crate::cells::EntryCells;
use crate::decision::{Answer, MAX_LAYERS};
use crate::error::CallError;

/// The leads of a call on several keys, as its first look found them: by slot, each lead's
/// key, hash and shard, the shards in ascending order, and which keys had no entry.
pub(super) struct LeadKeys<K, const N: usize> {
    pub(super) keys: [Option<K>; N],
    pub(super) hashes: [u64; N],
    pub(super) shards: [usize; N],
    pub(super) order: ShardOrder<N>,
    pub(super) missing: [bool; N],
}

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides a call whose keyed layers are all on `key` (led by layer `lead`), which `found`
    /// (its hash, its shard read-locked) has no entry for, into `out` (new); `false`, having
    /// changed nothing, when the general path must decide it. Out of line: the one-key path's
    /// arms stay as small as they were.
    #[inline(never)]
    pub(super) fn first_sight<const N: usize, const W: usize, const CHOSEN: bool>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
        key: Option<(usize, K)>,
        found: Found<'_, K>,
    ) -> Result<bool, CallError> {
        let (Some((lead, key)), Some((guard, hash))) = (key, found) else {
            return Ok(false);
        };
        // The read lock let go, for the write lock.
        drop(guard);
        let Some(entry) = self.fresh_for(CHOSEN, request, lead, key) else {
            return Ok(false);
        };
        // With `max_keys`: a place reserved for the entry, or the general path (which drops
        // full entries to make one, or answers that the table is full).
        if !self.reserve_keys(1) {
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
            self.insert_written(&mut shard, hash, entry, now);
        } else {
            // Not inserted: its reservation goes back.
            self.forget_held(1);
        }
        decided
    }

    /// Decides a call on several keys, some of which (`leads.missing`) have no entry, into `out`
    /// (new); `false`, having changed nothing, when the general path must decide it.
    #[inline(never)]
    pub(super) fn first_sight_on_keys<const N: usize, const W: usize, const CHOSEN: bool>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
        mut leads: LeadKeys<K, N>,
    ) -> Result<bool, CallError> {
        let mut fresh: [Option<Entry<K>>; N] = [const { None }; N];
        if !self.fresh_entries(CHOSEN, request, &mut leads, &mut fresh) {
            return Ok(false);
        }
        let new_keys = fresh.iter().flatten().count();
        if !self.reserve_keys(new_keys) {
            return Ok(false);
        }
        let mut guards: [Option<Guard<'_, K>>; N] = [const { None }; N];
        self.lock_shards(&leads.order, &mut guards);
        let decided = match self.find_leads(&leads, &fresh, &guards) {
            Some(entries) => self.decide_cells::<N, W, CHOSEN>(
                |slot| {
                    let member = self.members[slot];
                    let cells = match &fresh[member.lead] {
                        Some(entry) => Some(&entry.cells),
                        None => entries[member.lead],
                    };
                    cells.map(|c| c.get(member.position))
                },
                request,
                cost,
                now,
                out,
            ),
            None => Ok(false),
        };
        if matches!(decided, Ok(true)) && out.decision.is_allowed() && cost > 0 {
            for (slot, entry) in fresh.into_iter().enumerate() {
                let position = leads.order.position(leads.shards[slot]);
                if let (Some(entry), Some(Guard::Write(shard))) = (entry, &mut guards[position]) {
                    self.insert_written(shard, leads.hashes[slot], entry, now);
                }
            }
        } else {
            // Nothing inserted: the reservations go back.
            self.forget_held(new_keys);
        }
        decided
    }

    /// Each missing key's entry, fresh, into `fresh` (by slot), its key taken from `leads` and
    /// its shard marked for writing; `false` when a plan function refuses the request.
    #[inline(always)]
    fn fresh_entries<const N: usize>(
        &self,
        chosen: bool,
        request: &R,
        leads: &mut LeadKeys<K, N>,
        fresh: &mut [Option<Entry<K>>; N],
    ) -> bool {
        for (slot, entry) in fresh.iter_mut().enumerate() {
            if !leads.missing[slot] {
                continue;
            }
            let Some(key) = leads.keys[slot].take() else {
                return false;
            };
            *entry = self.fresh_for(chosen, request, slot, key);
            if entry.is_none() {
                return false;
            }
            let position = leads.order.position(leads.shards[slot]);
            leads.order.write[position] = true;
        }
        true
    }

    /// Under the call's shard locks, each present lead's entry (by slot); `None` when one is
    /// gone (swept since the first look) or a new key's entry is there (inserted meanwhile).
    fn find_leads<'g, const N: usize>(
        &self,
        leads: &LeadKeys<K, N>,
        fresh: &[Option<Entry<K>>; N],
        guards: &'g [Option<Guard<'_, K>>; N],
    ) -> Option<[Option<&'g EntryCells>; N]> {
        let mut entries = [None; N];
        for slot in 0..N {
            let key = match (&fresh[slot], &leads.keys[slot]) {
                (Some(entry), _) => &entry.key,
                (None, Some(key)) => key,
                (None, None) => continue,
            };
            let guard = guards[leads.order.position(leads.shards[slot])].as_ref()?;
            let found = guard.find(leads.hashes[slot], |e| {
                e.layer as usize == slot && e.key == *key
            });
            match (found, &fresh[slot]) {
                (Some(entry), None) => entries[slot] = Some(&entry.cells),
                (None, Some(_)) => {}
                _ => return None,
            }
        }
        Some(entries)
    }

    /// Inserts `entry`, which the call wrote (so not full), into `shard`, write-locked and
    /// holding no entry for its key.
    fn insert_written(&self, shard: &mut Shard<Entry<K>>, hash: u64, entry: Entry<K>, now: u64) {
        let before = shard.len();
        shard.insert(
            hash,
            entry,
            |e| self.entry_is_full(e, now),
            |e| self.table.hash_one((e.layer, &e.key)),
        );
        // The insert may have dropped full entries to make room.
        self.forget_held(before.saturating_add(1).saturating_sub(shard.len()));
    }

    /// With `max_keys`: reserves places for `n` new entries, all or none.
    fn reserve_keys(&self, n: usize) -> bool {
        let Some(max) = self.max_keys else {
            return true;
        };
        for reserved in 0..n {
            if !self.reserve_key(max) {
                self.forget_held(reserved);
                return false;
            }
        }
        true
    }

    /// `key`'s entry, fresh: every layer of `lead`'s group at the start of the plan `request`
    /// chooses where `chosen` (the call's arm reads plan functions) and the layer's plan can
    /// change, else of its first, as the fixed-plan path decides them; `None` when a plan
    /// function refuses the request (the general path says why).
    fn fresh_for(&self, chosen: bool, request: &R, lead: usize, key: K) -> Option<Entry<K>> {
        let mut plans = [0; MAX_LAYERS];
        for member in self.group(lead) {
            if chosen && self.plan_changes(member) {
                plans[member] = self.layers[member].plan_for(request).ok()?;
            }
        }
        Some(self.group_entry(lead, key, |member| plans[member]))
    }
}
