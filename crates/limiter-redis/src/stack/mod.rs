//! [`RedisStack`]: layers of limits decided on Redis in one script per call, all or nothing;
//! [`RedisLimiter`]: the one-layer case, keyed by a string.
//!
//! # Keys
//!
//! Each limit of each layer is one Redis string holding the algorithm's state and the limit
//! that wrote it (64 bytes; [`RedisLimit::twin_state`] reads it as the Rust algorithm's word):
//! `<prefix>:{<stack>}:<layer>:<limit>[:<key>]` when the stack is its own hash tag (the
//! default), `<prefix>:<stack>:{<tag>}:<layer>:<limit>[:<key>]` with a tag from the request,
//! and `<prefix>:<stack>:{<key>}:<layer>:<limit>` when a one-layer stack is tagged by its key.
//! `<limit>` is the limit's index in its layer (`0`), so the key is named by what the caller
//! names, not by the limit's numbers: a call under a limit other than the one that wrote a
//! state rescales it (the same fraction of
//! the capacity stays in use, rounded up), as a stack's plans do in process. Every key of one
//! call carries the same hash tag, so they share a Redis Cluster slot and one script can decide
//! them.
//!
//! The stack's parts: `build.rs` (its layers and builder, the key placement), `call.rs` (a
//! call resolved to its keys, encoded for the script and its answer read back), `failure.rs`
//! (the failure policies and the local fallback), `limiter.rs` ([`RedisLimiter`]).

use core::fmt;
use std::collections::HashMap;
use std::sync::Arc;

use limiter_core::Clock;

use crate::backend::RedisBackend;
use crate::coalesce;
use crate::decision::RedisDecision;
use crate::error::{BackendError, CallError};
use crate::script::call::{Call, Mode};
use crate::script::reply::{self};
use crate::spec::RedisLimit;

/// The first part of every Redis key a stack, permits or a quota writes, unless changed.
pub(crate) const DEFAULT_PREFIX: &str = "limiter";
pub(crate) mod build;
mod call;
mod failure;
mod limiter;

pub use build::{RedisLayer, RedisStackBuilder};
pub(crate) use call::Prepared;
pub use failure::OnFailure;
pub use limiter::{RedisLimiter, RedisLimiterBuilder};

use build::Tag;
use failure::{local_stack, share};

type Keyer<R> = Arc<dyn limiter_stack::Keyer<R, String>>;
type Tagger<R> = Arc<dyn Fn(&R) -> String + Send + Sync>;
type Chooser<R> = limiter_stack::PlanChooser<R>;
type Fallback<R> = limiter_stack::Stack<R, String, Arc<dyn Clock>>;

struct LayerSpec<R> {
    name: String,
    keyer: Option<Keyer<R>>,
    /// Each plan's limits, as Redis decides them (every plan the same size).
    plans: Vec<Vec<RedisLimit>>,
    /// The plan function; `None`: the first plan, always.
    choose: Option<Chooser<R>>,
}

/// Layers of limits on Redis, decided in one script per call: admitted only if every limit of
/// every layer admits, and a denied call writes nothing.
pub struct RedisStack<R> {
    backend: RedisBackend,
    name: String,
    prefix: String,
    layers: Vec<LayerSpec<R>>,
    tag: Tag<R>,
    on_failure: OnFailure,
    fallback: Option<Fallback<R>>,
    /// This stack's identity, which its grants carry.
    token: Arc<()>,
    /// Paces the warning of a denied call across slots whose give back failed (a call's, while
    /// a master is down: one line every ten seconds, with the number not said since).
    refunds_failed: limiter_core::Paced,
}

impl<R> fmt::Debug for RedisStack<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStack")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field(
                "layers",
                &self.layers.iter().map(|l| &l.name).collect::<Vec<_>>(),
            )
            .field("on_failure", &self.on_failure)
            .finish_non_exhaustive()
    }
}

impl<R> RedisStack<R> {
    /// Decides one unit for `request`.
    pub async fn check(&self, request: &R) -> Result<RedisDecision, CallError> {
        self.check_n(request, 1).await
    }

