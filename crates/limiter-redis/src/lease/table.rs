//! The table of leased keys: one entry per call identity (its [`LeaseCell`], what the last
//! answer knew of each layer, and the renewal lock), sharded, and the answers a spend from
//! the lease gives locally ([`LocalAnswer`]).

use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use hashbrown::HashTable;
use limiter_core::{Clock, Decision, LeaseCell, LeaseSpend};
use limiter_stack::{LayerAnswers, LayerDecision, MAX_LAYERS};

use limiter_stack::Origin;

use crate::decision::{Answered, RedisDecision};
use crate::stack::{Prepared, RedisStack};

use super::*;

/// One key's lease here.
pub(super) struct Entry {
    pub(super) cell: LeaseCell,
    /// The layers the key's calls touch, with each one's least burst (what local answers say).
    pub(super) layers: Touched,
    /// What the last Redis answer said of the key's budget (what local answers report).
    pub(super) known: Known,
    /// The word the previous idle sweep saw (the sweep's alone).
    pub(super) seen: AtomicU64,
    /// Units left below which a spend asks for the next lease ahead (half the last lease; 0
    /// once asked, until the next lease: one ask per lease).
    pub(super) low_water: AtomicU64,
    pub(super) renewal: tokio::sync::Mutex<Meta>,
}

impl Entry {
    /// The lease `granted` units ago: a spend leaving less than half of them asks for the
    /// next ahead (half a lease is spent while the call is out: a hot key's lease, sized to
    /// half a time to live of its demand, or the slack, lasts many round trips).
    pub(super) fn granted(&self, granted: u64) {
        // Relaxed: a hint read by spends, ordered with nothing (a stale one asks a little
        // early or late; the renewal itself is under the renewal lock).
        self.low_water.store(granted / 2, Ordering::Relaxed);
    }
}

/// What the one renewing caller knows (under the entry's renewal lock).
pub(super) struct Meta {
    /// The call's keys, for hand-backs that come without a request.
    pub(super) call: Prepared,
    /// The lease's field in each ledger: this stack's holder name and the key's identity.
    pub(super) field: String,
    /// Units the last lease asked for.
    pub(super) want: u64,
    /// Units of the lease now held, and when it was asked for (local ns).
    pub(super) granted: u64,
    pub(super) granted_at: u64,
    /// The entry left the table: renew through the one that replaced it.
    pub(super) removed: bool,
}

impl Meta {
    /// The units to ask for next: about half a time to live of the demand the last lease
    /// saw, within 1 and `most`.
    pub(super) fn next_want(&mut self, refunded: u64, now: u64, ttl: u64, most: u64) -> u64 {
        if self.granted > 0 {
            let used = u128::from(self.granted.saturating_sub(refunded));
            let elapsed = u128::from(now.saturating_sub(self.granted_at).max(1));
            let want = used * u128::from(ttl / 2) / elapsed;
            self.want = u64::try_from(want).unwrap_or(u64::MAX);
        }
        self.want = self.want.clamp(1, most.max(1));
        self.want
    }
}

/// What the last Redis answer on a key said, per layer: the units left once it took the call
/// and the lease, and when the layer is full again (ns of the local clock); with when it was
/// sent (local ns) and decided (Redis's µs). A local answer reports the key's budget from it:
/// what Redis had left, plus what the lease still holds, and the same reset instant (the
/// lease's units were taken from Redis's state already, so spending them moves neither).
///
/// Written by the one renewing caller before it grants or denies, read by local answers after
/// they spend: a reader racing a renewal may pair the new lease with the old answer for a
/// moment. It is what the answer reports, never what decides it.
#[derive(Debug, Default)]
pub(super) struct Known {
    pub(super) at_local: AtomicU64,
    pub(super) at_redis_us: AtomicU64,
    pub(super) remaining: [AtomicU64; MAX_LAYERS],
    pub(super) full_at: [AtomicU64; MAX_LAYERS],
}

impl Known {
    /// Keeps what `decision` (Redis's answer, sent at `sent_at` local ns) says of each layer.
    pub(super) fn update(&self, decision: &RedisDecision, sent_at: u64) {
        // Relaxed (every store and load of `Known`): display values, published by nothing
        // and publishing nothing (see the type's docs).
        self.at_local.store(sent_at, Ordering::Relaxed);
        let at_us = decision.decided_at_micros().unwrap_or(0);
        self.at_redis_us.store(at_us, Ordering::Relaxed);
        for layer in decision.layers().iter() {
            if let (Some(remaining), Some(full_at)) = (
                self.remaining.get(layer.layer),
                self.full_at.get(layer.layer),
            ) {
                // Relaxed: display only, as a local answer reads it.
                remaining.store(layer.decision.remaining(), Ordering::Relaxed);
                let reset = layer.decision.reset_after_nanos();
                full_at.store(sent_at.saturating_add(reset), Ordering::Relaxed);
            }
        }
    }
}

