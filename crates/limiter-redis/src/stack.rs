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

use core::fmt;
use std::collections::HashMap;
use std::sync::Arc;

use limiter_core::{Clock, Decision, Limit};
use limiter_stack::{Grant, LayerDecision, MAX_LAYERS, MAX_LIMITS_PER_LAYER, StackDecision};

use crate::backend::{RedisBackend, Sent};
use crate::coalesce;
use crate::decision::{RedisDecision, Source};
use crate::deny_cache::Denied;
use crate::error::{BackendError, BuildError, CallError};
use crate::keyslot::key_slot;
use crate::script::call::{Call, GroupKind, Mode};
use crate::script::reply::{self, GroupAnswer, LimitAnswer};
use crate::spec::{Kind, RedisLimit};

type Keyer<R> = Arc<dyn limiter_stack::Keyer<R, String>>;
type Tagger<R> = Arc<dyn Fn(&R) -> String + Send + Sync>;
type Fallback<R> = limiter_stack::Stack<R, String, Arc<dyn Clock>>;

/// What a limiter does when Redis fails, times out, or its circuit breaker is open.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnFailure {
    /// Admit the call ([`Source::FailOpen`]).
    Open,
    /// Refuse the call ([`Source::FailClosed`]); not reported as over the limit.
    Closed,
    /// Decide on a local in-memory stack with the same limits ([`Source::Fallback`]). By
    /// default each node then enforces the whole limit on its own, so a fleet of `n` admits up
    /// to `n` times it while Redis is out; give the builder the fleet's size
    /// ([`RedisStackBuilder::fleet_size`]) and each node enforces its share, `1/n` of each
    /// limit, so the fleet admits at most the limit between them (plus what Redis had admitted
    /// in the current window or burst before it went out).
    #[default]
    Fallback,
}

/// One layer of a [`RedisStack`]: keyed (per user, IP, API key) or global, with up to
/// [`MAX_LIMITS_PER_LAYER`] limits decided together.
pub struct RedisLayer<R> {
    name: String,
    keyer: Option<Keyer<R>>,
    limits: Vec<RedisLimit>,
    /// The first limit refused, reported by the stack's `build()`.
    refused: Option<BuildError>,
}

impl<R> RedisLayer<R> {
    /// A layer with one state per key; a request for which `keyer` returns `None` skips it.
    /// `keyer` is a closure `|r: &Request| Some(r.user.to_string())` or a
    /// [`Keyer`](limiter_stack::Keyer) that reads a named key (the middleware's
    /// `by_key_string("ip")`).
    pub fn keyed(
        name: impl Into<String>,
        keyer: impl limiter_stack::Keyer<R, String> + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            keyer: Some(Arc::new(keyer)),
            limits: Vec::new(),
            refused: None,
        }
    }

    /// A layer with one state shared by every request.
    pub fn global(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            keyer: None,
            limits: Vec::new(),
            refused: None,
        }
    }

    /// Adds `limit`, decided by `kind`. A limit that cannot be counted is reported once, by
    /// the stack's [`build`](RedisStackBuilder::build), naming the layer.
    pub fn limit(mut self, kind: Kind, limit: Limit) -> Self {
        match RedisLimit::new(kind, limit) {
            Ok(limit) => self.limits.push(limit),
            Err(source) => {
                self.refused.get_or_insert(BuildError::Limit {
                    layer: self.name.clone(),
                    source,
                });
            }
        }
        self
    }
}

impl<R> fmt::Debug for RedisLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLayer")
            .field("name", &self.name)
            .field("global", &self.keyer.is_none())
            .field("limits", &self.limits)
            .finish()
    }
}

enum Tag<R> {
    /// The stack's name: every key in one slot.
    Stack,
    /// A string from the request.
    Request(Tagger<R>),
    /// Each keyed layer's own key (a global layer's keys: the stack's name), so a stack's
    /// per-identifier traffic spreads over a cluster; a call whose layers land in different
    /// slots is decided slot by slot (`slots.rs`).
    Key,
}

/// Builds a [`RedisStack`]; see [`RedisStack::builder`].
pub struct RedisStackBuilder<R> {
    backend: RedisBackend,
    name: String,
    prefix: String,
    layers: Vec<RedisLayer<R>>,
    /// `None`: by each layer's key on a cluster, by the stack on one server.
    tag: Option<Tag<R>>,
    on_failure: OnFailure,
    fleet: u64,
}

