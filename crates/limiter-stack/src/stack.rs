//! [`Stack`]: several layers decided as one call, at one `now`, all or nothing.
//!
//! # How a call is decided
//!
//! 1. Each layer derives its key (keyed layers) and its plan from the request. Keyed layers
//!    share one [`ShardedTable`] of entries, one per `(layer, key)`, each holding a word per
//!    limit; global layers each hold one entry of their own.
//! 2. The shards the keys fall in are read-locked in ascending shard order (the locks prefer
//!    waiting writers, so any other order could deadlock). Every entry is read without a lock
//!    and every limit decided with the pure transition of its algorithm.
//! 3. If any limit denies, or the call is a peek, that is the answer: nothing is written.
//! 4. Otherwise the entries are locked in ascending address order, re-read, decided again if
//!    they changed, and written (or, if some limit now denies, released unwritten). An entry is
//!    only ever locked by a call that already holds all its shard locks, and that call then
//!    never waits for anything but other entry locks further up the order, so no order of
//!    layers or keys can deadlock and some call always completes. In a stack with a global
//!    layer, the first global layer's entry lock is the *commit lock*: every call that writes
//!    touches every global layer, so it takes that lock alone, holds its other entries through
//!    it (none of them is locked on its own, none written without it) and releases it last.
//! 5. A key not yet in the table is inserted under its shard's write lock (taken, with the
//!    others, in shard order) and removed again if the call ends up denied, before anyone else
//!    can see it: a denial leaves no trace, not even memory.
//!
//! A stack whose every plan has one limit (the usual stack) first tries a lean path with the
//! same locks in the same order: it reads each entry's one word without its lock and decides
//! it once, straight into the answer, then locks the entries (or takes the commit lock) and
//! writes them only if none changed since it read them. Its working arrays are as long as the
//! stack is deep (one to four layers; eight beyond), and hold each target's key, hash, shard
//! and plan apart, so a call stores little before its first locked instruction, each of which
//! waits for the stores before it. A call the lean path cannot finish as simply (a key to
//! insert, a plan to change, an entry another call changed) goes to steps 2–5 from the start,
//! with the targets the lean path found and a new answer.

use std::hash::Hash;
use std::ops::Deref;
use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};

use crossbeam_utils::CachePadded;
use limiter_core::{Clock, Decision, DefaultClock};
use limiter_store::table::{Shard, ShardReadGuard, ShardWriteGuard, ShardedTable};

use crate::cells::{Cells, Held, MAX_LIMITS_PER_LAYER, Snapshot};
use crate::decision::{Grant, MAX_LAYERS, StackDecision};
use crate::error::{BuildError, CallError, RefundError};
use crate::layer::{KeySource, Layer};
use crate::sync::EntryHasher;

/// Layers of limits over requests of type `R`, keyed layers keyed by `K`, decided as one
/// call: admitted only if every layer admits, and a denied call changes nothing.
///
/// Build one with [`Stack::builder`]. See the crate docs for an example.
pub struct Stack<R, K, C = DefaultClock> {
    layers: Box<[Layer<R, K>]>,
    /// One entry per global layer, by layer position (`None` for keyed layers).
    globals: Box<[Option<CachePadded<Cells>>]>,
    table: ShardedTable<Entry<K>, EntryHasher>,
    /// With `max_keys`: the most entries one shard holds (its share of the bound).
    per_shard: Option<usize>,
    max_keys: Option<usize>,
    clock: C,
    id: u64,
    /// Whether every plan of every layer has one limit (the lean path's stacks).
    lean: bool,
    /// The first global layer, whose entry lock is the stack's commit lock (see
    /// [`Stack::hold`]); `None` when every layer is keyed.
    commit_layer: Option<usize>,
}

/// A keyed layer's state for one key.
#[derive(Debug)]
pub(crate) struct Entry<K> {
    layer: u32,
    key: K,
    cells: Cells,
}

