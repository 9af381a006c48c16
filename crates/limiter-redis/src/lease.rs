//! Leased limits: a fleet's limit decided at in-process speed, with a bound a user can read.
//!
//! A [`LeasedStack`] (or [`LeasedLimiter`], the one-layer case) takes part of a key's budget
//! from Redis ahead of time, in one script call: the caller's cost plus a **lease** of more
//! units, consumed from the same state the per-call path decides on. Later calls on that key
//! spend the lease locally, by compare-and-swap on one word ([`LeaseCell`]), until it runs
//! out or expires; then one script call hands back what is left and takes the next lease.
//!
//! The bound it keeps and how it fails are on [`LeasedStack`].

use core::fmt;
use core::time::Duration;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, Weak};

use hashbrown::HashTable;
use limiter_core::{Clock, Decision, LeaseCell, LeaseSpend, MAX_LEASE_UNITS};
use limiter_stack::{AsyncLimiter, Decide, LayerDecision, LayerInfo, MAX_LAYERS, Outcome};

use crate::backend::Sent;
use crate::decision::RedisDecision;
use crate::error::{BackendError, BuildError, CallError};
use crate::script::call::{Call, Mode};
use crate::script::reply;
use crate::spec::RedisLimit;
use crate::stack::{Prepared, RedisLimiter, RedisStack};

/// The default time a lease lives.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(1);

/// The shortest and longest time to live a lease may have.
pub const LEASE_TTL_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(3_600));

/// How far the fleet may run ahead of a limit: the most units of each limit leased out at
/// once. The bound is the limit plus this (see [`LeasedStack`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slack {
    /// The same number of units for every limit.
    Units(u64),
    /// A share of each limit's burst, in parts per million, rounded down.
    PartsPerMillion(u64),
}

impl Slack {
    /// `n` units of every limit.
    pub fn units(n: u64) -> Self {
        Self::Units(n)
    }

    /// `p` percent of each limit's burst.
    pub fn percent(p: u64) -> Self {
        Self::PartsPerMillion(p.saturating_mul(10_000))
    }

    /// The slack of `limit`, in units.
    pub fn of(&self, limit: &RedisLimit) -> u64 {
        self.of_burst(limit.burst())
    }

    /// The slack of a limit whose burst is `burst`, in units (a share rounds down).
    pub fn of_burst(&self, burst: u64) -> u64 {
        match *self {
            Self::Units(n) => n,
            Self::PartsPerMillion(ppm) => {
                let units = u128::from(burst) * u128::from(ppm) / 1_000_000;
                u64::try_from(units).unwrap_or(u64::MAX)
            }
        }
    }

    /// Why no lease can use this slack on a limit of burst `burst`, with the fix: a share
    /// that rounds to no unit (nothing would ever be leased; a slack of 0 is written
    /// `Slack::units(0)`, the per-call path), or more units than the burst (the fleet could
    /// run more than a whole burst ahead). `None` when it can.
    pub fn refusal(&self, burst: u64) -> Option<String> {
        let units = self.of_burst(burst);
        match *self {
            Self::PartsPerMillion(ppm) if ppm > 0 && units == 0 => {
                // The least share of the burst that is a whole unit, in ppm, rounded up.
                let least = 1_000_000u64.div_ceil(burst.max(1));
                let least = Self::PartsPerMillion(least).to_string();
                let least = least.trim_end_matches(" of each burst");
                Some(format!(
                    "a slack of {} is no whole unit of a burst of {burst}, so nothing would be \
                     leased; use at least {least} (one unit), or 1 unit",
                    self.to_string().trim_end_matches(" of each burst")
                ))
            }
            _ if units > burst => Some(format!(
                "a slack of {units} units is more than the burst of {burst}, so the fleet could \
                 run more than a whole burst ahead; use at most {burst} units (100%)"
            )),
            _ => None,
        }
    }
}

impl Slack {
    /// Refuses a slack no lease can use on `limit` (see [`refusal`](Self::refusal)).
    fn check(&self, stack: &str, layer: &str, limit: &RedisLimit) -> Result<(), BuildError> {
        match self.refusal(limit.burst()) {
            Some(reason) => Err(BuildError::Lease {
                stack: stack.to_owned(),
                reason: format!("layer `{layer}`, limit {}: {reason}", limit.limit()),
            }),
            None => Ok(()),
        }
    }
}

