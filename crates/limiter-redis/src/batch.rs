//! [`RedisBatch`]: many calls, of any stacks on one backend, decided all or nothing in one
//! script call.
//!
//! The script decides every call in order at one `TIME`, each on the state the earlier ones
//! left, and writes only if every enforced call admitted; otherwise it writes nothing and the
//! admitted calls report what they hold (a peek). A denied call never consumes, and no caller
//! can slip between a check and a take, because there is none. Shadow calls
//! ([`RedisBatch::add_shadow`]) are decided and counted like the rest but never block the
//! batch; records of usage ([`RedisBatch::add_record`]) are written whatever the batch's
//! answer and never block it.
//!
//! When Redis cannot decide, each call gets its stack's failure policy; fallback decisions
//! keep their grants, and if any enforced call is then refused every grant is given back, so
//! the batch is all or nothing on the local fallback too.

use std::collections::HashSet;

use limiter_stack::Grant;

use crate::backend::{RedisBackend, Sent};
use crate::decision::RedisDecision;
use crate::error::{BackendError, CallError};
use crate::keyslot::key_slot;
use crate::script::call::{Call, Mode};
use crate::script::reply::{self, GroupAnswer};
use crate::stack::{Prepared, RedisLimiter, RedisStack};

/// A batch that cannot be decided at all; nothing was sent to Redis and nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    /// One call cannot be decided (its cost exceeds a burst).
    #[error("call {index} of the batch: {source}")]
    Call {
        /// The call's position in the batch.
        index: usize,
        /// Why it cannot be decided.
        #[source]
        source: CallError,
    },
    /// A call's stack is on another backend than the batch's.
    #[error(
        "call {index} of the batch is on stack `{stack}`, which decides on another Redis backend; one batch is one script call on one backend, so batch that stack's calls on its own backend"
    )]
    OtherBackend {
        /// The call's position in the batch.
        index: usize,
        /// The call's stack.
        stack: String,
    },
    /// On a Redis Cluster, a call's keys are in another slot than the first call's.
    #[error(
        "call {index} of the batch has its keys in Redis Cluster slot {slot}, the batch's first call in slot {first}; one script call reaches one slot, so give the calls one hash tag (the stack's name, or `hash_tag_from`), or decide them apart with `check_many`"
    )]
    CrossSlot {
        /// The call's position in the batch.
        index: usize,
        /// The call's slot.
        slot: u16,
        /// The first call's slot.
        first: u16,
    },
}

/// The answer to a [`RedisBatch`]: whether it was admitted (every enforced call admitted, and
/// each took its units) and each call's decision, in the order added.
///
/// When the batch is refused, nothing was taken: a call marked allowed would have been
/// admitted on its own and reports what it holds after the batch, a denied call reports its
/// denial as decided in the batch's order (after the units the earlier calls would have taken).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchDecision {
    admitted: bool,
    decisions: Vec<RedisDecision>,
}

impl BatchDecision {
    /// Whether every enforced call was admitted, so that every call took its units.
    pub fn is_admitted(&self) -> bool {
        self.admitted
    }

    /// Each call's decision, in the order the calls were added.
    pub fn decisions(&self) -> &[RedisDecision] {
        &self.decisions
    }

    /// Each call's decision, owned.
    pub fn into_decisions(self) -> Vec<RedisDecision> {
        self.decisions
    }
}

struct Member<'a, R> {
    stack: &'a RedisStack<R>,
    request: &'a R,
    cost: u64,
    enforced: bool,
    /// A record of usage: never refused, never blocks the batch.
    record: bool,
}

/// Calls of any stacks on one [`RedisBackend`], decided all or nothing in one round trip: the
/// script writes only if every enforced call admits, shadow calls
/// ([`add_shadow`](Self::add_shadow)) never block, and when Redis cannot decide each call's
/// failure policy answers, all or nothing too. Made by [`RedisBackend::batch`].
///
/// ```no_run
/// use limiter_core::Limit;
/// use limiter_redis::{Kind, RedisBackend, RedisLimiter};
///
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
/// let seats = RedisLimiter::builder(&backend, "seats")
///     .limit(Kind::FixedWindow, Limit::per_hour(100))
///     .build()?;
/// // Two seats for ada and one for bob, or nothing.
/// let batch = seats.check_all(&[("ada", 2), ("bob", 1)]).await?;
/// println!("admitted: {}", batch.is_admitted());
/// # Ok(()) }
/// ```
pub struct RedisBatch<'a, R> {
    backend: &'a RedisBackend,
    members: Vec<Member<'a, R>>,
}