impl<R: 'static> RedisStackBuilder<R> {
    /// Adds a layer; a call is admitted only if every layer admits it.
    pub fn layer(mut self, layer: RedisLayer<R>) -> Self {
        self.layers.push(layer);
        self
    }

    /// The first part of every key (default `limiter`), to share one Redis between services.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// What a call does when Redis fails (default [`OnFailure::Fallback`]).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.on_failure = on_failure;
        self
    }

    /// How many nodes share this stack's limits (default 1). While Redis is out, the local
    /// fallback ([`OnFailure::Fallback`]) of each node enforces `1/fleet` of every limit (count
    /// and burst, rounded down), so the fleet's nodes together admit at most the limit. A fleet
    /// that would leave a node no unit of some limit is refused by [`build`](Self::build).
    pub fn fleet_size(mut self, fleet: u64) -> Self {
        self.fleet = fleet;
        self
    }

    /// Tags each call's keys with `tag(request)` (a tenant, say), spreading a stack's keys over
    /// a Redis Cluster while each call's keys share a slot: one script decides it.
    pub fn hash_tag_from(mut self, tag: impl Fn(&R) -> String + Send + Sync + 'static) -> Self {
        self.tag = Some(Tag::Request(Arc::new(tag)));
        self
    }

    /// Tags each keyed layer's keys with that layer's key for the call, and a global layer's
    /// with the stack's name: a stack's per-identifier traffic spreads over every master of a
    /// Redis Cluster. The default on a cluster backend. A call whose layers land in different
    /// slots (a user layer and a global one, say) is decided slot by slot, all or nothing:
    /// see [`RedisStack`]'s "Across slots".
    pub fn tag_by_key(mut self) -> Self {
        self.tag = Some(Tag::Key);
        self
    }

    /// Tags every key with the stack's name: all of the stack's keys in one slot, so every
    /// call is one script (the default on one server, where slots do not matter). On a
    /// cluster, the stack then lives on one master.
    pub fn tag_by_stack(mut self) -> Self {
        self.tag = Some(Tag::Stack);
        self
    }

    /// Checks the stack and builds it, with its local fallback when the policy needs one.
    pub fn build(self) -> Result<RedisStack<R>, BuildError> {
        check_name("stack", &self.name, false)?;
        check_name("prefix", &self.prefix, true)?;
        if self.layers.is_empty() {
            return Err(BuildError::NoLayers { stack: self.name });
        }
        if self.layers.len() > MAX_LAYERS {
            return Err(BuildError::TooManyLayers {
                stack: self.name,
                count: self.layers.len(),
                max: MAX_LAYERS,
            });
        }
        let mut seen = std::collections::HashSet::new();
        for layer in &self.layers {
            check_name("layer", &layer.name, false)?;
            if !seen.insert(layer.name.as_str()) {
                return Err(BuildError::DuplicateLayer {
                    layer: layer.name.clone(),
                });
            }
            if let Some(refused) = &layer.refused {
                return Err(refused.clone());
            }
            if layer.limits.is_empty() {
                return Err(BuildError::NoLimits {
                    layer: layer.name.clone(),
                });
            }
            if layer.limits.len() > MAX_LIMITS_PER_LAYER {
                return Err(BuildError::TooManyLimits {
                    layer: layer.name.clone(),
                    count: layer.limits.len(),
                    max: MAX_LIMITS_PER_LAYER,
                });
            }
        }
        let tag = self.tag.unwrap_or(if self.backend.is_cluster() {
            Tag::Key
        } else {
            Tag::Stack
        });
        if self.fleet == 0 {
            share(&self.name, Limit::per_second(1), 0)?;
        }
        let fallback = match self.on_failure {
            OnFailure::Fallback => Some(local_stack(
                &self.name,
                &self.layers,
                &self.backend,
                self.fleet,
            )?),
            OnFailure::Open | OnFailure::Closed => None,
        };
        let layers = self
            .layers
            .into_iter()
            .map(|layer| LayerSpec {
                name: layer.name,
                keyer: layer.keyer,
                limits: layer.limits,
            })
            .collect();
        Ok(RedisStack {
            backend: self.backend,
            name: self.name,
            prefix: self.prefix,
            layers,
            tag,
            on_failure: self.on_failure,
            fallback,
            token: Arc::new(()),
        })
    }
}

impl<R> fmt::Debug for RedisStackBuilder<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStackBuilder")
            .field("name", &self.name)
            .field("prefix", &self.prefix)
            .field("layers", &self.layers)
            .field("on_failure", &self.on_failure)
            .field("fleet", &self.fleet)
            .finish_non_exhaustive()
    }
}