impl fmt::Display for Slack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Units(n) => write!(f, "{n} units"),
            Self::PartsPerMillion(ppm) => {
                // Exact, with no trailing zeros: 10%, 0.5%, 0.0125%.
                let fraction = format!("{:04}", ppm % 10_000);
                let fraction = fraction.trim_end_matches('0');
                let dot = if fraction.is_empty() { "" } else { "." };
                write!(f, "{}{dot}{fraction}% of each burst", ppm / 10_000)
            }
        }
    }
}

/// How a stack leases: its [`Slack`] and the time a lease lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    slack: Slack,
    ttl: Duration,
}

impl Lease {
    /// Leases within `slack`, living [`DEFAULT_LEASE_TTL`].
    pub fn new(slack: Slack) -> Self {
        Self {
            slack,
            ttl: DEFAULT_LEASE_TTL,
        }
    }

    /// How long a lease lives (within [`LEASE_TTL_RANGE`]). Longer leases renew less often
    /// when demand is light; units left in a dead node's lease are lost for this long.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The slack.
    pub fn slack(&self) -> Slack {
        self.slack
    }

    /// How long a lease lives.
    pub fn time_to_live(&self) -> Duration {
        self.ttl
    }

    fn check(&self, stack: &str) -> Result<(), BuildError> {
        let (least, most) = LEASE_TTL_RANGE;
        if self.ttl < least || self.ttl > most {
            return Err(BuildError::Lease {
                stack: stack.to_owned(),
                reason: format!(
                    "a lease time to live of {:?} is outside {least:?} to {most:?}; choose one in that range (1s suits most)",
                    self.ttl
                ),
            });
        }
        Ok(())
    }
}

/// Counts of what a leased stack did, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Script calls that took (or tried to take) a lease.
    pub renewals: u64,
    /// Units Redis leased to this node.
    pub leased: u64,
    /// Units this node handed back.
    pub handed_back: u64,
    /// Keys with an entry here now.
    pub keys: usize,
}

/// One key's lease here.
struct Entry {
    cell: LeaseCell,
    /// The layers the key's calls touch, with each one's least burst (what local answers say).
    layers: Touched,
    /// What the last Redis answer said of the key's budget (what local answers report).
    known: Known,
    /// The word the previous idle sweep saw (the sweep's alone).
    seen: AtomicU64,
    renewal: tokio::sync::Mutex<Meta>,
}

/// What the one renewing caller knows (under the entry's renewal lock).
struct Meta {
    /// The call's keys, for hand-backs that come without a request.
    call: Prepared,
    /// The lease's field in each ledger: this stack's holder name and the key's identity.
    field: String,
    /// Units the last lease asked for.
    want: u64,
    /// Units of the lease now held, and when it was asked for (local ns).
    granted: u64,
    granted_at: u64,
    /// The entry left the table: renew through the one that replaced it.
    removed: bool,
}

