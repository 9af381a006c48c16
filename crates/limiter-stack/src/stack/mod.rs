//! [`Stack`]: several layers decided as one call, at one `now`, all or nothing.
//!
//! # How a call is decided
//!
//! 1. Each layer derives its key (keyed layers) and its plan from the request. Keyed layers
//!    share one [`ShardedTable`] of entries, one per key and *group* (the keyed layers that
//!    share a keyer: [`Layer::same_key`], or keyers reading one named key), found by one lookup
//!    and holding each layer's cells, a word per limit; global layers each hold one entry of
//!    their own. A group's first layer, its lead, derives the key; the others take it.
//! 2. The shards the keys fall in are read-locked in ascending shard order (the locks prefer
//!    waiting writers, so any other order could deadlock). Every entry is read without a lock
//!    and every limit decided with the pure transition of its algorithm.
//! 3. If any limit denies, or the call is a peek, that is the answer: nothing is written.
//! 4. Otherwise the entries are locked in ascending address order, re-read, decided again if
//!    they changed, and written (or, if some limit now denies, released unwritten). An entry is
//!    only ever locked by a call that already holds all its shard locks, and that call then
//!    never waits for anything but other entry locks further up the order, so no order of
//!    layers or keys can deadlock and some call always completes. A group's entry is locked by
//!    its lead's lock alone, which holds the group's other cells. In a stack with a global
//!    layer, the first global layer's entry lock is the *commit lock*: every call that writes
//!    touches every global layer, so it takes that lock alone, holds its other entries through
//!    it (none of them is locked on its own, none written without it) and releases it last.
//! 5. A key not yet in the table is inserted under its shard's write lock (taken, with the
//!    others, in shard order) and removed again if the call ends up denied, before anyone else
//!    can see it: a denial leaves no trace, not even memory.
//!
//! A stack of more than four layers whose every plan has one limit first tries a lean path with
//! the same locks in the same order: it reads each entry's one word without its lock and decides
//! it once, straight into the answer, then locks the entries (or takes the commit lock) and
//! writes them only if none changed since it read them. Its working arrays are as long as the
//! stack is deep (one to four layers; eight beyond), and hold each target's key, hash, shard
//! and plan apart, so a call stores little before its first locked instruction, each of which
//! waits for the stores before it. A call the lean path cannot finish as simply (a key to
//! insert, a plan to change, an entry another call changed) goes to steps 2–5 from the start,
//! with the targets the lean path found and a new answer.
//!
//! A stack of at most four layers, each with one plan (of one limit or several) and no plan
//! function (the usual stack), or with plans chosen per call, takes the fixed-plan path instead: one lookup per key (the shards read-locked in ascending order),
//! each word read without a sequence lock where its plan never changes (under it where a plan
//! function chooses: an entry in another plan than the call's goes to the general path, which
//! changes it), decided inline into the answer, committed under one lock (the commit lock, or
//! the one key's lead) or, for keyed layers on several keys and no global layer, under each
//! key's lead in address order, if no word and no plan changed since. Keyed layers on one key
//! take a shorter variant of it, with no working arrays for keys. A key with no entry is
//! decided there on an entry built apart, its shard write-locked instead of read-locked, and
//! inserted only if the call wrote it: step 5 without the insert and removal around a denial.
//!
//! The jobs live apart: `builder.rs` (checking the layers, choosing the paths), `plan.rs`
//! (what a call touches), `fixed_plans.rs` (the fixed-plan path), `first_sight.rs` (its new
//! keys), `chosen.rs` (its arms for plan functions), `lean.rs` (the lean path), `general.rs`
//! (steps 2–5), `locks.rs` (the lock protocol).

use std::hash::Hash;

use crossbeam_utils::CachePadded;
use limiter_core::{Clock, DefaultClock};
use limiter_store::table::ShardedTable;

use crate::algorithms::DynAlgorithm;
use crate::cells::{Cells, EntryCells, MAX_LIMITS_PER_LAYER, Snapshot};
use crate::decision::{Answer, Grant, MAX_LAYERS, StackDecision};
use crate::error::{BuildError, CallError, RefundError};
use crate::layer::{Layer, Plan};
use crate::sync::{AtomicU64, EntryHasher, Ordering};