fn check_name(what: &'static str, name: &str, colons: bool) -> Result<(), BuildError> {
    let reason = if name.is_empty() {
        Some("is empty; give it a name")
    } else if name.contains(['{', '}']) {
        Some("contains `{` or `}`, which would change the Redis Cluster hash tag; remove them")
    } else if !colons && name.contains(':') {
        Some("contains `:`, which separates the parts of a Redis key; use another character")
    } else {
        None
    };
    reason.map_or(Ok(()), |reason| {
        Err(BuildError::BadName {
            what,
            name: name.to_owned(),
            reason,
        })
    })
}

/// A Redis layer's keyer, shared with its local fallback layer.
struct SharedKeyer<R>(Keyer<R>);

impl<R> limiter_stack::Keyer<R, String> for SharedKeyer<R> {
    fn key(&self, request: &R) -> Option<String> {
        self.0.key(request)
    }

    fn key_name(&self) -> Option<&'static str> {
        self.0.key_name()
    }
}

/// A node's share of `limit` in a fleet of `fleet`: count and burst divided, rounded down.
fn share(stack: &str, limit: Limit, fleet: u64) -> Result<Limit, BuildError> {
    let refused = |reason: String| BuildError::FleetSize {
        stack: stack.to_owned(),
        fleet,
        reason,
    };
    if fleet == 0 {
        return Err(refused("which counts no node; give 1 or more".to_owned()));
    }
    let (count, burst) = (limit.count() / fleet, limit.burst() / fleet);
    if count == 0 || burst == 0 {
        return Err(refused(format!(
            "which leaves each node no unit of {limit}; give a fleet size of at most {}, or a larger limit",
            limit.count().min(limit.burst())
        )));
    }
    Ok(Limit::from_nanos(count, limit.period_nanos()).with_burst(burst))
}

/// The in-memory stack with the same layers and each node's share of their limits, on the
/// backend's local clock.
fn local_stack<R: 'static>(
    stack: &str,
    layers: &[RedisLayer<R>],
    backend: &RedisBackend,
    fleet: u64,
) -> Result<Fallback<R>, BuildError> {
    let mut builder = limiter_stack::Stack::builder();
    for layer in layers {
        let mut local = match &layer.keyer {
            Some(keyer) => {
                let keyer = Arc::clone(keyer);
                limiter_stack::Layer::keyed(layer.name.clone(), SharedKeyer(keyer))
            }
            None => limiter_stack::Layer::global(layer.name.clone()),
        };
        for limit in &layer.limits {
            let shared = share(stack, limit.limit(), fleet)?;
            limit.kind().check(shared).map_err(|e| BuildError::Limit {
                layer: layer.name.clone(),
                source: limiter_core::LimitError::Unsupported {
                    algorithm: limit.kind().name(),
                    reason: format!("the local fallback cannot hold it: {e}"),
                },
            })?;
            local = local.limit(limit.kind(), shared);
        }
        builder = builder.layer(local);
    }
    builder
        .clock(backend.local_clock())
        .build()
        .map_err(|e| BuildError::NoLimits {
            layer: format!("(local fallback: {e})"),
        })
}

struct LayerSpec<R> {
    name: String,
    keyer: Option<Keyer<R>>,
    limits: Vec<RedisLimit>,
}

/// One limit a call touches.
#[derive(Clone, Copy, Debug)]
struct Target {
    layer: usize,
    limit: usize,
}

/// A call resolved to its keys: what the script needs, before any round trip.
#[derive(Clone)]
pub(crate) struct Prepared {
    pub(crate) cost: u64,
    /// Whether the call records usage that already happened (never refused, may leave a
    /// debt), rather than asking for units.
    pub(crate) record: bool,
    /// On a cluster, the one slot every key is in (`None` on one server, or across slots).
    pub(crate) slot: Option<u16>,
    /// On a cluster, whether the keys span slots.
    pub(crate) across_slots: bool,
    pub(crate) keys: Vec<String>,
    targets: Vec<Target>,
}

impl Prepared {
    /// How many limits the call touches (its group's size in the script's reply).
    pub(crate) fn limits(&self) -> usize {
        self.targets.len()
    }

    /// Whether the call's keys span cluster slots (never on one server).
    pub(crate) fn spans_slots(&self) -> bool {
        self.across_slots
    }