/// Builds a [`Stack`].
pub struct StackBuilder<R, K, C = DefaultClock> {
    layers: Vec<Layer<R, K>>,
    clock: C,
    shards: Option<usize>,
    max_keys: Option<usize>,
}

impl<R, K> Stack<R, K> {
    /// A builder with no layers, on a new [`DefaultClock`].
    pub fn builder() -> StackBuilder<R, K> {
        StackBuilder {
            layers: Vec::new(),
            clock: DefaultClock::new(),
            shards: None,
            max_keys: None,
        }
    }
}

impl<R, K, C> StackBuilder<R, K, C> {
    /// Adds a layer below those already added.
    pub fn layer(mut self, layer: Layer<R, K>) -> Self {
        self.layers.push(layer);
        self
    }

    /// Reads time from `clock` (a `ManualClock` in tests).
    pub fn clock<C2: Clock>(self, clock: C2) -> StackBuilder<R, K, C2> {
        StackBuilder {
            layers: self.layers,
            clock,
            shards: self.shards,
            max_keys: self.max_keys,
        }
    }

    /// Spreads keyed entries over `shards` shards (rounded up to a power of two; by default
    /// four per core).
    pub fn shards(mut self, shards: usize) -> Self {
        self.shards = Some(shards);
        self
    }

    /// Holds at most `max_keys` keyed entries (one per layer and key), each shard its share.
    /// A new key that finds its shard at its share, after the shard's full entries are
    /// dropped, is refused with [`CallError::Full`]: no held key is ever evicted, so no key's
    /// consumption is forgotten and nothing is admitted past a limit; the price is that new
    /// keys wait while every held key is still refilling. Without it the table is unbounded
    /// but still drops full entries as it grows.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The stack, or what is wrong with its layers.
    pub fn build(self) -> Result<Stack<R, K, C>, BuildError> {
        static IDS: StdAtomicU64 = StdAtomicU64::new(1);
        if self.layers.is_empty() {
            return Err(BuildError::NoLayers);
        }
        if self.layers.len() > MAX_LAYERS {
            return Err(BuildError::TooManyLayers {
                layers: self.layers.len(),
                max: MAX_LAYERS,
            });
        }
        for layer in &self.layers {
            layer.validate()?;
        }
        let globals: Box<[Option<CachePadded<Cells>>]> = self
            .layers
            .iter()
            .map(|layer| {
                layer
                    .is_global()
                    .then(|| CachePadded::new(Cells::new(fresh(layer, 0))))
            })
            .collect();
        if self.max_keys == Some(0) {
            return Err(BuildError::ZeroMaxKeys);
        }
        let mut shards = self
            .shards
            .unwrap_or_else(ShardedTable::<Entry<K>>::default_shards)
            .clamp(1, 4096)
            .next_power_of_two();
        if let Some(max) = self.max_keys {
            // No more shards than keys (a power of two at most `max`), so every shard's share
            // is at least one key and the shares together never exceed the bound.
            shards = shards.min(1 << max.ilog2());
        }
        let table = ShardedTable::with_shards_and_hasher(shards, EntryHasher::default());
        let per_shard = self.max_keys.map(|max| max / table.shards());
        let commit_layer = globals.iter().position(Option::is_some);
        let lean = self
            .layers
            .iter()
            .all(|layer| layer.plans.iter().all(|plan| plan.limits.len() == 1));
        Ok(Stack {
            layers: self.layers.into_boxed_slice(),
            globals,
            table,
            per_shard,
            max_keys: self.max_keys,
            clock: self.clock,
            // Relaxed: a unique number, ordering nothing.
            id: IDS.fetch_add(1, StdOrdering::Relaxed),
            lean,
            commit_layer,
        })
    }
}

/// Where one layer's state for a call lives.
enum Place<K> {
    Global,
    Keyed { key: K, hash: u64, shard: usize },
}

/// One layer's part in a call: its plan and where its state lives.
struct Target<K> {
    layer: usize,
    plan: usize,
    place: Place<K>,
}