impl Meta {
    /// The units to ask for next: about half a time to live of the demand the last lease
    /// saw, within 1 and `most`.
    fn next_want(&mut self, handed_back: u64, now: u64, ttl: u64, most: u64) -> u64 {
        if self.granted > 0 {
            let used = u128::from(self.granted.saturating_sub(handed_back));
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
struct Known {
    at_local: AtomicU64,
    at_redis_us: AtomicU64,
    remaining: [AtomicU64; MAX_LAYERS],
    full_at: [AtomicU64; MAX_LAYERS],
}

impl Known {
    /// Keeps what `decision` (Redis's answer, sent at `sent_at` local ns) says of each layer.
    fn update(&self, decision: &RedisDecision, sent_at: u64) {
        // Relaxed (every store and load of `Known`): display values, published by nothing
        // and publishing nothing (see the type's docs).
        self.at_local.store(sent_at, Ordering::Relaxed);
        let at_us = decision.decided_at_micros().unwrap_or(0);
        self.at_redis_us.store(at_us, Ordering::Relaxed);
        for layer in decision.stack().layers() {
            if let (Some(remaining), Some(full_at)) = (
                self.remaining.get(layer.layer),
                self.full_at.get(layer.layer),
            ) {
                remaining.store(layer.decision.remaining(), Ordering::Relaxed);
                let reset = layer.decision.reset_after_nanos();
                full_at.store(sent_at.saturating_add(reset), Ordering::Relaxed);
            }
        }
    }

    /// What a local answer reports of the layers in `touched`.
    #[inline]
    fn snapshot(&self, touched: Touched) -> KnownSnapshot {
        let mut snapshot = KnownSnapshot {
            at_local: self.at_local.load(Ordering::Relaxed),
            at_redis_us: self.at_redis_us.load(Ordering::Relaxed),
            remaining: [0; MAX_LAYERS],
            full_at: [0; MAX_LAYERS],
        };
        for (layer, _) in touched.iter() {
            snapshot.remaining[layer] = self.remaining[layer].load(Ordering::Relaxed);
            snapshot.full_at[layer] = self.full_at[layer].load(Ordering::Relaxed);
        }
        snapshot
    }
}

/// [`Known`], read for one answer.
#[derive(Clone, Copy, Debug)]
struct KnownSnapshot {
    at_local: u64,
    at_redis_us: u64,
    remaining: [u64; MAX_LAYERS],
    full_at: [u64; MAX_LAYERS],
}

/// One shard of the local table: entries found by the identity's hash (computed once per
/// call, for the shard and the lookup).
type Shard = crossbeam_utils::CachePadded<RwLock<HashTable<(Box<str>, Arc<Entry>)>>>;

struct Shared<R> {
    stack: RedisStack<R>,
    lease: Lease,
    /// This stack's name in the ledgers: unique per process and stack.
    holder: String,
    /// Per layer, per limit: the slack in units.
    slack: Vec<Vec<u64>>,
    /// The most one lease asks for: the least slack, within what a lease word holds.
    most: u64,
    least_burst: u64,
    shards: Box<[Shard]>,
    hasher: foldhash::fast::RandomState,
    /// The backend's local clock, kept here to save a pointer chase on the hot path.
    clock: Arc<dyn Clock>,
    renewals: AtomicU64,
    leased: AtomicU64,
    handed_back: AtomicU64,
}

/// A [`RedisStack`] that decides most calls locally, against leases of each key's budget
/// ([`RedisStack::leased`]; [`RedisLimiter::leased`] for the one-layer case).
///
/// A decision made against a lease ([`Source::Lease`](crate::Source::Lease)) reports the key's
/// budget as the last Redis answer knew it, less what the lease has spent since: `remaining`
/// is what Redis had left plus what this node's lease still holds (other nodes may have taken
/// some since), and `reset_after` counts to the instant that answer gave, on Redis's clock
/// ([`RedisDecision::decided_at_micros`]); one that renewed reports Redis's answer. Batches
/// and refunds go to the per-call stack underneath ([`stack`](Self::stack)).
///
/// # The bound
///
/// Every unit a node admits was taken from Redis's state first, so over any span the fleet
/// admits at most what the state admits in it plus what was leased before it and spent in it.
/// Each limit's ledger (a Redis hash beside its key) counts the leases outstanding and never
/// lets them add up to more than the limit's **slack** ([`Slack`]):
///
/// ```text
/// admitted in any span T  <=  burst + floor(T * count / period) + slack
/// ```
///
/// and, when demand is steady and above the limit, the fleet admits at least that less the
/// slack (units can sit unspent in leases). A slack of 0 leases nothing: every call is the
/// exact per-call path. Leases are sized from each node's recent demand (about half a time to
/// live of it), and on each limit no lease takes more than an equal share of the slack the
/// other live leases leave, so a hot key on one node renews rarely and a key spread over many
/// nodes starves none of them: a node that finds no slack left is decided per call.
///
/// # Failure
///
/// - A lease lives for its time to live ([`Lease::ttl`], 1 s by default); the node stops
///   spending it a tenth of that earlier than Redis forgets it, so a node that dies loses at
///   most its leases, which expire, and no unit is spent after Redis gave its slack to others.
/// - Units handed back come back only while Redis still records the lease; a unit is spent
///   here or handed back, never both ([`LeaseCell::close`]).
/// - While Redis is out a node spends what it holds, then follows the stack's failure policy
///   ([`OnFailure`](crate::OnFailure)). A hand-back that never left (the circuit breaker was
///   open) is kept; one whose outcome is unknown (a timeout) is given up.
/// - Leases nobody spent since the previous sweep are handed back by a sweep every half time
///   to live (a task started when the stack is made inside a tokio runtime; otherwise call
///   [`LeasedStack::release_idle`]); [`LeasedStack::shutdown`] hands back every lease.
pub struct LeasedStack<R> {
    shared: Arc<Shared<R>>,
}

impl<R> Clone for LeasedStack<R> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<R> fmt::Debug for LeasedStack<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasedStack")
            .field("stack", &self.shared.stack)
            .field("lease", &self.shared.lease)
            .field("holder", &self.shared.holder)
            .finish_non_exhaustive()
    }
}

/// A name no other stack in any process is likely to have: the process, the time, and a
/// counter.
fn holder_name(stack: &str) -> String {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let mix = foldhash::fast::RandomState::default().hash_one((std::process::id(), made));
    format!("{stack}#{:x}.{made}.{mix:016x}", std::process::id())
}

impl<R: Send + Sync + 'static> RedisStack<R> {
    /// This stack, deciding against leases within `lease`'s slack (see [`LeasedStack`]).
    /// Inside a tokio runtime this starts the idle sweep, which ends with the stack.
    pub fn leased(self, lease: Lease) -> Result<LeasedStack<R>, BuildError> {
        lease.check(self.name())?;
        if self.may_span_slots() {
            return Err(BuildError::CrossSlot {
                stack: self.name().to_owned(),
                layers: self.layers().count(),
            });
        }
        for (layer, limits) in self.layers() {
            for limit in limits {
                lease.slack.check(self.name(), layer, limit)?;
            }
        }
        let slack: Vec<Vec<u64>> = self
            .layers()
            .map(|(_, limits)| limits.iter().map(|l| lease.slack.of(l)).collect())
            .collect();
        let most = slack
            .iter()
            .flatten()
            .copied()
            .min()
            .unwrap_or(0)
            .min(MAX_LEASE_UNITS);
        let shards = (0..shard_count())
            .map(|_| crossbeam_utils::CachePadded::new(RwLock::new(HashTable::new())))
            .collect();
        let shared = Arc::new(Shared {
            holder: holder_name(self.name()),
            least_burst: self.least_burst(),
            clock: self.backend().local_clock(),
            stack: self,
            lease,
            slack,
            most,
            shards,
            hasher: foldhash::fast::RandomState::default(),
            renewals: AtomicU64::new(0),
            leased: AtomicU64::new(0),
            handed_back: AtomicU64::new(0),
        });
        if most > 0
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(sweep(Arc::downgrade(&shared)));
        }
        Ok(LeasedStack { shared })
    }
}