impl<R> std::fmt::Debug for RedisBatch<'_, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBatch")
            .field("calls", &self.members.len())
            .finish_non_exhaustive()
    }
}

impl RedisBackend {
    /// An empty all-or-nothing batch on this backend: add calls of any of its stacks, then
    /// [`decide`](RedisBatch::decide) them in one round trip.
    pub fn batch<R>(&self) -> RedisBatch<'_, R> {
        RedisBatch {
            backend: self,
            members: Vec::new(),
        }
    }
}

impl<R> RedisStack<R> {
    /// Decides several calls on this stack all or nothing, in one round trip: every call is
    /// admitted, or none takes anything (see [`RedisBatch`], which can also
    /// span stacks). On a cluster the calls must share a hash tag.
    ///
    /// # Errors
    /// [`BatchError`] when a call cannot be decided at all (its cost exceeds a burst, or its
    /// keys are in another cluster slot than the first call's); nothing was sent then.
    pub async fn check_all(&self, calls: &[(&R, u64)]) -> Result<BatchDecision, BatchError>
    where
        R: Sync,
    {
        let mut batch = self.backend().batch();
        for (request, cost) in calls {
            batch.add(self, request, *cost);
        }
        batch.decide().await
    }
}

impl RedisLimiter {
    /// Decides many `(key, cost)` calls all or nothing in one round trip: every call is
    /// admitted, or none takes anything. Keys are their own hash tags, so on a cluster the
    /// keys must share a slot (or the batch is refused with [`BatchError::CrossSlot`]).
    ///
    /// # Errors
    /// [`BatchError`] when a call cannot be decided at all; nothing was sent then.
    pub async fn check_all(&self, calls: &[(&str, u64)]) -> Result<BatchDecision, BatchError> {
        let owned: Vec<(String, u64)> = calls.iter().map(|(k, c)| ((*k).to_owned(), *c)).collect();
        let borrowed: Vec<(&String, u64)> = owned.iter().map(|(k, c)| (k, *c)).collect();
        self.stack().check_all(&borrowed).await
    }
}

impl<'a, R> RedisBatch<'a, R> {
    /// Adds `cost` units of `request` on `stack`; if it is denied, the batch is refused.
    pub fn add(&mut self, stack: &'a RedisStack<R>, request: &'a R, cost: u64) -> &mut Self {
        self.push(stack, request, cost, true)
    }

    /// Adds a shadow call: decided and, when the batch is admitted, counted like the others,
    /// but its denial does not refuse the batch (a limit being tried out).
    pub fn add_shadow(&mut self, stack: &'a RedisStack<R>, request: &'a R, cost: u64) -> &mut Self {
        self.push(stack, request, cost, false)
    }

    /// Adds a record of `cost` units of usage that already happened for `request` on `stack`
    /// (see [`RedisStack::record`]): decided in its place in the batch's order, written
    /// whatever the batch's answer (recorded again on the state before the batch if the batch
    /// is refused), and never refusing the batch.
    pub fn add_record(&mut self, stack: &'a RedisStack<R>, request: &'a R, cost: u64) -> &mut Self {
        self.members.push(Member {
            stack,
            request,
            cost,
            enforced: false,
            record: true,
        });
        self
    }

    fn push(
        &mut self,
        stack: &'a RedisStack<R>,
        request: &'a R,
        cost: u64,
        enforced: bool,
    ) -> &mut Self {
        self.members.push(Member {
            stack,
            request,
            cost,
            enforced,
            record: false,
        });
        self
    }