/// One shard of the local table: entries found by the identity's hash (computed once per
/// call, for the shard and the lookup).
pub(super) type Shard = crossbeam_utils::CachePadded<RwLock<HashTable<(Box<str>, Arc<Entry>)>>>;

pub(super) struct Shared<R> {
    pub(super) stack: RedisStack<R>,
    pub(super) lease: Lease,
    /// This stack's name in the ledgers: unique per process and stack.
    pub(super) holder: String,
    /// Per layer, per limit: the slack in units.
    pub(super) slack: Vec<Vec<u64>>,
    /// The most one lease asks for: the least slack, within what a lease word holds.
    pub(super) most: u64,
    pub(super) least_burst: u64,
    pub(super) shards: Box<[Shard]>,
    pub(super) hasher: foldhash::fast::RandomState,
    /// The backend's local clock, kept here to save a pointer chase on the hot path.
    pub(super) clock: Arc<dyn Clock>,
    /// Where spends send a key whose lease runs low, for the next to be taken ahead (outside
    /// a tokio runtime no task receives: the caller that finds the lease empty renews it).
    pub(super) ahead: tokio::sync::mpsc::UnboundedSender<Arc<Entry>>,
    pub(super) renewals: AtomicU64,
    pub(super) leased: AtomicU64,
    pub(super) refunded: AtomicU64,
}

impl<R> LeasedStack<R> {
    /// The identity's hash and its shard.
    #[inline]
    pub(super) fn shard(&self, identity: &str) -> (u64, &Shard) {
        let hash = self.shared.hasher.hash_one(identity);
        let shards = &self.shared.shards;
        // A power of two: the mask keeps the index in range. The middle bits pick the shard;
        // the table uses the top and low bits.
        (hash, &shards[(hash >> 32) as usize & (shards.len() - 1)])
    }

    /// The answer of the lease `identity` holds here, if it decides a call of `cost`.
    #[inline]
    pub(crate) fn local<T>(
        &self,
        identity: &str,
        cost: u64,
        answer: impl FnOnce(&LocalAnswer<'_>) -> T,
    ) -> Option<T> {
        let shared = &*self.shared;
        if cost > shared.least_burst || shared.most == 0 {
            return None;
        }
        let now = shared.clock.now();
        let (hash, shard) = self.shard(identity);
        let shard = read_lock(shard);
        let (_, entry) = shard.find(hash, |(k, _)| **k == *identity)?;
        let spent = match entry.cell.spend(cost, now) {
            LeaseSpend::Spent { left } => {
                // Relaxed: see `Entry::granted`.
                if left < entry.low_water.load(Ordering::Relaxed) {
                    self.ask_ahead(entry);
                }
                Ok(left)
            }
            LeaseSpend::Denied { until } => Err(until.saturating_sub(now).max(1)),
            LeaseSpend::Ask => return None,
        };
        // Answered under the shard's read lock, from the entry itself: nothing of it is
        // copied out first.
        Some(answer(&LocalAnswer {
            layers: entry.layers,
            answer: spent,
            known: &entry.known,
            now,
        }))
    }

    /// Sends `entry`, whose lease runs low, to be renewed ahead, once per lease: the first
    /// spend under the mark takes the mark away (the next lease sets it again), so the spends
    /// after it neither ask nor call here.
    #[cold]
    #[inline(never)]
    pub(super) fn ask_ahead(&self, entry: &Arc<Entry>) {
        // Relaxed: see `Entry::granted`; the swap leaves one spend asking.
        if entry.low_water.swap(0, Ordering::Relaxed) == 0 {
            return;
        }
        // Refused only when no task renews (the stack was made outside a tokio runtime): the
        // caller that finds the lease empty renews it.
        let _ = self.shared.ahead.send(Arc::clone(entry));
    }

    /// The entry for `identity`, made for `call` if there is none.
    pub(super) fn entry(&self, identity: &str, call: &Prepared) -> Arc<Entry> {
        let (hash, shard) = self.shard(identity);
        if let Some((_, entry)) = read_lock(shard).find(hash, |(k, _)| **k == *identity) {
            return Arc::clone(entry);
        }
        let hasher = &self.shared.hasher;
        let mut shard = write_lock(shard);
        let (_, entry) = shard
            .entry(
                hash,
                |(k, _)| **k == *identity,
                |(k, _)| hasher.hash_one(&**k),
            )
            .or_insert_with(|| {
                let entry = Arc::new(Entry {
                    cell: LeaseCell::new(),
                    layers: Touched::new(self.shared.stack.target_bursts(call)),
                    known: Known::default(),
                    seen: AtomicU64::new(0),
                    low_water: AtomicU64::new(0),
                    renewal: tokio::sync::Mutex::new(Meta {
                        call: call.clone(),
                        field: format!("{}/{identity}", self.shared.holder),
                        want: 1,
                        granted: 0,
                        granted_at: 0,
                        removed: false,
                    }),
                });
                (identity.into(), entry)
            })
            .into_mut();
        Arc::clone(entry)
    }
}

/// The layers a key's calls touch (those below [`MAX_LAYERS`], as a stacked answer keeps),
/// each with its least burst: small enough that a local answer is copied out of the table's
/// lock as a few words, and the full [`RedisDecision`] is built once, where it is returned.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Touched {
    /// Bit `i` set: layer `i` takes part.
    mask: u32,
    bursts: [u64; MAX_LAYERS],
}