/// Shards of the local table: four per core, as the in-process stores.
fn shard_count() -> usize {
    std::thread::available_parallelism()
        .map_or(4, |n| n.get().saturating_mul(4))
        .next_power_of_two()
}

/// Hands back idle leases every half time to live, while the stack lives.
async fn sweep<R: Send + Sync + 'static>(shared: Weak<Shared<R>>) {
    let every = match shared.upgrade() {
        Some(shared) => shared.lease.ttl / 2,
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        LeasedStack { shared }.release_idle().await;
    }
}

impl<R> LeasedStack<R> {
    /// Decides one unit for `request`.
    pub async fn check(&self, request: &R) -> Result<RedisDecision, CallError> {
        self.check_n(request, 1).await
    }

    /// Decides `cost` units for `request`: against this node's lease when it covers the cost
    /// ([`Source::Lease`](crate::Source::Lease)), else in one script call that renews the lease.
    pub async fn check_n(&self, request: &R, cost: u64) -> Result<RedisDecision, CallError> {
        let mut identity = String::new();
        self.shared.stack.identity(request, &mut identity);
        if let Some(answer) = self.local(&identity, cost) {
            return Ok(answer.decision());
        }
        self.renew(&identity, request, cost).await
    }

    /// Records `cost` units of usage that already happened for `request` (see
    /// [`RedisStack::record`]): spent from this node's lease first (units Redis already took
    /// from the key's state), and the rest recorded on Redis in one script call, never
    /// refused. A lease that covers the whole cost answers locally
    /// ([`Source::Lease`](crate::Source::Lease)); otherwise Redis answers for the rest, and
    /// what the lease held is used up.
    pub async fn record(&self, request: &R, cost: u64) -> Result<RedisDecision, CallError> {
        let shared = &*self.shared;
        let mut identity = String::new();
        shared.stack.identity(request, &mut identity);
        let mut rest = cost;
        if cost > 0 && shared.most > 0 {
            let now = shared.clock.now();
            let (hash, shard) = self.shard(&identity);
            let entry = read(shard)
                .find(hash, |(k, _)| **k == *identity)
                .map(|(_, entry)| Arc::clone(entry));
            if let Some(entry) = entry {
                let local = |left| {
                    let known = entry.known.snapshot(entry.layers);
                    local_answer(entry.layers, Ok(left), &known, now)
                };
                match entry.cell.spend(cost, now) {
                    LeaseSpend::Spent { left } => return Ok(local(left)),
                    // A standing denial stays true with more used: Redis records it all.
                    LeaseSpend::Denied { .. } => {}
                    LeaseSpend::Ask => {
                        // Too few units for the whole cost: they go to it, Redis takes the
                        // rest. A denial or an expired lease is put back as it was.
                        let word = entry.cell.close();
                        if LeaseCell::holds_units(word, now) {
                            rest = rest.saturating_sub(LeaseCell::units_of(word));
                        } else {
                            entry.cell.restore(word);
                        }
                        if rest == 0 {
                            return Ok(local(0));
                        }
                    }
                }
            }
        }
        shared.stack.record(request, rest).await
    }