mod builder;
mod chosen;
mod each;
mod first_sight;
mod fixed_plans;
mod general;
mod groups;
mod lean;
mod locks;
mod plan;

pub use builder::StackBuilder;
use groups::Member;
use plan::{Call, Guards};

/// Layers of limits over requests of type `R`, keyed layers keyed by `K`, decided as one
/// call: admitted only if every layer admits, and a denied call changes nothing.
///
/// Build one with [`Stack::builder`]. See the crate docs for an example.
pub struct Stack<R, K, C = DefaultClock> {
    layers: Box<[Layer<R, K>]>,
    /// One entry per global layer, by layer position (`None` for keyed layers).
    globals: Box<[Option<CachePadded<Cells>>]>,
    table: ShardedTable<Entry<K>, EntryHasher>,
    /// With `max_keys`: the keyed entries held, a slot reserved before each insert, so the
    /// bound is exact across shards. A decision reads it: from the crate's `sync` shim.
    held: AtomicU64,
    max_keys: Option<usize>,
    clock: C,
    id: u64,
    /// Whether every plan of every layer has one limit (the lean path's stacks).
    lean: bool,
    /// The first global layer, whose entry lock is the stack's commit lock (see
    /// [`Stack::hold`]); `None` when every layer is keyed.
    commit_layer: Option<usize>,
    /// Each layer's group (by layer position): the layers sharing its keyer keep their state
    /// in one entry.
    members: Box<[Member]>,
    /// Whether calls take the fixed-plan path (`fixed_plans.rs`) with no plan function: at most
    /// four layers, each one plan.
    fixed_path: bool,
    /// Whether calls take the fixed-plan path with plan functions: at most four layers, some
    /// with plans chosen per call (checked after `fixed_path`, so the usual stack pays nothing
    /// for it).
    chosen_path: bool,
    /// The layers whose plan function chooses a plan per call, a bit each by position: the
    /// fixed-plan path reads their words under the sequence lock and checks their plan under
    /// the commit's lock.
    chosen_plans: u8,
    /// The arm of `decide_chosen` the stack takes (see `chosen.rs`), found once.
    chosen_arm: u8,
    /// The one lock a fixed-plan commit takes: the commit layer, or the lead of the only key;
    /// `None` when keyed layers on several keys and no global layer each lock their lead.
    lone_lock: Option<usize>,
    /// The lead of the first keyed group (`None`: every layer is global), for the fixed-plan
    /// path on one key.
    one_key: Option<usize>,
    /// Whether keyed layers are on several keys (the fixed-plan path then looks up each).
    several_keys: bool,
}