    /// Decides `cost` units for `request` in one round trip. Cost 0 is a peek: every layer is
    /// reported and nothing changes.
    pub async fn check_n(&self, request: &R, cost: u64) -> Result<RedisDecision, CallError> {
        let call = self.prepare(request, cost)?;
        Ok(self.decide_prepared(request, &call).await.0)
    }

    /// Records `cost` units of usage that already happened for `request`, in one round trip
    /// (tokens a response used, bytes already sent): every layer is debited whatever it holds,
    /// none refuses, and a limit may be left in debt (up to twice its capacity in use), so
    /// later calls are denied until the debt is paid back at the limit's rate. The decision is
    /// allowed if every limit is still within itself; otherwise it binds on the one that went
    /// over, whose `retry_after` says when a call of one unit is admitted again. The deny
    /// cache never answers a record; a record past a limit enters it (for calls of any cost,
    /// until that wait). When Redis cannot decide, the failure policy answers: the fallback
    /// records on the local stack, fail open and fail closed record nothing.
    pub async fn record(&self, request: &R, cost: u64) -> Result<RedisDecision, CallError> {
        let call = self.prepare_record(request, cost);
        Ok(self.decide_prepared(request, &call).await.0)
    }

    /// Decides a prepared call in one round trip; with the script's time (us) when Redis
    /// decided it.
    pub(crate) async fn decide_prepared(
        &self,
        request: &R,
        call: &Prepared,
    ) -> (RedisDecision, Option<u64>) {
        self.ask_redis(request, call)
            .await
            .unwrap_or_else(|e| (self.on_failure_of(request, call, e), None))
    }

    /// [`decide_prepared`](Self::decide_prepared) without the failure policy: the decision
    /// (the deny cache's, or Redis's with its script time), or why Redis could not decide.
    pub(crate) async fn ask_redis(
        &self,
        request: &R,
        call: &Prepared,
    ) -> Result<(RedisDecision, Option<u64>), BackendError> {
        if let Some(early) = self.answer_locally(call) {
            return Ok((early, None));
        }
        if call.spans_slots() {
            return self.decide_across(request, call).await;
        }
        let sent = self.backend.sent();
        let (now_us, group) = self.send(call).await?;
        let decision = self.concluded(call, group, sent, true)?;
        Ok((decision.at(now_us), Some(now_us)))
    }

    /// Sends a call whose keys share a slot as one script call (sharing it with others queued
    /// meanwhile; see `coalesce.rs`): the script's time and the call's answer.
    pub(crate) async fn send(&self, call: &Prepared) -> crate::coalesce::Answered {
        let mut group = Call::new(Mode::Independent);
        self.encode(call, true, 0, &mut group);
        coalesce::decide(&self.backend, &call.keys, group, call.targets.len()).await
    }