    /// The per-call stack underneath, for batches and refunds (which go to Redis each time).
    pub fn stack(&self) -> &RedisStack<R> {
        &self.shared.stack
    }

    /// How this stack leases.
    pub fn lease(&self) -> Lease {
        self.shared.lease
    }

    /// The slack of the limit `limit` of the layer `layer`, in units (`None` for no such
    /// limit).
    pub fn slack_of(&self, layer: usize, limit: usize) -> Option<u64> {
        self.shared.slack.get(layer)?.get(limit).copied()
    }

    /// This stack's name in Redis's lease ledgers.
    pub fn holder(&self) -> &str {
        &self.shared.holder
    }

    /// What the stack has done since it was made.
    pub fn stats(&self) -> LeaseStats {
        let shared = &*self.shared;
        LeaseStats {
            renewals: shared.renewals.load(Ordering::Relaxed),
            leased: shared.leased.load(Ordering::Relaxed),
            handed_back: shared.handed_back.load(Ordering::Relaxed),
            keys: shared.shards.iter().map(|s| read(s).len()).sum(),
        }
    }

    /// The identity's hash and its shard.
    #[inline]
    fn shard(&self, identity: &str) -> (u64, &Shard) {
        let hash = self.shared.hasher.hash_one(identity);
        let shards = &self.shared.shards;
        // A power of two: the mask keeps the index in range. The middle bits pick the shard;
        // the table uses the top and low bits.
        (hash, &shards[(hash >> 32) as usize & (shards.len() - 1)])
    }

    /// The answer of the lease `identity` holds here, if it decides a call of `cost`.
    #[inline]
    pub(crate) fn local(&self, identity: &str, cost: u64) -> Option<LocalAnswer> {
        let shared = &*self.shared;
        if cost > shared.least_burst || shared.most == 0 {
            return None;
        }
        let now = shared.clock.now();
        let (hash, shard) = self.shard(identity);
        let shard = read(shard);
        let (_, entry) = shard.find(hash, |(k, _)| **k == *identity)?;
        let answer = match entry.cell.spend(cost, now) {
            LeaseSpend::Spent { left } => Ok(left),
            LeaseSpend::Denied { until } => Err(until.saturating_sub(now).max(1)),
            LeaseSpend::Ask => return None,
        };
        Some(LocalAnswer {
            layers: entry.layers,
            answer,
            known: entry.known.snapshot(entry.layers),
            now,
        })
    }