    /// The call in parts, one per cluster slot its keys are in, in the order the slots first
    /// appear; each part is a call of its own (its keys and limits in the call's order).
    pub(crate) fn by_slot(&self) -> Vec<Prepared> {
        let mut parts: Vec<(u16, Prepared)> = Vec::new();
        for (key, target) in self.keys.iter().zip(&self.targets) {
            let slot = key_slot(key);
            let at = match parts.iter().position(|(s, _)| *s == slot) {
                Some(at) => at,
                None => {
                    let part = Prepared {
                        cost: self.cost,
                        record: self.record,
                        slot: Some(slot),
                        across_slots: false,
                        keys: Vec::new(),
                        targets: Vec::new(),
                    };
                    parts.push((slot, part));
                    parts.len().saturating_sub(1)
                }
            };
            parts[at].1.keys.push(key.clone());
            parts[at].1.targets.push(*target);
        }
        parts.into_iter().map(|(_, part)| part).collect()
    }
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

impl<R: 'static> RedisStack<R> {
    /// A stack named `name` on `backend`; the name is part of every key.
    pub fn builder(backend: &RedisBackend, name: impl Into<String>) -> RedisStackBuilder<R> {
        RedisStackBuilder {
            backend: backend.clone(),
            name: name.into(),
            prefix: "limiter".to_owned(),
            layers: Vec::new(),
            tag: None,
            on_failure: OnFailure::default(),
            fleet: 1,
        }
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
        if let Some(early) = self.answer_locally(call) {
            return (early, None);
        }
        if call.spans_slots() {
            return self.decide_across(request, call).await;
        }
        let sent = self.backend.sent();
        match self.send(call).await {
            Ok((now_us, group)) => (
                self.conclude(request, call, group, sent, true).at(now_us),
                Some(now_us),
            ),
            Err(e) => (self.on_failure_of(request, call, e), None),
        }
    }