/// A group of keyed layers' state for one key.
#[derive(Debug)]
pub(crate) struct Entry<K> {
    /// The group's lead layer.
    layer: u32,
    key: K,
    cells: EntryCells,
}

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Decides one unit for `request` now.
    #[inline]
    pub fn check(&self, request: &R) -> Result<StackDecision, CallError> {
        self.check_n(request, 1)
    }

    /// Decides `cost` units for `request` now. Cost 0 is a peek: it reports every layer and
    /// changes nothing.
    #[inline]
    pub fn check_n(&self, request: &R, cost: u64) -> Result<StackDecision, CallError> {
        self.decide(request, cost, self.clock.now())
    }

    /// Reports every layer for `request` without consuming or inserting anything.
    #[inline]
    pub fn peek(&self, request: &R) -> Result<StackDecision, CallError> {
        self.check_n(request, 0)
    }

    /// Decides `cost` units for `request` now and, when admitted, returns a [`Grant`] of the
    /// units taken, which [`refund`](Self::refund) can give back.
    #[inline]
    pub fn acquire(
        &self,
        request: &R,
        cost: u64,
    ) -> Result<(StackDecision, Option<Grant>), CallError> {
        self.decide_at(request, cost, self.clock.now())
    }

    /// Decides `cost` units for `request` at `now` (nanoseconds since the clock's epoch).
    #[inline]
    pub fn decide_at(
        &self,
        request: &R,
        cost: u64,
        now: u64,
    ) -> Result<(StackDecision, Option<Grant>), CallError> {
        let decision = self.decide(request, cost, now)?;
        Ok((decision, self.grant_for(&decision, cost, now)))
    }

    /// The grant of a call of `cost` units at `now` that `decision` answered: `None` unless it
    /// took units.
    #[inline]
    fn grant_for(&self, decision: &StackDecision, cost: u64, now: u64) -> Option<Grant> {
        (decision.is_allowed() && cost > 0).then_some(Grant {
            stack: self.id,
            taken: cost,
            left: cost,
            at: now,
        })
    }

    /// Records `cost` units of usage that already happened for `request` now (tokens a
    /// response used, bytes already sent): every layer the request touches is debited, none
    /// refuses, and a layer may be left in debt, so its later calls are denied until the debt
    /// is paid back at its limits' rates. The answer is each layer's: allowed if every layer is
    /// still within its limits, otherwise the layer that went over binds it, and
    /// `retry_after` says when a call of one unit would be admitted again. A key not yet held
    /// is inserted ([`CallError::Full`] if `max_keys` leaves no room); cost 0 is a peek.
    ///
    /// ```
    /// use limiter_core::{Limit, ManualClock};
    /// use limiter_stack::{Kind, Layer, Stack};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // 10,000 tokens a minute per customer: check before the call, record what it used.
    /// let tokens = Stack::builder()
    ///     .layer(Layer::keyed("tokens", |c: &u64| Some(*c)).limit(Kind::TokenBucket, Limit::per_minute(10_000)))
    ///     .clock(ManualClock::new())
    ///     .build()?;
    /// assert!(tokens.peek(&7)?.is_allowed());
    /// tokens.record(&7, 6_000)?;
    /// assert!(tokens.peek(&7)?.is_allowed()); // 4,000 left
    /// let over = tokens.record(&7, 6_000)?; // the response used more than was left
    /// assert!(over.is_denied());
    /// assert!(tokens.peek(&7)?.is_denied()); // the next check waits until the debt is paid
    /// # Ok(()) }
    /// ```
    pub fn record(&self, request: &R, cost: u64) -> Result<StackDecision, CallError> {
        self.record_at(request, cost, self.clock.now())
    }

    /// Records `cost` units of usage for `request` at `now` (see [`record`](Self::record)).
    pub fn record_at(&self, request: &R, cost: u64, now: u64) -> Result<StackDecision, CallError> {
        let mut out = Answer::new(None);
        self.decide_from_scratch(request, cost, now, true, &mut out)?;
        Ok(out.decision)
    }

    /// The compact answer for `cost` units of `request` at `now`.
    #[inline]
    fn decide(&self, request: &R, cost: u64, now: u64) -> Result<StackDecision, CallError> {
        let mut out = Answer::new(None);
        self.decide_into(request, cost, now, &mut out)?;
        Ok(out.decision)
    }

    /// Decides `cost` units for `request` at `now` into `out` (new): a stack of at most four
    /// layers on the fixed-plan path (keyed layers on several keys out of line, apart from the
    /// one-key arms; with plan functions, through arms of their own), with working arrays as
    /// long as the stack is deep and as wide as a layer's most limits unless every layer has
    /// one; a deeper lean stack on the lean path; any other stack, and any call those paths
    /// cannot finish, on the general path.
    fn decide_into(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        out: &mut Answer<'_>,
    ) -> Result<(), CallError> {
        if self.fixed_path && self.several_keys {
            return self.decide_on_keys(request, cost, now, out);
        }
        if self.fixed_path {
            const MAX: usize = MAX_LIMITS_PER_LAYER;
            // `lean`: every layer has one limit, so each keeps one word.
            return match (self.layers.len(), self.lean) {
                (1, true) => self.decide_fixed::<1, 1, false>(request, cost, now, out),
                (2, true) => self.decide_fixed::<2, 1, false>(request, cost, now, out),
                (3, true) => self.decide_fixed::<3, 1, false>(request, cost, now, out),
                (_, true) => self.decide_fixed::<4, 1, false>(request, cost, now, out),
                (1, false) => self.decide_fixed::<1, MAX, false>(request, cost, now, out),
                (2, false) => self.decide_fixed::<2, MAX, false>(request, cost, now, out),
                (3, false) => self.decide_fixed::<3, MAX, false>(request, cost, now, out),
                (_, false) => self.decide_fixed::<4, MAX, false>(request, cost, now, out),
            };
        }
        if self.chosen_path {
            return self.decide_chosen(request, cost, now, out);
        }
        if self.lean {
            // Deeper than the fixed-plan path's four layers.
            return self.decide_sized::<MAX_LAYERS>(request, cost, now, out);
        }
        self.decide_from_scratch(request, cost, now, false, out)
    }

    /// Decides `cost` units for `request` at `now` on the general path from the start, into
    /// `out` (new): any stack the fast paths do not take, any call they cannot finish, and
    /// every record (`record`: see [`record`](Self::record)).
    pub(super) fn decide_from_scratch(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        record: bool,
        out: &mut Answer<'_>,
    ) -> Result<(), CallError> {
        let mut call = Call::new();
        call.outcome.record = record;
        self.prepare(request, &mut call)?;
        self.decide_general(&mut call, cost, now)?;
        out.replace(call.outcome.decision, &call.outcome.layers);
        Ok(())
    }

    /// Gives back `units` to every layer `request` touches, now, without a grant: a caller's
    /// own account of units it took and did not use (envoy's `is_negative_hits`). No layer goes
    /// above full, and a window takes units back only from its current count (a token bucket
    /// from its debt). Unlike [`refund`](Self::refund), nothing proves the units were taken:
    /// expose it only to callers trusted with the limits. Answers with what `request` holds
    /// after it (a peek); a key not held has nothing to give back.
    pub fn refund_units(&self, request: &R, units: u64) -> Result<StackDecision, CallError> {
        let now = self.clock.now();
        if units > 0 {
            self.refund_at(request, units, now, now)?;
        }
        self.decide(request, 0, now)
    }

    /// Gives back `units` of what `grant` took, on every layer the request touches, at the
    /// clock's reading now. At most the grant's units come back in all, and no layer goes above
    /// full: units that have already come back on their own are not returned twice.
    pub fn refund(&self, request: &R, grant: &mut Grant, units: u64) -> Result<(), RefundError> {
        if grant.stack != self.id {
            return Err(RefundError::WrongStack);
        }
        if units > grant.left {
            return Err(RefundError::ExceedsGrant {
                units,
                left: grant.left,
                taken: grant.taken,
            });
        }
        if units == 0 {
            return Ok(());
        }
        self.refund_at(request, units, grant.at, self.clock.now())?;
        grant.left -= units;
        Ok(())
    }

    /// Gives `units` taken at `granted_at` back to every present entry `request` touches, at
    /// `now`, each limit by its algorithm's refund.
    fn refund_at(
        &self,
        request: &R,
        units: u64,
        granted_at: u64,
        now: u64,
    ) -> Result<(), CallError> {
        let mut call = Call::new();
        self.prepare(request, &mut call)?;
        let mut guards: Guards<'_, K> = [const { None }; MAX_LAYERS];
        self.lock_shards(&call.order, &mut guards);
        // An absent key is full: nothing to give back there.
        let mut cells = [None; MAX_LAYERS];
        self.find(&call.targets, &call.order, &guards, &mut cells);
        let targets = &call.targets;
        let layers = self.layers.len();
        let mut held = self.hold(&mut cells, layers);
        for slot in self.release_order(layers) {
            let (Some(target), Some(cell), Some(held)) =
                (&targets[slot], cells[slot], held[slot].take())
            else {
                continue;
            };
            let mut snapshot = cell.read_held(&held);
            let limits = &self.layers[target.layer].plan(snapshot.plan).limits;
            for (word, algorithm) in snapshot.words.iter_mut().zip(limits) {
                if let Some(back) = algorithm.refund(*word, units, granted_at, now) {
                    *word = back;
                }
            }
            cell.write_and_unlock(held, &snapshot);
        }
        Ok(())
    }

    /// Drops every keyed entry whose limits are all full now (they decide exactly like absent
    /// keys), returning how many. The table also does this on its own as keys arrive.
    pub fn reclaim_full(&self) -> u64 {
        let now = self.clock.now();
        let dropped = self.table.reclaim(
            |e| self.entry_is_full(e, now),
            |e| self.table.hash_one((e.layer, &e.key)),
        );
        self.forget_held(usize::try_from(dropped).unwrap_or(usize::MAX));
        dropped
    }

    /// With `max_keys`: reserves a place for one more entry, if the bound leaves one.
    fn reserve_key(&self, max: usize) -> bool {
        let max = u64::try_from(max).unwrap_or(u64::MAX);
        self.held
            // AcqRel/Acquire: a reservation is ordered with the releases (`forget_held`) it
            // counts on, so the bound holds across threads and shards.
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < max).then(|| held.saturating_add(1))
            })
            .is_ok()
    }

    /// With `max_keys`: `n` entries left the table (or a reservation was not used).
    fn forget_held(&self, n: usize) {
        if self.max_keys.is_some() && n > 0 {
            let n = u64::try_from(n).unwrap_or(u64::MAX);
            let _ = self
                .held
                // AcqRel/Acquire: pairs with `reserve_key`'s (see there).
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                    Some(held.saturating_sub(n))
                });
        }
    }

    /// Keyed entries held (one per key and group of layers sharing a keyer), full ones not yet
    /// reclaimed included.
    pub fn len(&self) -> u64 {
        self.table.counts().0
    }

    /// Whether no keyed entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The layers, in stack order ([`LayerDecision::layer`](crate::LayerDecision::layer)
    /// indexes them).
    pub fn layers(&self) -> &[Layer<R, K>] {
        &self.layers
    }

    /// Adds `plan` to layer `layer` (by index, in stack order), which was opened with
    /// [`Layer::open_plans`]; returns the plan's index, for the layer's plan function to
    /// choose. Calls go on while a plan is added; a plan never goes away. Refused, with the
    /// fix, for a layer that is not open or is full, for a plan whose limits the layer's
    /// algorithm refuses or whose number of limits is not the layer's, and for a calendar
    /// limit on a clock that does not keep the wall clock's rate
    /// ([`BuildError::CalendarClock`]).
    pub fn add_plan(&self, layer: usize, plan: Plan) -> Result<usize, BuildError> {
        let layers = self.layers.len();
        self.layers
            .get(layer)
            .ok_or(BuildError::NoSuchLayer { layer, layers })?
            .add_plan(plan, self.clock.keeps_wall_rate())
    }

    /// The name of layer `index`, for headers and metrics.
    pub fn layer_name(&self, index: usize) -> Option<&str> {
        self.layers.get(index).map(Layer::name)
    }

    /// The clock the stack reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Whether every limit of `entry` is full at `now` under the plan each layer's cells were
    /// written with.
    fn entry_is_full(&self, entry: &Entry<K>, now: u64) -> bool {
        self.group(entry.layer as usize)
            .zip(entry.cells.iter())
            .all(|(layer, cells)| {
                let state = cells.read();
                self.layers[layer]
                    .plan(state.plan)
                    .limits
                    .iter()
                    .zip(state.words)
                    .all(|(algorithm, word)| algorithm.is_full(word, now))
            })
    }
}