    /// The entry for `identity`, made for `call` if there is none.
    fn entry(&self, identity: &str, call: &Prepared) -> Arc<Entry> {
        let (hash, shard) = self.shard(identity);
        if let Some((_, entry)) = read(shard).find(hash, |(k, _)| **k == *identity) {
            return Arc::clone(entry);
        }
        let hasher = &self.shared.hasher;
        let mut shard = write(shard);
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

    /// Decides a call the lease here did not: takes the next lease in one script call
    /// (handing back what is left of this one), or, with no slack, decides per call.
    pub(crate) async fn renew(
        &self,
        identity: &str,
        request: &R,
        cost: u64,
    ) -> Result<RedisDecision, CallError> {
        let shared = &*self.shared;
        let call = shared.stack.prepare(request, cost)?;
        if shared.most == 0 || call.keys.is_empty() || cost == 0 || cost > MAX_LEASE_UNITS {
            return Ok(shared.stack.decide_prepared(request, &call).await.0);
        }
        loop {
            let entry = self.entry(identity, &call);
            let mut meta = entry.renewal.lock().await;
            if meta.removed {
                continue;
            }
            return Ok(self.renew_held(&entry, &mut meta, request, &call).await);
        }
    }

    async fn renew_held(
        &self,
        entry: &Entry,
        meta: &mut Meta,
        request: &R,
        call: &Prepared,
    ) -> RedisDecision {
        let shared = &*self.shared;
        let backend = shared.stack.backend();
        let cost = call.cost;
        let now = backend.local_now();
        // Another caller may have renewed while this one waited.
        let local = |answer| {
            let known = entry.known.snapshot(entry.layers);
            local_answer(entry.layers, answer, &known, now)
        };
        match entry.cell.spend(cost, now) {
            LeaseSpend::Spent { left } => return local(Ok(left)),
            LeaseSpend::Denied { until } => return local(Err(until.saturating_sub(now).max(1))),
            LeaseSpend::Ask => {}
        }
        let ttl = duration_nanos(shared.lease.ttl);
        let old = entry.cell.close();
        let handed_back = LeaseCell::units_of(old);
        let want = meta.next_want(handed_back, now, ttl, shared.most);
        let sent = backend.sent();
        let (keys, args) = self.lease_call(call, [cost, want, handed_back]);
        shared.renewals.fetch_add(1, Ordering::Relaxed);
        let reply = backend.eval_as(&keys, args, Some(&meta.field)).await;
        let answer = match reply {
            Ok(value) => reply::parse_leases(&value, &[call.limits()]),
            Err(e) => Err(e),
        };
        match answer {
            Ok((now_us, mut groups)) if groups.len() == 1 => match groups.pop() {
                Some((lease, Ok(answers))) => {
                    shared.handed_back.fetch_add(handed_back, Ordering::Relaxed);
                    self.take(entry, meta, lease, &answers, (&sent, now_us), request, call)
                }
                Some((_, Err(reason))) => {
                    // The script refused the group before writing any state.
                    entry.cell.restore(old);
                    shared
                        .stack
                        .on_failure(request, cost, BackendError::Script(reason))
                }
                None => unreachable_reply(&shared.stack, request, cost),
            },
            Ok(_) => unreachable_reply(&shared.stack, request, cost),
            Err(error) => {
                if matches!(error, BackendError::CircuitOpen { .. }) {
                    // Never sent: what was left is still this node's to spend.
                    entry.cell.restore(old);
                    if let LeaseSpend::Spent { left } = entry.cell.spend(cost, now) {
                        return local(Ok(left));
                    }
                }
                meta.granted = 0;
                shared.stack.on_failure(request, cost, error)
            }
        }
    }

    /// Keeps what Redis leased (and what it said of the key's budget) and answers the caller.
    #[allow(clippy::too_many_arguments)]
    fn take(
        &self,
        entry: &Entry,
        meta: &mut Meta,
        lease: u64,
        answers: &[reply::LimitAnswer],
        (sent, now_us): (&Sent, u64),
        request: &R,
        call: &Prepared,
    ) -> RedisDecision {
        let shared = &*self.shared;
        let ttl = duration_nanos(shared.lease.ttl);
        let admitted = answers.iter().all(|a| a.allowed);
        meta.granted = 0;
        let decision = shared
            .stack
            .conclude(request, call, Ok(answers.to_vec()), *sent, false)
            .at(now_us);
        entry.known.update(&decision, sent.at);
        if admitted && lease > 0 {
            // Redis keeps the lease `ttl` from when it ran the script, after this was sent;
            // this node stops a tenth of that earlier, so clock drift cannot make it spend
            // a unit Redis has already given up.
            let deadline = sent.at.saturating_add(ttl - ttl / 10);
            if entry.cell.grant(lease, deadline) {
                meta.granted = lease;
                meta.granted_at = sent.at;
                shared.leased.fetch_add(lease, Ordering::Relaxed);
                // The key's budget counts the lease this node now holds, as local answers do.
                return decision.with_leased(lease);
            }
        } else if !admitted {
            let wait = answers
                .iter()
                .filter(|a| !a.allowed)
                .map(|a| a.retry_after_us.saturating_mul(1_000))
                .max()
                .unwrap_or(0);
            entry.cell.deny(call.cost, sent.at.saturating_add(wait));
        }
        decision
    }

    /// The keys and arguments of a lease call for `call`: `head` is the cost, the units
    /// wanted and the units handed back.
    fn lease_call(&self, call: &Prepared, head: [u64; 3]) -> (Vec<String>, Call) {
        let shared = &*self.shared;
        let mut keys = call.keys.clone();
        keys.extend(call.keys.iter().map(|k| format!("{k}:lease")));
        let mut args = Call::new(Mode::Lease);
        let ttl_ms = u64::try_from(shared.lease.ttl.as_millis()).unwrap_or(u64::MAX);
        shared
            .stack
            .encode_lease(call, head, ttl_ms, &shared.slack, &mut args);
        (keys, args)
    }

    /// Hands back `entry`'s lease (the caller holds its renewal lock). Returns the units.
    async fn hand_back(&self, entry: &Entry, meta: &mut Meta) -> u64 {
        let units = LeaseCell::units_of(entry.cell.close());
        meta.granted = 0;
        if units == 0 {
            return 0;
        }
        let (keys, args) = self.lease_call(&meta.call, [0, 0, units]);
        let backend = self.shared.stack.backend();
        self.shared.renewals.fetch_add(1, Ordering::Relaxed);
        let answered = match backend.eval_as(&keys, args, Some(&meta.field)).await {
            Ok(value) => reply::parse_leases(&value, &[meta.call.limits()])
                .is_ok_and(|(_, groups)| groups.iter().all(|(_, answer)| answer.is_ok())),
            Err(_) => false,
        };
        if !answered {
            // Not handed back: the units are lost, never spent.
            return 0;
        }
        self.shared.handed_back.fetch_add(units, Ordering::Relaxed);
        units
    }

    /// Hands back every lease nobody spent from since the previous call, and forgets keys
    /// that hold nothing. Returns the units handed back. The idle sweep calls it every half
    /// time to live.
    pub async fn release_idle(&self) -> u64 {
        self.release(false).await
    }

    /// Hands back every lease this node holds (call it before the process exits; leases not
    /// handed back are lost until they expire). Returns the units handed back.
    pub async fn shutdown(&self) -> u64 {
        self.release(true).await
    }

    async fn release(&self, all: bool) -> u64 {
        let now = self.shared.stack.backend().local_now();
        let mut returned = 0u64;
        for shard in self.shared.shards.iter() {
            let entries: Vec<(Box<str>, Arc<Entry>)> = read(shard)
                .iter()
                .map(|(k, e)| (k.clone(), Arc::clone(e)))
                .collect();
            for (identity, entry) in entries {
                let word = entry.cell.load();
                let idle = entry.seen.swap(word, Ordering::Relaxed) == word;
                if !LeaseCell::holds_units(word, now) {
                    // Holds nothing (or a denial, or an expired lease): forget the key, unless
                    // a caller is renewing it.
                    if let Ok(mut meta) = entry.renewal.try_lock() {
                        let hash = self.shared.hasher.hash_one(&*identity);
                        let mut shard = write(shard);
                        if entry.cell.load() == word
                            && let Ok(found) =
                                shard.find_entry(hash, |(_, e)| Arc::ptr_eq(e, &entry))
                        {
                            meta.removed = true;
                            found.remove();
                        }
                    }
                } else if all || idle {
                    let mut meta = if all {
                        entry.renewal.lock().await
                    } else {
                        match entry.renewal.try_lock() {
                            Ok(meta) => meta,
                            Err(_) => continue,
                        }
                    };
                    returned = returned.saturating_add(self.hand_back(&entry, &mut meta).await);
                }
            }
        }
        returned
    }
}

fn unreachable_reply<R>(stack: &RedisStack<R>, request: &R, cost: u64) -> RedisDecision {
    let error = BackendError::BadReply("a lease call answered for another number of calls".into());
    stack.on_failure(request, cost, error)
}

fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A shard's map is valid after any panic: each change is one insert or remove.
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
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
    fn new(limits: impl IntoIterator<Item = (usize, u64)>) -> Self {
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

    fn iter(self) -> impl Iterator<Item = (usize, u64)> {
        (0..MAX_LAYERS)
            .filter(move |&layer| self.mask & (1 << layer) != 0)
            .map(move |layer| (layer, self.bursts[layer]))
    }
}

/// What a lease decided here: `Ok(units left)`, or `Err(wait ns)` for a standing denial; with
/// what the last Redis answer said of the key, and the local reading it was decided at.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalAnswer {
    layers: Touched,
    answer: Result<u64, u64>,
    known: KnownSnapshot,
    now: u64,
}