    /// Sends a call whose keys share a slot as one script call (sharing it with others queued
    /// meanwhile; see `coalesce.rs`): the script's time and the call's answer.
    pub(crate) async fn send(&self, call: &Prepared) -> crate::backend::Answered {
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
            let mut seen = std::collections::HashSet::with_capacity(keys.len());
            args.keys_distinct(keys.iter().all(|k| seen.insert(k.as_str())));
            let sizes: Vec<usize> = round.iter().map(|(_, c)| c.targets.len()).collect();
            let answer = match self.backend.eval(&keys, args).await {
                Ok(value) => reply::parse(&value, &sizes),
                Err(e) => Err(e),
            };
            (round, answer)
        });
        let across = across.into_iter().map(|(i, call)| async move {
            let (request, _) = calls[i];
            (i, self.decide_across(request, &call).await.0)
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

    /// This stack's identity, which its grants carry.
    pub(crate) fn token(&self) -> &Arc<()> {
        &self.token
    }

    /// Each layer's name and limits, in stack order (the positions a
    /// [`LayerDecision`] names).
    pub fn layers(&self) -> impl Iterator<Item = (&str, &[RedisLimit])> {
        self.layers
            .iter()
            .map(|layer| (layer.name.as_str(), layer.limits.as_slice()))
    }

    /// Per layer in stack order, the name of the request key its keyer reads
    /// ([`Keyer::key_name`](limiter_stack::Keyer::key_name)); `None` for global layers and
    /// closures.
    pub fn key_names(&self) -> impl Iterator<Item = Option<&'static str>> {
        self.layers
            .iter()
            .map(|layer| layer.keyer.as_ref().and_then(|k| k.key_name()))
    }

    /// Resolves a call's keys and checks its cost against every limit it touches.
    pub(crate) fn prepare(&self, request: &R, cost: u64) -> Result<Prepared, CallError> {
        self.resolve(request, cost, false)
    }

    /// Resolves a record's keys: any cost is recorded, so there is nothing to refuse.
    pub(crate) fn prepare_record(&self, request: &R, cost: u64) -> Prepared {
        // Without the burst checks, resolving cannot fail.
        self.resolve(request, cost, true)
            .unwrap_or_else(|_| Prepared {
                cost,
                record: true,
                slot: None,
                across_slots: false,
                keys: Vec::new(),
                targets: Vec::new(),
            })
    }

    fn resolve(&self, request: &R, cost: u64, record: bool) -> Result<Prepared, CallError> {
        let mut keys = Vec::new();
        let mut targets = Vec::new();
        let mut layer_keys: Vec<(usize, Option<String>)> = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            let key = match &layer.keyer {
                Some(keyer) => match keyer.key(request) {
                    Some(key) => Some(key),
                    None => continue,
                },
                None => None,
            };
            for (j, limit) in layer.limits.iter().enumerate() {
                if !record && cost > limit.burst() {
                    return Err(CallError::CostExceedsBurst {
                        layer: layer.name.clone(),
                        limit_index: j,
                        cost,
                        burst: limit.burst(),
                    });
                }
            }
            layer_keys.push((l, key));
        }
        let stack_head = format!("{}:{{{}}}", self.prefix, self.name);
        let request_head = match &self.tag {
            Tag::Request(tagger) => Some(format!(
                "{}:{}:{{{}}}",
                self.prefix,
                self.name,
                escape_tag(&tagger(request))
            )),
            Tag::Stack | Tag::Key => None,
        };
        for (l, key) in layer_keys {
            let layer = &self.layers[l];
            // `<head>:<layer>:<limit>`, then the layer's key unless the head is tagged by it.
            let (head, suffix) = match (&self.tag, &key) {
                (Tag::Key, Some(key)) => (format!("{}:{}:{{{key}}}", self.prefix, self.name), None),
                (Tag::Request(_), _) => (request_head.clone().unwrap_or_default(), key),
                _ => (stack_head.clone(), key),
            };
            for j in 0..layer.limits.len() {
                let mut name = format!("{head}:{}:{j}", layer.name);
                if let Some(key) = &suffix {
                    name.push(':');
                    name.push_str(key);
                }
                keys.push(name);
                targets.push(Target { layer: l, limit: j });
            }
        }
        let (slot, across_slots) = match keys.split_first() {
            Some((first, rest)) if self.backend.is_cluster() => {
                let slot = key_slot(first);
                if rest.iter().all(|k| key_slot(k) == slot) {
                    (Some(slot), false)
                } else {
                    (None, true)
                }
            }
            _ => (None, false),
        };
        Ok(Prepared {
            cost,
            record,
            slot,
            across_slots,
            keys,
            targets,
        })
    }

    /// An answer without a round trip: no layer applies, or the deny cache covers the call (a
    /// record always goes to Redis: usage is never refused).
    pub(crate) fn answer_locally(&self, call: &Prepared) -> Option<RedisDecision> {
        if call.targets.is_empty() {
            return Some(RedisDecision::new(
                true,
                StackDecision::from_layers([]),
                Source::NoLayer,
            ));
        }
        if call.record {
            return None;
        }
        let now = self.backend.local_now();
        let cache = self.backend.deny_cache();
        for (key, target) in call.keys.iter().zip(&call.targets) {
            let limit = self.layers[target.layer].limits[target.limit].script_fields();
            if let Some(denied) = cache.lookup(key, limit, call.cost, now) {
                self.backend.count_deny_cache_hit();
                let wait = denied.until.saturating_sub(now);
                let d = denied.decision;
                let decision =
                    Decision::deny(d.limit(), d.remaining(), wait.max(1), d.reset_after_nanos());
                let layer = LayerDecision {
                    layer: target.layer,
                    plan: 0,
                    limit_index: target.limit,
                    decision,
                    limit_reset_after_nanos: decision.reset_after_nanos(),
                };
                return Some(RedisDecision::new(
                    false,
                    StackDecision::from_layers([layer]),
                    Source::DenyCache,
                ));
            }
        }
        None
    }

    /// Appends a call's group to `args`: its cost, its kind (enforced, shadow or a record),
    /// then its limits; `offset` keys precede the call's own in the script's `KEYS`.
    pub(crate) fn encode(&self, call: &Prepared, enforced: bool, offset: usize, args: &mut Call) {
        let kind = match (call.record, enforced) {
            (true, _) => GroupKind::Record,
            (false, true) => GroupKind::Enforced,
            (false, false) => GroupKind::Shadow,
        };
        args.group(call.cost, kind, call.targets.len());
        self.encode_limits(call, offset, args);
    }

    /// Appends `call`'s limits to the group `args` is writing; `offset` keys precede the
    /// call's own in the script's `KEYS`.
    pub(crate) fn encode_limits(&self, call: &Prepared, offset: usize, args: &mut Call) {
        for (i, target) in call.targets.iter().enumerate() {
            let index = offset.saturating_add(i).saturating_add(1);
            args.limit(index, self.layers[target.layer].limits[target.limit].wire());
        }
    }

    /// Turns the script's answer for one call into a decision, and remembers denials in the
    /// deny cache when `remember` (a denial that counted a batch's earlier, unwritten groups
    /// is not the key's own).
    pub(crate) fn conclude(
        &self,
        request: &R,
        call: &Prepared,
        answer: GroupAnswer,
        sent: Sent,
        remember: bool,
    ) -> RedisDecision {
        let answers = match answer {
            Ok(answers) if answers.len() == call.targets.len() => answers,
            Ok(answers) => {
                let e = BackendError::BadReply(format!(
                    "{} answers for {} limits",
                    answers.len(),
                    call.targets.len()
                ));
                return self.on_failure_of(request, call, e);
            }
            Err(reason) => {
                return self.on_failure_of(request, call, BackendError::Script(reason));
            }
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        let mut start = 0;
        while start < call.targets.len() {
            let layer = call.targets[start].layer;
            let end = call.targets[start..]
                .iter()
                .position(|t| t.layer != layer)
                .map_or(call.targets.len(), |n| start + n);
            let decisions: Vec<Decision> = (start..end)
                .map(|i| {
                    to_decision(
                        &answers[i],
                        &self.layers[layer].limits[call.targets[i].limit],
                    )
                })
                .collect();
            layers.extend(LayerDecision::from_limits(layer, 0, &decisions));
            for (i, decision) in (start..end).zip(&decisions) {
                if remember && decision.is_denied() {
                    let until = sent.at.saturating_add(decision.retry_after_nanos());
                    let denied = Denied {
                        limit: self.layers[layer].limits[call.targets[i].limit].script_fields(),
                        until,
                        // A record in debt: its wait is for a call of one unit.
                        cost: if call.record { 1 } else { call.cost },
                        decision: *decision,
                    };
                    self.backend
                        .deny_cache()
                        .record(&call.keys[i], denied, sent.epoch);
                }
            }
            start = end;
        }
        let stack = StackDecision::from_layers(layers);
        RedisDecision::new(stack.is_allowed(), stack, Source::Redis)
    }

    /// Appends a lease group for `call` (mode 3): `head` (the cost, the units wanted ahead,
    /// the units handed back), the lease's time to live, then per limit its fields, its
    /// ledger's `KEYS` index (the ledgers follow the call's keys) and its slack in units, read
    /// from `slack` by layer and limit index.
    pub(crate) fn encode_lease(
        &self,
        call: &Prepared,
        head: [u64; 3],
        ttl_ms: u64,
        slack: &[Vec<u64>],
        args: &mut Call,
    ) {
        let n = call.targets.len();
        args.lease_group(head, ttl_ms, n);
        for (i, target) in call.targets.iter().enumerate() {
            args.limit(
                i.saturating_add(1),
                self.layers[target.layer].limits[target.limit].wire(),
            );
            let ledger = n.saturating_add(i).saturating_add(1);
            args.ledger(ledger, slack[target.layer][target.limit]);
        }
    }

    /// Each limit a call touches, as its layer and its burst (a layer's limits in a row):
    /// what a decision made locally against a lease reports, per layer the smallest.
    pub(crate) fn target_bursts<'a>(
        &'a self,
        call: &'a Prepared,
    ) -> impl Iterator<Item = (usize, u64)> + 'a {
        call.targets.iter().map(|target| {
            let burst = self.layers[target.layer].limits[target.limit].burst();
            (target.layer, burst)
        })
    }

    /// Writes what names `request`'s state into `out`: each layer's key (or that it is
    /// skipped), and the request's hash tag when the stack is tagged by requests. Two requests
    /// with the same identity touch the same Redis keys.
    pub(crate) fn identity(&self, request: &R, out: &mut String) {
        use fmt::Write as _;
        if let (Tag::Key, [layer]) = (&self.tag, self.layers.as_slice()) {
            // Tagged by its one layer's key: the key alone (a `RedisLimiter`).
            if let Some(key) = layer.keyer.as_ref().and_then(|k| k.key(request)) {
                out.push_str(&key);
            }
            return;
        }
        if let Tag::Request(tagger) = &self.tag {
            let tag = tagger(request);
            let _ = write!(out, "{}:{tag}", tag.len());
        }
        for layer in &self.layers {
            match &layer.keyer {
                Some(keyer) => match keyer.key(request) {
                    Some(key) => {
                        let _ = write!(out, "/{}:{key}", key.len());
                    }
                    None => out.push('-'),
                },
                None => out.push('*'),
            }
        }
    }

    /// The smallest burst of any limit: a cost above it is refused by `prepare`.
    pub(crate) fn least_burst(&self) -> u64 {
        self.layers
            .iter()
            .flat_map(|layer| layer.limits.iter().map(RedisLimit::burst))
            .min()
            .unwrap_or(0)
    }

    /// The failure policy's answer for `call`: as [`on_failure`](Self::on_failure) for a
    /// check; for a record, the fallback records on the local stack, and fail open and fail
    /// closed record nothing.
    pub(crate) fn on_failure_of(
        &self,
        request: &R,
        call: &Prepared,
        error: BackendError,
    ) -> RedisDecision {
        if !call.record {
            return self.on_failure(request, call.cost, error);
        }
        match (&self.fallback, self.on_failure) {
            (Some(local), OnFailure::Fallback) => match local.record(request, call.cost) {
                Ok(stack) => RedisDecision::new(stack.is_allowed(), stack, Source::Fallback(error)),
                Err(_) => self.on_failure(request, call.cost, error),
            },
            _ => self.on_failure(request, call.cost, error),
        }
    }

    /// The failure policy's answer.
    pub(crate) fn on_failure(&self, request: &R, cost: u64, error: BackendError) -> RedisDecision {
        tracing::debug!(
            target: "limiter_redis::stack",
            stack = %self.name,
            policy = ?self.on_failure,
            error = %error,
            "Redis could not decide: the failure policy answers"
        );
        let empty = || StackDecision::from_layers([]);
        match (&self.fallback, self.on_failure) {
            (Some(local), OnFailure::Fallback) => match local.check_n(request, cost) {
                Ok(stack) => RedisDecision::new(stack.is_allowed(), stack, Source::Fallback(error)),
                Err(_) => RedisDecision::new(false, empty(), Source::FailClosed(error)),
            },
            (_, OnFailure::Open) => RedisDecision::new(true, empty(), Source::FailOpen(error)),
            _ => RedisDecision::new(false, empty(), Source::FailClosed(error)),
        }
    }

    /// The failure policy's answer for one member of an all-or-nothing batch, at the local
    /// clock reading `now`: a fallback decision keeps its [`Grant`], so a batch another member
    /// denied can give it back.
    pub(crate) fn on_failure_held(
        &self,
        request: &R,
        cost: u64,
        now: u64,
        error: BackendError,
    ) -> (RedisDecision, Option<Grant>) {
        let empty = || StackDecision::from_layers([]);
        match (&self.fallback, self.on_failure) {
            (Some(local), OnFailure::Fallback) => match local.decide_at(request, cost, now) {
                Ok((stack, grant)) => (
                    RedisDecision::new(stack.is_allowed(), stack, Source::Fallback(error)),
                    grant,
                ),
                Err(_) => (
                    RedisDecision::new(false, empty(), Source::FailClosed(error)),
                    None,
                ),
            },
            (_, OnFailure::Open) => (
                RedisDecision::new(true, empty(), Source::FailOpen(error)),
                None,
            ),
            _ => (
                RedisDecision::new(false, empty(), Source::FailClosed(error)),
                None,
            ),
        }
    }

    /// Gives back everything `grant` holds on the local fallback (a fallback batch another
    /// member denied).
    pub(crate) fn refund_fallback(&self, request: &R, mut grant: Grant) {
        if let Some(local) = &self.fallback {
            let units = grant.left();
            // A grant from this very stack, with its own units: the refund cannot fail.
            let _ = local.refund(request, &mut grant, units);
        }
    }

    /// Replaces a fallback decision by what `request` holds on the local fallback at `now` (a
    /// peek), once a denied batch's grants are back.
    pub(crate) fn peek_fallback(&self, request: &R, now: u64, decision: &mut RedisDecision) {
        if let (Some(local), Source::Fallback(e)) = (&self.fallback, decision.source())
            && let Ok((peek, _)) = local.decide_at(request, 0, now)
        {
            *decision = RedisDecision::new(true, peek, Source::Fallback(e.clone()));
        }
    }

    fn on_failure_without_request(&self) -> RedisDecision {
        let error = BackendError::BadReply("the batch lost a call".to_owned());
        RedisDecision::new(
            false,
            StackDecision::from_layers([]),
            Source::FailClosed(error),
        )
    }
}