    /// How many calls the batch holds.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the batch holds no call.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// Decides every call in one round trip, all or nothing. Batches do not consult the deny
    /// cache: the script sees every call, so the answers are the calls' own.
    ///
    /// # Errors
    /// [`BatchError`] when a call cannot be decided at all; nothing was sent then.
    pub async fn decide(self) -> Result<BatchDecision, BatchError> {
        let mut calls = Vec::with_capacity(self.members.len());
        let mut first_slot = None;
        for (index, member) in self.members.iter().enumerate() {
            if !member.stack.backend().same_as(self.backend) {
                return Err(BatchError::OtherBackend {
                    index,
                    stack: member.stack.name().to_owned(),
                });
            }
            let call = if member.record {
                member.stack.prepare_record(member.request, member.cost)
            } else {
                member
                    .stack
                    .prepare(member.request, member.cost)
                    .map_err(|source| BatchError::Call { index, source })?
            };
            if self.backend.is_cluster()
                && let Some(key) = call.keys.first()
            {
                let slot = key_slot(key);
                match first_slot {
                    None => first_slot = Some(slot),
                    Some(first) if first != slot => {
                        return Err(BatchError::CrossSlot { index, slot, first });
                    }
                    Some(_) => {}
                }
            }
            calls.push(call);
        }
        if calls.iter().all(|c| c.keys.is_empty()) {
            let decisions = calls.iter().map(|_| no_layer()).collect();
            return Ok(BatchDecision {
                admitted: true,
                decisions,
            });
        }
        let sent = self.backend.sent();
        let mut args = Call::new(Mode::AllOrNothing);
        let mut keys = Vec::new();
        for (member, call) in self.members.iter().zip(&calls) {
            member
                .stack
                .encode(call, member.enforced, keys.len(), &mut args);
            keys.extend(call.keys.iter().cloned());
        }
        let sizes: Vec<usize> = calls.iter().map(Prepared::limits).collect();
        let answer = match self.backend.eval(&keys, args).await {
            Ok(value) => reply::parse(&value, &sizes),
            Err(e) => Err(e),
        };
        Ok(match answer {
            Ok((now_us, groups)) => self.conclude(&calls, groups, sent, now_us),
            Err(error) => self.on_failure(&calls, &error),
        })
    }

    /// The script's answers as decisions; denials enter the deny cache only when no earlier
    /// call of the batch touched their keys (otherwise they counted units never taken).
    fn conclude(
        &self,
        calls: &[Prepared],
        groups: Vec<GroupAnswer>,
        sent: Sent,
        now_us: u64,
    ) -> BatchDecision {
        let mut seen: HashSet<&str> = HashSet::new();
        let mut admitted = true;
        let mut decisions = Vec::with_capacity(calls.len());
        for ((member, call), group) in self.members.iter().zip(calls).zip(groups) {
            let remember = call.keys.iter().all(|k| !seen.contains(k.as_str()));
            seen.extend(call.keys.iter().map(String::as_str));
            let decision = match group {
                _ if call.keys.is_empty() => no_layer(),
                // The script refused this call alone (a key holding something else): it is
                // refused, and nothing of the batch was written if it was enforced.
                Err(reason) => RedisDecision::by_policy(false, BackendError::Script(reason)),
                Ok(answers) => member
                    .stack
                    .conclude(member.request, call, Ok(answers), sent, remember)
                    .at(now_us),
            };
            admitted &= decision.is_allowed() || !member.enforced;
            decisions.push(decision);
        }
        BatchDecision {
            admitted,
            decisions,
        }
    }

    /// Each call's failure policy, all or nothing: fallback grants come back if an enforced
    /// call is refused, and the fallback calls then report what they hold.
    fn on_failure(&self, calls: &[Prepared], error: &BackendError) -> BatchDecision {
        let now = self.backend.local_now();
        let mut admitted = true;
        let mut held: Vec<(RedisDecision, Option<Grant>)> = Vec::with_capacity(calls.len());
        for (member, call) in self.members.iter().zip(calls) {
            let (decision, grant) = if call.keys.is_empty() {
                (no_layer(), None)
            } else if member.record {
                // A record is no grant to give back: it stays recorded whatever the batch.
                let decision = member
                    .stack
                    .on_failure_of(member.request, call, error.clone());
                (decision, None)
            } else {
                member
                    .stack
                    .on_failure_held(member.request, member.cost, now, error.clone())
            };
            admitted &= decision.is_allowed() || !member.enforced;
            held.push((decision, grant));
        }
        let mut decisions = Vec::with_capacity(held.len());
        if admitted {
            decisions.extend(held.into_iter().map(|(d, _)| d));
        } else {
            for (member, (decision, grant)) in self.members.iter().zip(held) {
                if let Some(grant) = grant {
                    member.stack.refund_fallback(member.request, grant);
                }
                decisions.push(decision);
            }
            // Read after the refunds, which happen at the clock's reading then.
            let after = self.backend.local_now();
            for (member, decision) in self.members.iter().zip(&mut decisions) {
                if decision.is_allowed() && member.cost > 0 && !member.record {
                    member.stack.peek_fallback(member.request, after, decision);
                }
            }
        }
        BatchDecision {
            admitted,
            decisions,
        }
    }
}

fn no_layer() -> RedisDecision {
    RedisDecision::no_layer()
}