const _: () = assert!(MAX_LAYERS <= 32, "a layer mask is a u32");

impl Touched {
    /// From each touched limit's layer and burst: per layer, the smallest burst.
    pub(super) fn new(limits: impl IntoIterator<Item = (usize, u64)>) -> Self {
        let mut touched = Self {
            mask: 0,
            bursts: [u64::MAX; MAX_LAYERS],
        };
        for (layer, burst) in limits {
            if let Some(slot) = touched.bursts.get_mut(layer) {
                *slot = (*slot).min(burst);
                touched.mask |= 1 << layer;
            }
        }
        touched
    }

    pub(super) fn iter(self) -> impl Iterator<Item = (usize, u64)> {
        (0..MAX_LAYERS)
            .filter(move |&layer| self.mask & (1 << layer) != 0)
            .map(move |layer| (layer, self.bursts[layer]))
    }
}

/// What a lease decided here: `Ok(units left)`, or `Err(wait ns)` for a standing denial; with
/// what the last Redis answer said of the key, and the local reading it was decided at.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalAnswer<'a> {
    layers: Touched,
    answer: Result<u64, u64>,
    /// The entry's record of Redis's last answer, read where it lies.
    known: &'a Known,
    now: u64,
}

impl LocalAnswer<'_> {
    /// The answer as a [`RedisDecision`] ([`Origin::Lease`]), compact:
    /// each layer's is not kept (the hot path; [`layers`](Self::layers) gives them).
    #[inline]
    pub(crate) fn decision(&self) -> RedisDecision {
        self.at(RedisDecision::leased(self.layers()))
    }

    /// The compact answer and each layer's into `each`, from one read of the entry's record
    /// (read twice, a racing update could make the two disagree).
    pub(crate) fn decision_keeping(&self, each: &mut LayerAnswers) -> RedisDecision {
        *each = LayerAnswers::from_layers(self.layers());
        self.at(RedisDecision::leased(each.iter().copied()))
    }

    /// The answer as a [`RedisDecision`], each layer's kept.
    fn decision_each(&self) -> RedisDecision {
        let layers = LayerAnswers::from_layers(self.layers());
        self.at(RedisDecision::new(
            layers,
            Answered::Decided(Origin::Lease, None),
        ))
    }

    /// `decision` as of this answer's instant on Redis's clock: the last Redis answer's,
    /// moved on by the local clock (none before Redis has answered).
    #[inline]
    fn at(&self, decision: RedisDecision) -> RedisDecision {
        // Relaxed (every load of `Known` here): display values, as `Known::update` writes
        // them (a racing update may mix two answers).
        let at_redis_us = self.known.at_redis_us.load(Ordering::Relaxed);
        if at_redis_us == 0 {
            return decision;
        }
        let at_local = self.known.at_local.load(Ordering::Relaxed);
        let since_us = self.now.saturating_sub(at_local) / 1_000;
        decision.leased_at(at_redis_us.saturating_add(since_us))
    }

    /// Each layer's answer, made against a lease at local reading `now`: admitted with
    /// `Ok(units left)`, or denied with `Err(wait ns)` by a standing denial. Each layer reports
    /// the key's budget as the last Redis answer knew it: what Redis had left plus what the
    /// lease still holds (within the layer's burst), and the wait until the instant that answer
    /// said the layer is full again.
    #[inline]
    pub(crate) fn layers(&self) -> impl Iterator<Item = LayerDecision> + '_ {
        self.layers.iter().map(move |(layer, burst)| {
            // Relaxed: display values, as in `at`.
            let full_at = self.known.full_at[layer].load(Ordering::Relaxed);
            let full_after = full_at.saturating_sub(self.now);
            let decision = match self.answer {
                Ok(left) => {
                    let known = self.known.remaining[layer].load(Ordering::Relaxed);
                    let remaining = known.saturating_add(left).min(burst);
                    Decision::allow(burst, remaining, full_after)
                }
                Err(wait) => Decision::deny(burst, 0, wait, full_after.max(wait)),
            };
            LayerDecision::from_one(layer, 0, decision)
        })
    }
}

/// The answer of a lease on `layers` (see [`LocalAnswer::layers`]), each layer's kept: for the
/// calls that spend a lease off the hot path (a renewal that found units, a record).
pub(super) fn local_answer(
    layers: Touched,
    answer: Result<u64, u64>,
    known: &Known,
    now: u64,
) -> RedisDecision {
    let local = LocalAnswer {
        layers,
        answer,
        known,
        now,
    };
    local.decision_each()
}