/// A limit's answer as a [`Decision`], times from microseconds to nanoseconds.
fn to_decision(answer: &LimitAnswer, limit: &RedisLimit) -> Decision {
    let ns = |us: u64| us.saturating_mul(1_000);
    if answer.allowed {
        Decision::allow(limit.burst(), answer.remaining, ns(answer.reset_after_us))
    } else {
        Decision::deny(
            limit.burst(),
            answer.remaining,
            ns(answer.retry_after_us).max(1),
            ns(answer.reset_after_us),
        )
    }
}

/// A request's tag with `{`, `}` and `%` percent-encoded: the tag then ends at the `}` this
/// crate writes, and distinct tags stay distinct.
fn escape_tag(tag: &str) -> String {
    let mut out = String::with_capacity(tag.len());
    for c in tag.chars() {
        match c {
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
    out
}

/// A limiter of one layer keyed by a string, with up to four limits on each key (10 per second
/// and 100 per minute, say), decided on Redis. Each key is its own hash tag, so keys spread over
/// a Redis Cluster.
#[derive(Debug)]
pub struct RedisLimiter {
    stack: RedisStack<String>,
}

/// Builds a [`RedisLimiter`]; see [`RedisLimiter::builder`].
#[derive(Debug)]
pub struct RedisLimiterBuilder {
    stack: RedisStackBuilder<String>,
    layer: RedisLayer<String>,
}

impl RedisLimiter {
    /// A limiter named `name` (part of its keys) on `backend`.
    pub fn builder(backend: &RedisBackend, name: impl Into<String>) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            stack: RedisStack::builder(backend, name).tag_by_key(),
            layer: RedisLayer::keyed("key", |key: &String| Some(key.clone())),
        }
    }

    /// Decides one unit for `key`.
    pub async fn check(&self, key: &str) -> Result<RedisDecision, CallError> {
        self.stack.check_n(&key.to_owned(), 1).await
    }

    /// Decides `cost` units for `key` (0 peeks).
    pub async fn check_n(&self, key: &str, cost: u64) -> Result<RedisDecision, CallError> {
        self.stack.check_n(&key.to_owned(), cost).await
    }

    /// Records `cost` units of usage that already happened for `key` in one round trip (see
    /// [`RedisStack::record`]): never refused, it may leave the key in debt.
    pub async fn record(&self, key: &str, cost: u64) -> Result<RedisDecision, CallError> {
        self.stack.record(&key.to_owned(), cost).await
    }

    /// Decides many independent `(key, cost)` calls in one round trip (one per key on a
    /// cluster, sent together).
    pub async fn check_many(&self, calls: &[(&str, u64)]) -> Vec<Result<RedisDecision, CallError>> {
        let owned: Vec<(String, u64)> = calls.iter().map(|(k, c)| ((*k).to_owned(), *c)).collect();
        let borrowed: Vec<(&String, u64)> = owned.iter().map(|(k, c)| (k, *c)).collect();
        self.stack.check_many(&borrowed).await
    }

    /// The Redis keys `key`'s state lives in, one per limit.
    pub fn redis_keys(&self, key: &str) -> Vec<String> {
        self.stack.redis_keys(&key.to_owned())
    }

    /// The one-layer stack behind the limiter, owned.
    pub fn into_stack(self) -> RedisStack<String> {
        self.stack
    }

    /// The one-layer stack behind the limiter (requests are the keys), to add its calls to a
    /// [`RedisBatch`](crate::RedisBatch) with other stacks' or as shadow calls.
    pub fn stack(&self) -> &RedisStack<String> {
        &self.stack
    }

    /// The backend the limiter decides on.
    pub fn backend(&self) -> &RedisBackend {
        self.stack.backend()
    }
}

impl RedisLimiterBuilder {
    /// Adds `limit`, decided by `kind`, to every key. A limit that cannot be counted is
    /// reported once, by [`build`](Self::build).
    pub fn limit(mut self, kind: Kind, limit: Limit) -> Self {
        self.layer = self.layer.limit(kind, limit);
        self
    }

    /// The first part of every key (default `limiter`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.stack = self.stack.prefix(prefix);
        self
    }

    /// What a call does when Redis fails (default [`OnFailure::Fallback`]).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.stack = self.stack.on_failure(on_failure);
        self
    }

    /// How many nodes share the limits while Redis is out (default 1); see
    /// [`RedisStackBuilder::fleet_size`].
    pub fn fleet_size(mut self, fleet: u64) -> Self {
        self.stack = self.stack.fleet_size(fleet);
        self
    }

    /// Checks the limits and builds the limiter.
    pub fn build(self) -> Result<RedisLimiter, BuildError> {
        Ok(RedisLimiter {
            stack: self.stack.layer(self.layer).build()?,
        })
    }
}