    /// Decides many independent calls at once: each is all or nothing on its own, in order,
    /// and all of them take one round trip (on a cluster, one per hash tag, sent together).
    /// Each call gets its own result, in the order given.
    pub async fn check_many(&self, calls: &[(&R, u64)]) -> Vec<Result<RedisDecision, CallError>> {
        let mut results: Vec<Option<Result<RedisDecision, CallError>>> =
            (0..calls.len()).map(|_| None).collect();
        // Calls that need Redis, grouped by slot on a cluster (one group otherwise).
        let mut rounds: HashMap<Option<u16>, Vec<(usize, Prepared)>> = HashMap::new();
        let mut across = Vec::new();
        for (i, (request, cost)) in calls.iter().enumerate() {
            match self.prepare(request, *cost) {
                Err(e) => results[i] = Some(Err(e)),
                Ok(call) => match self.answer_locally(&call) {
                    Some(early) => results[i] = Some(Ok(early)),
                    // A call across slots is decided slot by slot, on its own.
                    None if call.spans_slots() => across.push((i, call)),
                    None => rounds.entry(call.slot).or_default().push((i, call)),
                },
            }
        }
        let sent = self.backend.sent();
        let trips = rounds.into_values().map(|round| async move {
            let mut args = Call::new(Mode::Independent);
            let mut keys = Vec::new();
            for (_, call) in &round {
                self.encode(call, true, keys.len(), &mut args);
                keys.extend(call.keys.iter().cloned());
            }
            args.note_keys(&keys);
            let sizes: Vec<usize> = round.iter().map(|(_, c)| c.targets.len()).collect();
            let answer = match self.backend.eval(&keys, args).await {
                Ok(value) => reply::parse(&value, &sizes),
                Err(e) => Err(e),
            };
            (round, answer)
        });
        let across = across.into_iter().map(|(i, call)| async move {
            let (request, _) = calls[i];
            (i, self.decide_prepared(request, &call).await.0)
        });
        let (answered, across) = futures_util::future::join(
            futures_util::future::join_all(trips),
            futures_util::future::join_all(across),
        )
        .await;
        for (i, decision) in across {
            results[i] = Some(Ok(decision));
        }
        for (round, answer) in answered {
            match answer {
                Ok((now_us, groups)) => {
                    for ((i, call), group) in round.into_iter().zip(groups) {
                        let (request, _) = calls[i];
                        let decision = self.conclude(request, &call, group, sent, true);
                        results[i] = Some(Ok(decision.at(now_us)));
                    }
                }
                Err(e) => {
                    for (i, call) in round {
                        let (request, _) = calls[i];
                        results[i] = Some(Ok(self.on_failure(request, call.cost, e.clone())));
                    }
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Ok(self.on_failure_without_request())))
            .collect()
    }

    /// The Redis keys a call for `request` reads and writes, one per limit, in layer order.
    pub fn redis_keys(&self, request: &R) -> Vec<String> {
        self.prepare(request, 0).map(|c| c.keys).unwrap_or_default()
    }

    /// The error a take of `cost` units for `request` answers before anything is sent (a cost
    /// above the burst of a limit it touches), found without a call to Redis; `Ok` when such
    /// a take can be decided. A batch's error does not say which call it came from: this
    /// finds it.
    pub fn check_cost(&self, request: &R, cost: u64) -> Result<(), CallError> {
        self.prepare(request, cost).map(drop)
    }

    /// The stack's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The backend the stack decides on.
    pub fn backend(&self) -> &RedisBackend {
        &self.backend
    }

    /// Whether a call's keys may span cluster slots: keys tagged by each layer's key, on a
    /// cluster, with more than one layer.
    pub(crate) fn may_span_slots(&self) -> bool {
        self.backend.is_cluster() && matches!(self.tag, Tag::Key) && self.layers.len() > 1
    }

    /// Whether a failed give back across slots is to be warned now (`Some`: how many were
    /// not since the last).
    pub(crate) fn refund_failure_due(&self) -> Option<u64> {
        self.refunds_failed.due()
    }

    /// This stack's identity, which its grants carry.
    pub(crate) fn token(&self) -> &Arc<()> {
        &self.token
    }

    /// Each layer's name and limits (its first plan's, for a layer of several), in stack
    /// order (the positions a [`LayerDecision`](limiter_stack::LayerDecision) names).
    pub fn layers(&self) -> impl Iterator<Item = (&str, &[RedisLimit])> {
        self.layers.iter().map(|layer| {
            let limits = layer.plans.first().map_or(&[][..], Vec::as_slice);
            (layer.name.as_str(), limits)
        })
    }

    /// Whether some layer chooses among several plans.
    pub(crate) fn has_plans(&self) -> bool {
        self.layers.iter().any(|layer| layer.plans.len() > 1)
    }

    /// Per layer in stack order, the name of the request key its keyer reads
    /// ([`Keyer::key_name`](limiter_stack::Keyer::key_name)); `None` for global layers and
    /// closures.
    pub fn key_names(&self) -> impl Iterator<Item = Option<&'static str>> {
        self.layers
            .iter()
            .map(|layer| layer.keyer.as_ref().and_then(|k| k.key_name()))
    }
}