impl LocalAnswer {
    /// The answer as a [`RedisDecision`] ([`Source::Lease`](crate::Source::Lease)).
    #[inline]
    pub(crate) fn decision(self) -> RedisDecision {
        local_answer(self.layers, self.answer, &self.known, self.now)
    }
}

/// A decision made against a lease at local reading `now`: admitted with `Ok(units left)`, or
/// denied with `Err(wait ns)` by a standing denial. Each layer reports the key's budget as the
/// last Redis answer knew it: what Redis had left plus what the lease still holds (within the
/// layer's burst), and the wait until the instant that answer said the layer is full again.
#[inline]
fn local_answer(
    layers: Touched,
    answer: Result<u64, u64>,
    known: &KnownSnapshot,
    now: u64,
) -> RedisDecision {
    let allowed = answer.is_ok();
    let decision = RedisDecision::leased(
        allowed,
        layers.iter().map(|(layer, burst)| {
            let full_after = known.full_at[layer].saturating_sub(now);
            let decision = match answer {
                Ok(left) => {
                    let remaining = known.remaining[layer].saturating_add(left).min(burst);
                    Decision::allow(burst, remaining, full_after)
                }
                Err(wait) => Decision::deny(burst, 0, wait, full_after.max(wait)),
            };
            LayerDecision {
                layer,
                plan: 0,
                limit_index: 0,
                decision,
                limit_reset_after_nanos: decision.reset_after_nanos(),
            }
        }),
    );
    if known.at_redis_us == 0 {
        return decision;
    }
    // The answer's instant on Redis's clock: the last answer's, moved on by the local clock.
    let since_us = now.saturating_sub(known.at_local) / 1_000;
    decision.leased_at(known.at_redis_us.saturating_add(since_us))
}