impl<R, K: Hash + Eq + Clone, C: Clock> Stack<R, K, C> {
    /// `key`'s entry for the group `lead` leads, every layer fresh under the plan `plan_of`
    /// names for it (by layer).
    #[inline(always)]
    fn group_entry(&self, lead: usize, key: K, plan_of: impl Fn(usize) -> usize) -> Entry<K> {
        let mut states = [Snapshot {
            plan: 0,
            words: [0; MAX_LIMITS_PER_LAYER],
        }; MAX_LAYERS];
        let mut members = 0;
        for (state, member) in states.iter_mut().zip(self.group(lead)) {
            *state = fresh(&self.layers[member], plan_of(member));
            members += 1;
        }
        Entry {
            layer: lead as u32,
            key,
            cells: EntryCells::new(&states[..members]),
        }
    }
}

/// The fresh state of `layer` under plan `plan`.
fn fresh<R, K>(layer: &Layer<R, K>, plan: usize) -> Snapshot {
    let mut words = [0; MAX_LIMITS_PER_LAYER];
    for (word, algorithm) in words.iter_mut().zip(&layer.plan(plan).limits) {
        *word = algorithm.fresh();
    }
    Snapshot { plan, words }
}

impl<R, K, C: std::fmt::Debug> std::fmt::Debug for Stack<R, K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("layers", &self.layers)
            .field("table", &self.table)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}
