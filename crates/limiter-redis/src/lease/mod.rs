//! Leased limits: a fleet's limit decided at in-process speed, with a bound a user can read.
//!
//! A [`LeasedStack`] (or [`LeasedLimiter`], the one-layer case) takes part of a key's budget
//! from Redis ahead of time, in one script call: the caller's cost plus a **lease** of more
//! units, consumed from the same state the per-call path decides on. Later calls on that key
//! spend the lease locally, by compare-and-swap on one word ([`LeaseCell`]). When a spend
//! leaves less than half of it, the next lease is taken ahead in the background, keeping what
//! is left (`ahead.rs`); a lease that runs out or expires first is renewed by the caller that
//! finds it empty, in one script call that refunds what is left and takes the next.
//!
//! The bound it keeps and how it fails are on [`LeasedStack`].

//!
//! Its parts: `options.rs` ([`Slack`], [`Lease`], [`LeaseStats`]), `table.rs` (the sharded
//! table of leased keys and the answers spent from it locally), `renew.rs` (the script calls
//! that renew, refund and release leases), `ahead.rs` (a lease running low renewed in the
//! background while callers spend what is left).

use core::fmt;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock, Weak};

use hashbrown::HashTable;
use limiter_core::{Clock, LeaseCell, LeaseSpend, MAX_LEASE_UNITS};
use limiter_stack::{
    Ask, AsyncLimiter, Charge, Charges, Decide, Granted, HoldsLeases, LayerAnswers, LayerInfo,
    Outcome, Pending, Refunds, Taken, undo_with_grant,
};

use crate::decision::RedisDecision;
use crate::error::{BuildError, CallError};
use crate::refund::RedisGrant;
use crate::stack::{RedisLimiter, RedisStack};

mod ahead;
mod options;
mod renew;
mod table;

pub use options::{DEFAULT_LEASE_TTL, LEASE_TTL_RANGE, Lease, LeaseStats, Slack};
use renew::{read_lock, write_lock};
use table::{Entry, Meta, Shared, local_answer};

/// A [`RedisStack`] that decides most calls locally, against leases of each key's budget
/// ([`RedisStack::leased`]; [`RedisLimiter::leased`] for the one-layer case).
///
/// A decision made against a lease ([`Origin::Lease`](limiter_stack::Origin::Lease)) reports
/// the key's budget as the last Redis answer knew it, less what the lease has spent since:
/// `remaining` is what Redis had left plus what this node's lease still holds (other nodes may
/// have taken some since), and `reset_after` counts to the instant that answer gave, on Redis's clock
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
/// - Units refunded come back only while Redis still records the lease; a unit is spent
///   here or refunded, never both ([`LeaseCell::close`]).
/// - While Redis is out a node spends what it holds, then follows the stack's failure policy
///   ([`OnFailure`](crate::OnFailure)). A hand-back that never left (the circuit breaker was
///   open) is kept; one whose outcome is unknown (a timeout) is given up.
/// - Leases nobody spent since the previous sweep are refunded by a sweep every half time
///   to live (a task started when the stack is made inside a tokio runtime; otherwise call
///   [`LeasedStack::refund_idle_leases`]); [`LeasedStack::refund_leases`] refunds every lease.
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
    // Relaxed: a counter that only makes names differ.
    let made = MADE.fetch_add(1, Ordering::Relaxed);
    let mix = foldhash::fast::RandomState::default().hash_one((std::process::id(), made));
    format!("{stack}#{:x}.{made}.{mix:016x}", std::process::id())
}