impl<R: Sync> AsyncLimiter<R> for LeasedStack<R> {
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
        let mut identity = String::new();
        self.shared.stack.identity(request, &mut identity);
        if let Some(answer) = self.local(&identity, cost) {
            return Decide::Now(Ok(Outcome::from(answer.decision())));
        }
        Decide::Later(Box::pin(async move {
            self.renew(&identity, request, cost)
                .await
                .map(Outcome::from)
                .map_err(limiter_stack::CallError::from)
        }))
    }

    fn layers(&self) -> Vec<LayerInfo> {
        AsyncLimiter::layers(&self.shared.stack)
    }
}

/// A [`RedisLimiter`] deciding against leases: one layer keyed by a string.
#[derive(Clone, Debug)]
pub struct LeasedLimiter {
    stack: LeasedStack<String>,
}

impl RedisLimiter {
    /// This limiter, deciding against leases within `lease`'s slack (see [`LeasedStack`]).
    pub fn leased(self, lease: Lease) -> Result<LeasedLimiter, BuildError> {
        Ok(LeasedLimiter {
            stack: self.into_stack().leased(lease)?,
        })
    }
}

impl LeasedLimiter {
    /// Decides one unit for `key`.
    pub fn check<'a>(
        &'a self,
        key: &'a str,
    ) -> impl Future<Output = Result<RedisDecision, CallError>> + 'a {
        self.check_n(key, 1)
    }

    /// Decides `cost` units for `key`: locally while this node's lease covers it.
    pub async fn check_n(&self, key: &str, cost: u64) -> Result<RedisDecision, CallError> {
        // A stack tagged by its one layer's key names a call by the key itself
        // (`RedisStack::identity`), so the hot path allocates nothing.
        if let Some(answer) = self.stack.local(key, cost) {
            return Ok(answer.decision());
        }
        self.stack.renew(key, &key.to_owned(), cost).await
    }

    /// Records `cost` units of usage for `key`: from this node's lease first, the rest on
    /// Redis (see [`LeasedStack::record`]).
    pub async fn record(&self, key: &str, cost: u64) -> Result<RedisDecision, CallError> {
        self.stack.record(&key.to_owned(), cost).await
    }

    /// The leased stack underneath.
    pub fn stack(&self) -> &LeasedStack<String> {
        &self.stack
    }

    /// See [`LeasedStack::release_idle`].
    pub async fn release_idle(&self) -> u64 {
        self.stack.release_idle().await
    }

    /// See [`LeasedStack::shutdown`].
    pub async fn shutdown(&self) -> u64 {
        self.stack.shutdown().await
    }

    /// See [`LeasedStack::stats`].
    pub fn stats(&self) -> LeaseStats {
        self.stack.stats()
    }
}