type Targets<K> = [Option<Target<K>>; MAX_LAYERS];

/// A shard lock held during a call.
enum Guard<'a, K> {
    Read(ShardReadGuard<'a, Entry<K>>),
    Write(ShardWriteGuard<'a, Entry<K>>),
}

impl<K> Deref for Guard<'_, K> {
    type Target = Shard<Entry<K>>;
    fn deref(&self) -> &Self::Target {
        match self {
            Guard::Read(g) => g,
            Guard::Write(g) => g,
        }
    }
}

type Guards<'a, K> = [Option<Guard<'a, K>>; MAX_LAYERS];

/// The shards a call touches, ascending, with whether each needs its write lock.
struct ShardOrder<const N: usize = MAX_LAYERS> {
    shards: [usize; N],
    write: [bool; N],
    len: usize,
}

impl<const N: usize> ShardOrder<N> {
    fn new() -> Self {
        Self {
            shards: [0; N],
            write: [false; N],
            len: 0,
        }
    }

    /// Adds `shard` in its place, unless it is already there.
    fn insert(&mut self, shard: usize) {
        let len = self.len;
        if self.shards[..len].contains(&shard) {
            return;
        }
        // Insertion in order: at most `N` shards.
        let mut at = len;
        while at > 0 && self.shards[at - 1] > shard {
            self.shards[at] = self.shards[at - 1];
            at -= 1;
        }
        self.shards[at] = shard;
        self.len += 1;
    }

    /// The shards, ascending.
    fn shards(&self) -> impl Iterator<Item = usize> + '_ {
        self.shards[..self.len].iter().copied()
    }

    fn position(&self, shard: usize) -> usize {
        self.shards[..self.len]
            .iter()
            .position(|&s| s == shard)
            .unwrap_or(0)
    }
}

/// In [`LeanTargets::plans`]: the layer takes no part in the call (its keyer returned `None`).
const SKIPPED: usize = usize::MAX;
/// In [`LeanTargets::shards`]: the layer is global (or takes no part).
const GLOBAL: usize = usize::MAX;

/// A lean call's targets, by layer: what a [`Target`] holds, one array per field, so the lean
/// path writes no more than it reads before its first lock (each store before a locked
/// instruction delays it).
struct LeanTargets<K, const N: usize> {
    /// Each keyed layer's key (`None` for a global layer or one that takes no part).
    keys: [Option<K>; N],
    hashes: [u64; N],
    shards: [usize; N],
    plans: [usize; N],
}

impl<K, const N: usize> LeanTargets<K, N> {
    fn new() -> Self {
        Self {
            keys: [const { None }; N],
            hashes: [0; N],
            shards: [GLOBAL; N],
            plans: [SKIPPED; N],
        }
    }

    /// The same targets as the general path keeps them.
    fn into_targets(self, targets: &mut Targets<K>) {
        let Self {
            keys,
            hashes,
            shards,
            plans,
        } = self;
        for (layer, (key, ((hash, shard), plan))) in keys
            .into_iter()
            .zip(hashes.into_iter().zip(shards).zip(plans))
            .enumerate()
        {
            if plan == SKIPPED {
                continue;
            }
            let place = match key {
                Some(key) => Place::Keyed { key, hash, shard },
                None => Place::Global,
            };
            targets[layer] = Some(Target { layer, plan, place });
        }
    }
}

/// What deciding every layer gives: the answer, and the states to write.
struct Outcome {
    decision: StackDecision,
    /// Each layer's state: read into it, decided in place, written from it.
    next: [Option<Snapshot>; MAX_LAYERS],
}

/// One call's working state. It is built once per call and filled in place, never moved or
/// returned: its arrays are large enough that copying them cost more than deciding did.
struct Call<K> {
    targets: Targets<K>,
    order: ShardOrder,
    /// Each present entry's state when first read (`None`: an absent key or a skipped layer).
    seen: [Option<Snapshot>; MAX_LAYERS],
    outcome: Outcome,
}