impl<R: Send + Sync + 'static> RedisStack<R> {
    /// This stack, deciding against leases within `lease`'s slack (see [`LeasedStack`]).
    /// Inside a tokio runtime this starts the idle sweep, which ends with the stack.
    pub fn leased(self, lease: Lease) -> Result<LeasedStack<R>, BuildError> {
        options::check_lease(&lease, self.name())?;
        if self.has_plans() {
            return Err(BuildError::Lease {
                stack: self.name().to_owned(),
                reason: "a layer chooses among plans, which a lease does not follow yet; lease a stack whose layers have one plan each".to_owned(),
            });
        }
        if self.may_span_slots() {
            return Err(BuildError::CrossSlot {
                stack: self.name().to_owned(),
                layers: self.layers().count(),
            });
        }
        for (layer, limits) in self.layers() {
            for limit in limits {
                options::check_slack(lease.slack(), self.name(), layer, limit)?;
            }
        }
        let slack: Vec<Vec<u64>> = self
            .layers()
            .map(|(_, limits)| {
                limits
                    .iter()
                    .map(|l| options::slack_of(lease.slack(), l))
                    .collect()
            })
            .collect();
        let most = slack
            .iter()
            .flatten()
            .copied()
            .min()
            .unwrap_or(0)
            .min(MAX_LEASE_UNITS);
        let (ahead, asked) = tokio::sync::mpsc::unbounded_channel();
        let shards = (0..shard_count())
            .map(|_| crossbeam_utils::CachePadded::new(RwLock::new(HashTable::new())))
            .collect();
        let shared = Arc::new(Shared {
            holder: holder_name(self.name()),
            least_burst: self.least_burst(),
            clock: self.backend().local_clock(),
            ahead,
            stack: self,
            lease,
            slack,
            most,
            shards,
            hasher: foldhash::fast::RandomState::default(),
            renewals: AtomicU64::new(0),
            leased: AtomicU64::new(0),
            refunded: AtomicU64::new(0),
        });
        if most > 0 {
            // Without a runtime nothing sweeps (idle leases then expire in Redis on their
            // own) and nothing renews ahead (the receiver dropped, a spend's ask finds none).
            let _ = crate::task::spawn(sweep(Arc::downgrade(&shared)));
            let _ = crate::task::spawn(ahead::renew_asked(Arc::downgrade(&shared), asked));
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
        Some(shared) => shared.lease.time_to_live() / 2,
        None => return,
    };
    loop {
        tokio::time::sleep(every).await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        LeasedStack { shared }.refund_idle_leases().await;
    }
}

impl<R> LeasedStack<R> {
    /// Decides one unit for `request`.
    pub async fn check(&self, request: &R) -> Result<RedisDecision, CallError> {
        self.check_n(request, 1).await
    }

    /// Decides `cost` units for `request`: against this node's lease when it covers the cost
    /// ([`Origin::Lease`](limiter_stack::Origin::Lease)), else in one script call that renews
    /// the lease.
    pub async fn check_n(&self, request: &R, cost: u64) -> Result<RedisDecision, CallError> {
        let mut identity = String::new();
        self.shared.stack.identity(request, &mut identity);
        if let Some(answer) = self.local(&identity, cost, |answer| answer.decision()) {
            return Ok(answer);
        }
        self.renew(&identity, request, cost).await
    }

    /// Records `cost` units of usage that already happened for `request` (see
    /// [`RedisStack::record`]): spent from this node's lease first (units Redis already took
    /// from the key's state), and the rest recorded on Redis in one script call, never
    /// refused. A lease that covers the whole cost answers locally
    /// ([`Origin::Lease`](limiter_stack::Origin::Lease)); otherwise Redis answers for the rest, and
    /// what the lease held is used up.
    pub async fn record(&self, request: &R, cost: u64) -> Result<RedisDecision, CallError> {
        let shared = &*self.shared;
        let mut identity = String::new();
        shared.stack.identity(request, &mut identity);
        let mut rest = cost;
        if cost > 0 && shared.most > 0 {
            let now = shared.clock.now();
            let (hash, shard) = self.shard(&identity);
            let entry = read_lock(shard)
                .find(hash, |(k, _)| **k == *identity)
                .map(|(_, entry)| Arc::clone(entry));
            if let Some(entry) = entry {
                let local = |left| local_answer(entry.layers, Ok(left), &entry.known, now);
                match entry.cell.spend(cost, now) {
                    LeaseSpend::Spent { left } => {
                        // Relaxed: see `Entry::granted`.
                        if left < entry.low_water.load(Ordering::Relaxed) {
                            self.ask_ahead(&entry);
                        }
                        return Ok(local(left));
                    }
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
        // Relaxed: statistics, each read on its own.
        LeaseStats {
            renewals: shared.renewals.load(Ordering::Relaxed),
            leased: shared.leased.load(Ordering::Relaxed),
            refunded: shared.refunded.load(Ordering::Relaxed),
            keys: shared.shards.iter().map(|s| read_lock(s).len()).sum(),
        }
    }
}

impl<R: Sync + 'static> LeasedStack<R> {
    /// The seam's decision: at once against the lease when it covers `cost`, else a future
    /// that renews; each layer's answer kept in `each` when given (the compact one otherwise).
    fn decide_leased<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        mut each: Option<&'a mut LayerAnswers>,
    ) -> Decide<'a> {
        let mut identity = String::new();
        self.shared.stack.identity(request, &mut identity);
        let keep = each.as_deref_mut();
        let local = self.local(&identity, cost, |answer| match keep {
            Some(each) => answer.decision_keeping(each),
            None => answer.decision(),
        });
        if let Some(answer) = local {
            return Decide::Now(Ok(Outcome::from(answer)));
        }
        if let Some(each) = each.as_deref_mut() {
            each.clear();
        }
        Decide::Later(Box::pin(async move {
            let answer = self.renew(&identity, request, cost).await?;
            if let Some(each) = each {
                *each = *answer.layers();
            }
            Ok(Outcome::from(answer))
        }))
    }
}

