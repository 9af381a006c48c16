//! The script calls behind a lease: a renewal (refund what is left, take the cost and the
//! next lease, in one mode-3 call), a hand-back, and releasing idle or all leases.

use core::time::Duration;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError, RwLock};

use limiter_core::{LeaseCell, LeaseSpend, MAX_LEASE_UNITS};

use crate::backend::Sent;
use crate::decision::RedisDecision;
use crate::error::{BackendError, CallError};
use crate::script::call::{Call, Mode};
use crate::script::reply;
use crate::stack::{Prepared, RedisStack};

use super::*;

impl<R> LeasedStack<R> {
    /// Decides a call the lease here did not: takes the next lease in one script call
    /// (refunding what is left of this one), or, with no slack, decides per call.
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
        let local = |answer| local_answer(entry.layers, answer, &entry.known, now);
        match entry.cell.spend(cost, now) {
            LeaseSpend::Spent { left } => return local(Ok(left)),
            LeaseSpend::Denied { until } => return local(Err(until.saturating_sub(now).max(1))),
            LeaseSpend::Ask => {}
        }
        let ttl = duration_nanos(shared.lease.time_to_live());
        let old = entry.cell.close();
        let refunded = LeaseCell::units_of(old);
        let want = meta.next_want(refunded, now, ttl, shared.most);
        let sent = backend.sent();
        let (keys, args) = self.lease_call(call, [cost, want, refunded, 0]);
        // Relaxed: a statistic.
        shared.renewals.fetch_add(1, Ordering::Relaxed);
        let reply = backend.eval_as(&keys, args, Some(&meta.field)).await;
        let answer = match reply {
            Ok(value) => reply::parse_leases(&value, &[call.limits()]),
            Err(e) => Err(e),
        };
        match answer {
            Ok((now_us, mut groups)) if groups.len() == 1 => match groups.pop() {
                Some((lease, Ok(answers))) => {
                    // Relaxed: a statistic.
                    shared.refunded.fetch_add(refunded, Ordering::Relaxed);
                    self.take(
                        entry,
                        meta,
                        lease.units,
                        &answers,
                        (&sent, now_us),
                        request,
                        call,
                    )
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
        let ttl = duration_nanos(shared.lease.time_to_live());
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
                entry.granted(lease);
                meta.granted = lease;
                meta.granted_at = sent.at;
                // Relaxed: a statistic.
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
    /// wanted, the units refunded and the units of the live lease kept (renewing ahead).
    pub(super) fn lease_call(&self, call: &Prepared, head: [u64; 4]) -> (Vec<String>, Call) {
        let shared = &*self.shared;
        let mut keys = call.keys.clone();
        keys.extend(call.keys.iter().map(|k| format!("{k}:lease")));
        let mut args = Call::new(Mode::Lease);
        let ttl_ms = u64::try_from(shared.lease.time_to_live().as_millis()).unwrap_or(u64::MAX);
        shared
            .stack
            .encode_lease(call, head, ttl_ms, &shared.slack, &mut args);
        (keys, args)
    }

    /// Hands back `entry`'s lease (the caller holds its renewal lock). Returns the units.
    async fn refund_lease(&self, entry: &Entry, meta: &mut Meta) -> u64 {
        let units = LeaseCell::units_of(entry.cell.close());
        meta.granted = 0;
        if units == 0 {
            return 0;
        }
        let (keys, args) = self.lease_call(&meta.call, [0, 0, units, 0]);
        let backend = self.shared.stack.backend();
        // Relaxed: a statistic.
        self.shared.renewals.fetch_add(1, Ordering::Relaxed);
        let answered = match backend.eval_as(&keys, args, Some(&meta.field)).await {
            Ok(value) => reply::parse_leases(&value, &[meta.call.limits()])
                .is_ok_and(|(_, groups)| groups.iter().all(|(_, answer)| answer.is_ok())),
            Err(_) => false,
        };
        if !answered {
            // Not refunded: the units are lost, never spent.
            return 0;
        }
        // Relaxed: a statistic.
        self.shared.refunded.fetch_add(units, Ordering::Relaxed);
        units
    }

    /// Hands back every lease nobody spent from since the previous call, and forgets keys
    /// that hold nothing. Returns the units refunded. The idle sweep calls it every half
    /// time to live.
    pub async fn refund_idle_leases(&self) -> u64 {
        self.refund_held(false).await
    }

    /// Hands back every lease this node holds (call it before the process exits; leases not
    /// refunded are lost until they expire). Returns the units refunded.
    pub async fn refund_leases(&self) -> u64 {
        self.refund_held(true).await
    }

    async fn refund_held(&self, all: bool) -> u64 {
        let now = self.shared.stack.backend().local_now();
        let mut returned = 0u64;
        for shard in self.shared.shards.iter() {
            let entries: Vec<(Box<str>, Arc<Entry>)> = read_lock(shard)
                .iter()
                .map(|(k, e)| (k.clone(), Arc::clone(e)))
                .collect();
            for (identity, entry) in entries {
                let word = entry.cell.load();
                // Relaxed: the sweep's own reading; the lease word itself is `LeaseCell`'s.
                let idle = entry.seen.swap(word, Ordering::Relaxed) == word;
                if !LeaseCell::holds_units(word, now) {
                    // Holds nothing (or a denial, or an expired lease): forget the key, unless
                    // a caller is renewing it.
                    if let Ok(mut meta) = entry.renewal.try_lock() {
                        let hash = self.shared.hasher.hash_one(&*identity);
                        let mut shard = write_lock(shard);
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
                    returned = returned.saturating_add(self.refund_lease(&entry, &mut meta).await);
                }
            }
        }
        returned
    }
}

pub(super) fn unreachable_reply<R>(stack: &RedisStack<R>, request: &R, cost: u64) -> RedisDecision {
    let error = BackendError::BadReply("a lease call answered for another number of calls".into());
    stack.on_failure(request, cost, error)
}

pub(super) fn duration_nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

pub(super) fn read_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    // A shard's map is valid after any panic: each change is one insert or remove.
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn write_lock<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}