impl<K> Call<K> {
    fn new() -> Self {
        Self {
            targets: Default::default(),
            order: ShardOrder::new(),
            seen: [None; MAX_LAYERS],
            outcome: Outcome {
                decision: StackDecision::new(),
                next: [None; MAX_LAYERS],
            },
        }
    }
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
        let grant = (decision.is_allowed() && cost > 0).then_some(Grant {
            stack: self.id,
            taken: cost,
            left: cost,
            at: now,
        });
        Ok((decision, grant))
    }

    /// The answer for `cost` units of `request` at `now`, built where the caller keeps it.
    #[inline]
    fn decide(&self, request: &R, cost: u64, now: u64) -> Result<StackDecision, CallError> {
        let mut decision = StackDecision::new();
        self.decide_into(request, cost, now, &mut decision)?;
        Ok(decision)
    }

    /// Decides `cost` units for `request` at `now` into `decision` (new): a lean stack on the
    /// lean path, with working arrays as long as the stack is deep; any other stack, and any
    /// call the lean path cannot finish, on the general path.
    fn decide_into(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        decision: &mut StackDecision,
    ) -> Result<(), CallError> {
        if self.lean {
            return match self.layers.len() {
                1 => self.decide_sized::<1>(request, cost, now, decision),
                2 => self.decide_sized::<2>(request, cost, now, decision),
                3 => self.decide_sized::<3>(request, cost, now, decision),
                4 => self.decide_sized::<4>(request, cost, now, decision),
                _ => self.decide_sized::<MAX_LAYERS>(request, cost, now, decision),
            };
        }
        let mut call = Call::new();
        self.prepare(request, &mut call)?;
        self.decide_general(&mut call, cost, now)?;
        *decision = call.outcome.decision;
        Ok(())
    }

    /// Decides a call of a lean stack of at most `N` layers on the lean path or, if it cannot
    /// finish there, on the general path with the targets it found (keyers and plan functions
    /// run once per call).
    #[inline(always)]
    fn decide_sized<const N: usize>(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        decision: &mut StackDecision,
    ) -> Result<(), CallError> {
        let mut targets = LeanTargets::<K, N>::new();
        self.fill_lean(request, &mut targets)?;
        if self.decide_lean(&targets, cost, now, decision)? {
            return Ok(());
        }
        let mut call = Call::new();
        targets.into_targets(&mut call.targets);
        fill_shard_order(&call.targets[..self.layers.len()], &mut call.order);
        self.decide_general(&mut call, cost, now)?;
        *decision = call.outcome.decision;
        Ok(())
    }

    /// Decides `call` (targets and shard order filled, the rest fresh) on the general path,
    /// leaving the answer in `call.outcome.decision`.
    fn decide_general(&self, call: &mut Call<K>, cost: u64, now: u64) -> Result<(), CallError> {
        if self.decide_present(call, cost, now)? {
            return Ok(());
        }
        self.decide_inserting(call, cost, now)
    }

    /// Each layer's key, hash, shard and plan for `request`, as
    /// [`fill_targets`](Self::fill_targets) finds them, into `targets` (new).
    #[inline(always)]
    fn fill_lean<const N: usize>(
        &self,
        request: &R,
        targets: &mut LeanTargets<K, N>,
    ) -> Result<(), CallError> {
        for (index, layer) in self.layers.iter().enumerate().take(N) {
            if let KeySource::Keyed(keyer) = &layer.keyer {
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
    /// decided once, straight into its slot of `decision` (new), before any entry is locked; if
    /// every layer admits, the entries are held ([`commit_lean`](Self::commit_lean)) and
    /// written only if none changed since it was read. Returns `false`, having changed no
    /// entry, when the call needs more (a key to insert, a plan to change, an entry another
    /// call changed): the general path then decides it from the start, into a new answer.
    #[inline(always)]
    fn decide_lean<const N: usize>(
        &self,
        targets: &LeanTargets<K, N>,
        cost: u64,
        now: u64,
        decision: &mut StackDecision,
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
        // Each layer's word as read, and as the call would leave it.
        let mut seen = [0_u64; N];
        let mut next = [0_u64; N];
        for slot in 0..N {
            let plan = targets.plans[slot];
            if plan == SKIPPED {
                continue;
            }
            let shard = targets.shards[slot];
            let cell = if shard == GLOBAL {
                self.globals[slot].as_deref()
            } else {
                guards[order.position(shard)]
                    .as_ref()
                    .and_then(|g| {
                        g.find(targets.hashes[slot], |e| {
                            e.layer as usize == slot && Some(&e.key) == targets.keys[slot].as_ref()
                        })
                    })
                    .map(|e| &e.cells)
            };
            let Some(cell) = cell else {
                return Ok(false);
            };
            let (read_plan, word) = cell.read_first();
            if read_plan != plan {
                return Ok(false);
            }
            cells[slot] = Some(cell);
            seen[slot] = word;
            let layer = &self.layers[slot];
            let algorithm = &layer.plans[plan].limits[0];
            let mut after = word;
            let decided = decision.push_one(slot, slot, plan, |answer| {
                algorithm
                    .decide_word(word, cost, now, answer)
                    .map(|next| after = next)
                    .ok_or(())
            });
            match decided {
                Ok(()) => next[slot] = after,
                Err(()) => {
                    let mut answer = Decision::allow(0, 0, 0);
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
        if decision.is_allowed()
            && cost > 0
            && !self.commit_lean(&cells, &targets.plans, &seen, &next)
        {
            return Ok(false);
        }
        drop(guards);
        Ok(true)
    }

    /// Writes a lean call's `next` words into its `cells` (by slot; `plans` and `seen` what each
    /// was decided under and on) if none changed since it was read; whether it did. Under the
    /// commit lock where the stack has one (see [`hold`](Self::hold)), else with each entry
    /// locked in address order.
    #[inline(always)]
    fn commit_lean<const N: usize>(
        &self,
        cells: &[Option<&Cells>; N],
        plans: &[usize; N],
        seen: &[u64; N],
        next: &[u64; N],
    ) -> bool {
        let Some(commit) = self.commit_layer else {
            let mut held = lock_in_address_order(cells, N);
            let mut unchanged = true;
            for slot in 0..N {
                if let (Some(cell), Some(held)) = (cells[slot], &held[slot]) {
                    unchanged &= cell.first_still(held, plans[slot], seen[slot]);
                }
            }
            for slot in 0..N {
                if let (Some(cell), Some(held)) = (cells[slot], held[slot].take()) {
                    if unchanged {
                        cell.write_first_and_unlock(held, next[slot]);
                    } else {
                        cell.unlock(held);
                    }
                }
            }
            return unchanged;
        };
        // The commit layer is global: it takes part in every call, so its slot holds its entry
        // (were it ever empty, the general path would decide the call).
        let Some(lock) = cells.get(commit).copied().flatten() else {
            return false;
        };
        let held = lock.lock();
        let mut unchanged = lock.first_still(&held, plans[commit], seen[commit]);
        for slot in 0..N {
            if let (false, Some(cell)) = (slot == commit, cells[slot]) {
                unchanged &= cell.first_still_under_commit_lock(plans[slot], seen[slot]);
            }
        }
        if unchanged {
            for slot in 0..N {
                if let (false, Some(cell)) = (slot == commit, cells[slot]) {
                    cell.write_first_under_commit_lock(next[slot]);
                }
            }
            lock.write_first_and_unlock(held, next[commit]);
        } else {
            lock.unlock(held);
        }
        unchanged
    }

    /// Decides under shard read locks, as every call whose keys are all held ends. Returns
    /// `false`, with the shards of the absent keys marked for writing, when the call admits
    /// and needs a key inserted.
    fn decide_present(&self, call: &mut Call<K>, cost: u64, now: u64) -> Result<bool, CallError> {
        let mut guards: Guards<'_, K> = [const { None }; MAX_LAYERS];
        self.lock_shards(&call.order, &mut guards);
        let mut cells = [None; MAX_LAYERS];
        self.find(&call.targets, &call.order, &guards, &mut cells);
        self.read_all(&cells, &mut call.seen, &mut call.outcome.next);
        self.decide_all(&call.targets, cost, now, &mut call.outcome)?;
        if call.outcome.decision.is_denied() || cost == 0 {
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
    fn decide_inserting(&self, call: &mut Call<K>, cost: u64, now: u64) -> Result<(), CallError> {
        let Call {
            targets,
            order,
            seen,
            outcome,
        } = call;
        loop {
            let mut guards: Guards<'_, K> = [const { None }; MAX_LAYERS];
            self.lock_shards(order, &mut guards);
            let mut inserted = [false; MAX_LAYERS];
            let mut retry = false;
            let mut full = None;
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
                    retry = true;
                    break;
                };
                let entry = Entry {
                    layer: *layer as u32,
                    key: key.clone(),
                    cells: Cells::new(fresh(&self.layers[*layer], *plan)),
                };
                // The entries this call inserted are fresh, so full: the sweep an insert may
                // run must spare them, or a second insert could drop the first.
                let ours = |e: &Entry<K>| {
                    targets.iter().zip(&inserted).any(|(t, &mine)| {
                        mine && t.as_ref().is_some_and(|t| {
                            t.layer == e.layer as usize
                                && matches!(&t.place, Place::Keyed { key, .. } if *key == e.key)
                        })
                    })
                };
                if let Some(share) = self.per_shard
                    && shard.len() >= share
                {
                    shard.sweep(|e| !ours(e) && self.entry_is_full(e, now));
                    if shard.len() >= share {
                        full = Some(*layer);
                        break;
                    }
                }
                shard.insert(
                    *hash,
                    entry,
                    |e| !ours(e) && self.entry_is_full(e, now),
                    |e| self.table.hash_one((e.layer, &e.key)),
                );
                inserted[slot] = true;
            }
            if retry {
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
                self.read_all(&cells, seen, &mut outcome.next);
                outcome.decision = StackDecision::new();
                self.decide_all(targets, cost, now, outcome)
                    .and_then(|()| self.commit(targets, &cells, seen, outcome, cost, now))
            };
            let admitted = result.is_ok() && outcome.decision.is_allowed();
            if !admitted {
                // Nobody else has seen the new entries (their shards are write-locked): take
                // them out again, so a denial leaves nothing behind.
                for (slot, target) in targets.iter().enumerate() {
                    if let (
                        true,
                        Some(Target {
                            layer,
                            place: Place::Keyed { key, hash, shard },
                            ..
                        }),
                    ) = (inserted[slot], target)
                        && let Some(Guard::Write(g)) = &mut guards[order.position(*shard)]
                    {
                        g.remove(*hash, |e| e.layer as usize == *layer && e.key == *key);
                    }
                }
            }
            return result;
        }
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
        let now = self.clock.now();
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
            let limits = &self.layers[target.layer].plans[snapshot.plan].limits;
            for (word, algorithm) in snapshot.words.iter_mut().zip(limits) {
                if let Some(back) = algorithm.refund(*word, units, grant.at, now) {
                    *word = back;
                }
            }
            cell.write_and_unlock(held, &snapshot);
        }
        grant.left -= units;
        Ok(())
    }

    /// Drops every keyed entry whose limits are all full now (they decide exactly like absent
    /// keys), returning how many. The table also does this on its own as keys arrive.
    pub fn reclaim_full(&self) -> u64 {
        let now = self.clock.now();
        self.table.reclaim(
            |e| self.entry_is_full(e, now),
            |e| self.table.hash_one((e.layer, &e.key)),
        )
    }

    /// Keyed entries held (one per layer and key), full ones not yet reclaimed included.
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

    /// The name of layer `index`, for headers and metrics.
    pub fn layer_name(&self, index: usize) -> Option<&str> {
        self.layers.get(index).map(Layer::name)
    }

    /// The clock the stack reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// Fills a fresh `call`'s targets and shard order for `request`.
    fn prepare(&self, request: &R, call: &mut Call<K>) -> Result<(), CallError> {
        self.fill_targets(request, &mut call.targets)?;
        fill_shard_order(&call.targets[..self.layers.len()], &mut call.order);
        Ok(())
    }

    /// Each layer's key, hash, shard and plan for `request`, written into `targets` (all
    /// `None` on entry).
    fn fill_targets(&self, request: &R, targets: &mut Targets<K>) -> Result<(), CallError> {
        for (index, layer) in self.layers.iter().enumerate() {
            let place = match &layer.keyer {
                KeySource::Global => Place::Global,
                KeySource::Keyed(keyer) => {
                    let Some(key) = keyer.key(request) else {
                        continue;
                    };
                    let hash = self.table.hash_one((index as u32, &key));
                    let shard = self.table.shard_index(hash);
                    Place::Keyed { key, hash, shard }
                }
            };
            let plan = layer.plan_for(request)?;
            targets[index] = Some(Target {
                layer: index,
                plan,
                place,
            });
        }
        Ok(())
    }

    /// Locks the shards in ascending order, write locks where `order` asks for them.
    fn lock_shards<'s>(&'s self, order: &ShardOrder, guards: &mut Guards<'s, K>) {
        for (position, guard) in guards[..order.len].iter_mut().enumerate() {
            let shard = order.shards[position];
            *guard = Some(if order.write[position] {
                Guard::Write(self.table.write(shard))
            } else {
                Guard::Read(self.table.read(shard))
            });
        }
    }

    /// Each target's entry, under the guards, into `cells`; `None` for a key not in the table.
    fn find<'g>(
        &'g self,
        targets: &Targets<K>,
        order: &ShardOrder,
        guards: &'g Guards<'_, K>,
        cells: &mut [Option<&'g Cells>; MAX_LAYERS],
    ) {
        for (cell, target) in cells.iter_mut().zip(&targets[..self.layers.len()]) {
            let Some(target) = target else { continue };
            *cell = match &target.place {
                Place::Global => self.globals[target.layer].as_deref(),
                Place::Keyed { key, hash, shard } => guards[order.position(*shard)]
                    .as_ref()
                    .and_then(|g| {
                        g.find(*hash, |e| e.layer as usize == target.layer && e.key == *key)
                    })
                    .map(|e| &e.cells),
            };
        }
    }

    /// Decides every target on its state in `out.next` (`None` there: an absent key, which
    /// starts fresh under the chosen plan), in place, leaving there the state to write, and
    /// carrying a key's consumption over to the chosen plan when it changed. Adds each layer's
    /// answer to `out.decision` (new, or reset by the caller).
    ///
    /// The states are read straight into `out.next` and each answer is decided straight into
    /// its place in `out.decision`: copying a just-written struct as a whole stalls the copy
    /// until the writes land, which cost more than the deciding.
    fn decide_all(
        &self,
        targets: &Targets<K>,
        cost: u64,
        now: u64,
        out: &mut Outcome,
    ) -> Result<(), CallError> {
        for (slot, target) in targets[..self.layers.len()].iter().enumerate() {
            let Some(target) = target else { continue };
            let layer = &self.layers[target.layer];
            let limits = &layer.plans[target.plan].limits;
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
                let old = &layer.plans[state.plan].limits;
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
            if let [algorithm] = limits.as_slice() {
                // One limit, the usual layer: its answer is the layer's, decided in place.
                out.decision
                    .push_one(slot, target.layer, target.plan, |decision| {
                        algorithm.decide(&mut state.words[0], cost, now, decision)
                    })
                    .map_err(error(0))?;
                continue;
            }
            let mut parts = [Decision::allow(0, 0, 0); MAX_LIMITS_PER_LAYER];
            for (j, (algorithm, (word, part))) in limits
                .iter()
                .zip(state.words.iter_mut().zip(&mut parts))
                .enumerate()
            {
                algorithm.decide(word, cost, now, part).map_err(error(j))?;
            }
            out.decision
                .push_limits(slot, target.layer, target.plan, &parts[..limits.len()]);
        }
        Ok(())
    }

    /// Each present entry's state, read without its lock, into `seen` (to check at commit)
    /// and into `next` (to decide in place); `None` in both for an absent key.
    fn read_all(
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

    /// Locks every entry, decides again if any changed since `snapshots`, and writes the
    /// states if every layer still admits.
    fn commit(
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
            outcome.decision = StackDecision::new();
            self.decide_all(targets, cost, now, outcome)
        } else {
            Ok(())
        };
        let write = decided.is_ok() && outcome.decision.is_allowed();
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
    /// instruction instead of one per layer. A stack of keyed layers alone locks each entry,
    /// in ascending address order. Release the holds in [`release_order`](Self::release_order).
    fn hold<'c, const N: usize>(
        &'c self,
        cells: &mut [Option<&'c Cells>; N],
        layers: usize,
    ) -> [Option<Held>; N] {
        let commit = self
            .commit_layer
            .and_then(|slot| Some((slot, self.globals.get(slot)?.as_deref()?)));
        let Some((commit, lock)) = commit.filter(|&(slot, _)| slot < layers) else {
            return lock_in_address_order(cells, layers);
        };
        // A global layer takes part in every call, so its slot holds this entry already.
        cells[commit] = Some(lock);
        let mut held: [Option<Held>; N] = [const { None }; N];
        held[commit] = Some(lock.lock());
        for (slot, (cell, held)) in cells[..layers].iter().zip(&mut held).enumerate() {
            if let (false, Some(cell)) = (slot == commit, cell) {
                *held = Some(cell.hold_under_commit_lock());
            }
        }
        held
    }

    /// The first `layers` slots in the order their holds are released: the commit layer's last,
    /// so the writes made under the commit lock are all published when it is let go.
    #[inline]
    fn release_order(&self, layers: usize) -> impl Iterator<Item = usize> + use<R, K, C> {
        let commit = self.commit_layer.filter(|&slot| slot < layers);
        (0..layers)
            .filter(move |&slot| Some(slot) != commit)
            .chain(commit)
    }

    /// Whether every limit of `entry` is full at `now` under the plan it was written with.
    fn entry_is_full(&self, entry: &Entry<K>, now: u64) -> bool {
        let state = entry.cells.read();
        self.layers[entry.layer as usize].plans[state.plan]
            .limits
            .iter()
            .zip(state.words)
            .all(|(algorithm, word)| algorithm.is_full(word, now))
    }
}

/// The shards `targets` fall in, ascending and once each, into `order` (empty on entry).
fn fill_shard_order<K>(targets: &[Option<Target<K>>], order: &mut ShardOrder) {
    for target in targets.iter().flatten() {
        if let Place::Keyed { shard, .. } = target.place {
            order.insert(shard);
        }
    }
}

/// Locks the present entries in ascending address order, returning each one's hold by slot.
fn lock_in_address_order<const N: usize>(
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

/// The fresh state of `layer` under plan `plan`.
fn fresh<R, K>(layer: &Layer<R, K>, plan: usize) -> Snapshot {
    let mut words = [0; MAX_LIMITS_PER_LAYER];
    for (word, algorithm) in words.iter_mut().zip(&layer.plans[plan].limits) {
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

impl<R, K, C: std::fmt::Debug> std::fmt::Debug for StackBuilder<R, K, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StackBuilder")
            .field("layers", &self.layers)
            .field("clock", &self.clock)
            .finish_non_exhaustive()
    }
}