impl<R: Sync + 'static> AsyncLimiter<R> for LeasedStack<R> {
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
        self.decide_leased(request, cost, None)
    }

    fn decide_request_each<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        each: &'a mut LayerAnswers,
    ) -> Decide<'a> {
        self.decide_leased(request, cost, Some(each))
    }

    fn layers(&self) -> Vec<LayerInfo> {
        AsyncLimiter::layers(&self.shared.stack)
    }
}

impl<R: Sync + 'static> Charges<R> for LeasedStack<R> {
    /// Takes against the lease; holds, refunds and unit refunds on the per-call stack (a grant
    /// is Redis's), records spending the lease first.
    fn ask<'a>(&'a self, request: &'a R, ask: Ask) -> Decide<'a> {
        match ask.charge {
            // Against the lease: answered now while it covers the cost.
            Charge::Take => self.decide_request(request, ask.cost),
            Charge::Record => Decide::Later(Box::pin(async move {
                Ok(Outcome::from(self.record(request, ask.cost).await?))
            })),
            Charge::Refund => Decide::Later(Box::pin(crate::seam::ask_per_call(
                self.stack(),
                request,
                ask,
            ))),
        }
    }

    /// On its per-call stack: a take that can be undone is decided on Redis, not against the
    /// lease.
    fn take_undoable<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        at: Option<u64>,
    ) -> Decide<'a, Result<Taken<'a>, limiter_stack::CallError>> {
        undo_with_grant(self.stack(), request, cost, at)
    }
}

impl<R: Sync + 'static> HoldsLeases for LeasedStack<R> {
    fn refund_leases(&self) -> Pending<'_, u64> {
        Box::pin(LeasedStack::refund_leases(self))
    }
}

impl<R: Sync + 'static> Refunds<R> for LeasedStack<R> {
    type Grant = RedisGrant;

    /// On its per-call stack, in one script call (a grant is Redis's, not the lease's).
    fn take_with_grant<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        at: Option<u64>,
    ) -> Granted<'a, RedisGrant> {
        self.stack().take_with_grant(request, cost, at)
    }

    fn refund<'a>(
        &'a self,
        request: &'a R,
        grant: RedisGrant,
    ) -> Pending<'a, Result<Outcome, limiter_stack::CallError>> {
        Refunds::refund(self.stack(), request, grant)
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
        if let Some(answer) = self.stack.local(key, cost, |answer| answer.decision()) {
            return Ok(answer);
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

    /// See [`LeasedStack::refund_idle_leases`].
    pub async fn refund_idle_leases(&self) -> u64 {
        self.stack.refund_idle_leases().await
    }

    /// See [`LeasedStack::refund_leases`].
    pub async fn refund_leases(&self) -> u64 {
        self.stack.refund_leases().await
    }

    /// See [`LeasedStack::stats`].
    pub fn stats(&self) -> LeaseStats {
        self.stack.stats()
    }
}
