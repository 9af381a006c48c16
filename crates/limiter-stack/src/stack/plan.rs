//! Planning a call: each layer's target (its plan, and where its state lives: a global entry,
//! or a key with its hash and shard), the shards a call touches in ascending order, and the
//! working state one call fills in place.

use std::hash::Hash;
use std::ops::Deref;

use limiter_core::Clock;
use limiter_store::table::{Shard, ShardReadGuard, ShardWriteGuard};

use super::{Entry, Member, Stack};
use crate::cells::Snapshot;
use crate::decision::{LayerAnswers, LayerDecision, MAX_LAYERS, StackDecision};
use crate::error::CallError;
use crate::layer::KeySource;

/// Where one layer's state for a call lives.
pub(super) enum Place<K> {
    Global,
    /// In the entry of `key`, which this layer leads (see [`Member`]).
    Keyed {
        key: K,
        hash: u64,
        shard: usize,
    },
    /// In the entry the layer `lead` finds, at `position`: the layer shares its keyer.
    InGroup {
        lead: usize,
        position: usize,
    },
}

/// One layer's part in a call: its plan and where its state lives.
pub(super) struct Target<K> {
    pub(super) layer: usize,
    pub(super) plan: usize,
    pub(super) place: Place<K>,
}

pub(super) type Targets<K> = [Option<Target<K>>; MAX_LAYERS];

/// A shard lock held during a call.
pub(super) enum Guard<'a, K> {
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

pub(super) type Guards<'a, K> = [Option<Guard<'a, K>>; MAX_LAYERS];

/// The shards a call touches, ascending, with whether each needs its write lock.
pub(super) struct ShardOrder<const N: usize = MAX_LAYERS> {
    pub(super) shards: [usize; N],
    pub(super) write: [bool; N],
    pub(super) len: usize,
}

impl<const N: usize> ShardOrder<N> {
    #[inline]
    pub(super) fn new() -> Self {
        Self {
            shards: [0; N],
            write: [false; N],
            len: 0,
        }
    }

    /// Adds `shard` in its place, unless it is already there.
    #[inline]
    pub(super) fn insert(&mut self, shard: usize) {
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
    #[inline]
    pub(super) fn shards(&self) -> impl Iterator<Item = usize> + '_ {
        self.shards[..self.len].iter().copied()
    }

    #[inline]
    pub(super) fn position(&self, shard: usize) -> usize {
        self.shards[..self.len]
            .iter()
            .position(|&s| s == shard)
            .unwrap_or(0)
    }
}

/// In [`LeanTargets::plans`]: the layer takes no part in the call (its keyer returned `None`).
pub(super) const SKIPPED: usize = usize::MAX;
/// In [`LeanTargets::shards`]: the layer is global (or takes no part).
pub(super) const GLOBAL: usize = usize::MAX;

/// A lean call's targets, by layer: what a [`Target`] holds, one array per field, so the lean
/// path writes no more than it reads before its first lock (each store before a locked
/// instruction delays it).
pub(super) struct LeanTargets<K, const N: usize> {
    /// Each keyed layer's key (`None` for a global layer or one that takes no part).
    pub(super) keys: [Option<K>; N],
    pub(super) hashes: [u64; N],
    pub(super) shards: [usize; N],
    pub(super) plans: [usize; N],
}

impl<K, const N: usize> LeanTargets<K, N> {
    #[inline]
    pub(super) fn new() -> Self {
        Self {
            keys: [const { None }; N],
            hashes: [0; N],
            shards: [GLOBAL; N],
            plans: [SKIPPED; N],
        }
    }

    /// The same targets as the general path keeps them (`members`: each layer's group).
    #[inline]
    pub(super) fn into_targets(self, members: &[Member], targets: &mut Targets<K>) {
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
            let place = match (key, members.get(layer)) {
                (_, Some(&Member { lead, position })) if lead != layer => {
                    Place::InGroup { lead, position }
                }
                (Some(key), _) => Place::Keyed { key, hash, shard },
                (None, _) => Place::Global,
            };
            targets[layer] = Some(Target { layer, plan, place });
        }
    }
}

/// What deciding every layer gives: the answer, and the states to write.
pub(super) struct Outcome {
    /// The compact answer.
    pub(super) decision: StackDecision,
    /// Each layer's answer (the general path keeps them all: it is the slow path).
    pub(super) layers: LayerAnswers,
    /// Each layer's state: read into it, decided in place, written from it.
    pub(super) next: [Option<Snapshot>; MAX_LAYERS],
    /// Whether the call records usage that already happened: every layer is debited, and the
    /// states are written whatever the answer (see [`Stack::record`]).
    pub(super) record: bool,
}

impl Outcome {
    /// Whether the decided states are to be written: an admission of a positive cost, or any
    /// record of one.
    #[inline]
    pub(super) fn writes(&self, cost: u64) -> bool {
        cost > 0 && (self.record || self.decision.is_allowed())
    }

    /// Takes layer `layer`'s answer into both forms.
    #[inline]
    pub(super) fn take(&mut self, layer: LayerDecision) {
        self.decision.push(layer);
        self.layers.set(layer);
    }

    /// Forgets every answer taken, for a call decided again.
    #[inline]
    pub(super) fn restart(&mut self) {
        self.decision = StackDecision::new();
        self.layers.clear();
    }
}

/// One call's working state. It is built once per call and filled in place, never moved or
/// returned: its arrays are large enough that copying them cost more than deciding did.
pub(super) struct Call<K> {
    pub(super) targets: Targets<K>,
    pub(super) order: ShardOrder,
    /// Each present entry's state when first read (`None`: an absent key or a skipped layer).
    pub(super) seen: [Option<Snapshot>; MAX_LAYERS],
    pub(super) outcome: Outcome,
}

impl<K> Call<K> {
    #[inline]
    pub(super) fn new() -> Self {
        Self {
            targets: Default::default(),
            order: ShardOrder::new(),
            seen: [None; MAX_LAYERS],
            outcome: Outcome {
                decision: StackDecision::new(),
                layers: LayerAnswers::new(),
                next: [None; MAX_LAYERS],
                record: false,
            },
        }
    }
}

impl<R, K, C> Stack<R, K, C>
where
    K: Hash + Eq + Clone,
    C: Clock,
{
    /// Fills a fresh `call`'s targets and shard order for `request`.
    #[inline]
    pub(super) fn prepare(&self, request: &R, call: &mut Call<K>) -> Result<(), CallError> {
        self.fill_targets(request, &mut call.targets)?;
        fill_shard_order(&call.targets[..self.layers.len()], &mut call.order);
        Ok(())
    }

    /// Each layer's key, hash, shard and plan for `request`, written into `targets` (all
    /// `None` on entry).
    #[inline]
    pub(super) fn fill_targets(
        &self,
        request: &R,
        targets: &mut Targets<K>,
    ) -> Result<(), CallError> {
        for (index, layer) in self.layers.iter().enumerate() {
            let Member { lead, position } = self.members[index];
            let place = match &layer.keyer {
                // The lead came first: this layer takes part exactly when it does.
                KeySource::Keyed(_) if lead != index => {
                    if targets[lead].is_none() {
                        continue;
                    }
                    Place::InGroup { lead, position }
                }
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
}

/// The shards `targets` fall in, ascending and once each, into `order` (empty on entry).
#[inline]
pub(super) fn fill_shard_order<K>(targets: &[Option<Target<K>>], order: &mut ShardOrder) {
    for target in targets.iter().flatten() {
        if let Place::Keyed { shard, .. } = target.place {
            order.insert(shard);
        }
    }
}
