//! [`StackBuilder`]: the layers, clock, shards and bound of a [`Stack`], checked once, and
//! which of the decide paths (see the parent module) its calls take, found once at build.

use std::sync::atomic::{AtomicU64 as StdAtomicU64, Ordering as StdOrdering};

use crossbeam_utils::CachePadded;
use limiter_core::{Clock, DefaultClock};
use limiter_store::table::ShardedTable;

use super::groups::group_members;
use super::{Entry, Stack, chosen, fixed_plans, fresh};
use crate::cells::Cells;
use crate::decision::MAX_LAYERS;
use crate::error::BuildError;
use crate::layer::Layer;
use crate::sync::{AtomicU64, EntryHasher};

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

    /// Adds `layers` in order: one definition, which limiter-redis's
    /// `RedisStackBuilder::layers` also takes, to decide the same stack on Redis.
    pub fn layers(self, layers: impl IntoIterator<Item = Layer<R, K>>) -> Self {
        layers.into_iter().fold(self, Self::layer)
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

    /// Holds at most `max_keys` keyed entries (one per layer and key), exactly: new keys are
    /// admitted until the stack holds `max_keys` entries that are not full; then a new key is
    /// refused with [`CallError::Full`](crate::CallError::Full) (after every full entry, in
    /// any shard, is dropped to make room). No held key is ever evicted, so no key's consumption is forgotten and
    /// nothing is admitted past a limit; the price is that new keys wait while every held key
    /// is still refilling. Without it the table is unbounded but still drops full entries as
    /// it grows.
    pub fn max_keys(mut self, max_keys: usize) -> Self {
        self.max_keys = Some(max_keys);
        self
    }

    /// The stack, or what is wrong with its layers (a calendar limit, which turns readings
    /// into Unix time, is refused on a clock that does not keep the wall clock's rate, the
    /// default clock on the time-stamp counter among them: [`BuildError::CalendarClock`]).
    pub fn build(self) -> Result<Stack<R, K, C>, BuildError>
    where
        C: Clock,
    {
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
        let wall_rate = self.clock.keeps_wall_rate();
        for layer in &self.layers {
            layer.validate()?;
            layer.check_clock(wall_rate)?;
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
        let shards = self
            .shards
            .unwrap_or_else(ShardedTable::<Entry<K>>::default_shards)
            .clamp(1, 4096)
            .next_power_of_two();
        let table = ShardedTable::with_shards_and_hasher(shards, EntryHasher::default());
        let commit_layer = globals.iter().position(Option::is_some);
        let lean = self.layers.iter().all(|layer| layer.limits_per_plan() == 1);
        let members = group_members(&self.layers);
        let leads: Vec<usize> = members.iter().map(|m| m.lead).collect();
        let chosen_plans = chosen::chosen_plans(&self.layers);
        let layer_count = self.layers.len();
        let fixed_path = fixed_plans::fits(&self.layers) && chosen_plans == 0;
        let chosen_path = fixed_plans::fits(&self.layers) && chosen_plans != 0;
        let several_keys = fixed_plans::several_keys(&self.layers, &leads);
        let one_key = fixed_plans::first_keyed_lead(&self.layers, &leads);
        let lone_lock = commit_layer.or(one_key.filter(|_| !several_keys));
        Ok(Stack {
            layers: self.layers.into_boxed_slice(),
            globals,
            table,
            held: AtomicU64::new(0),
            max_keys: self.max_keys,
            clock: self.clock,
            // Relaxed: a unique number, ordering nothing.
            id: IDS.fetch_add(1, StdOrdering::Relaxed),
            lean,
            commit_layer,
            members,
            fixed_path,
            chosen_path,
            chosen_plans,
            chosen_arm: chosen::chosen_arm(layer_count, lean, several_keys),
            lone_lock,
            one_key,
            several_keys,
        })
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
