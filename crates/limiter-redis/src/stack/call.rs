//! A call resolved to its keys ([`Prepared`]: one per limit, the slot they share or that
//! they span), encoded for the script, and the script's answer read back as a decision.

use core::fmt;

use limiter_core::Decision;
use limiter_stack::{LayerAnswers, LayerDecision};

use super::*;
use crate::backend::Sent;
use limiter_stack::Origin;

use crate::decision::{Answered, RedisDecision};
use crate::deny_cache::Denied;
use crate::error::{BackendError, CallError};
use crate::keyslot::key_slot;
use crate::script::call::{Call, GroupKind};
use crate::script::reply::{GroupAnswer, LimitAnswer};
use crate::spec::RedisLimit;

/// One limit a call touches.
#[derive(Clone, Copy, Debug)]
pub(super) struct Target {
    pub(super) layer: usize,
    /// The plan its layer chose for the call.
    pub(super) plan: usize,
    pub(super) limit: usize,
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
    pub(super) targets: Vec<Target>,
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

impl<R> RedisStack<R> {
    /// The limit a call's target names.
    fn limit_of(&self, target: &Target) -> &RedisLimit {
        &self.layers[target.layer].plans[target.plan][target.limit]
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
        let layer_keys = self.layers_applying(request, cost, record)?;
        let (keys, targets) = self.keys_of_limits(request, layer_keys);
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

    /// The layers that apply to `request` (a keyed layer whose key is missing does not), each
    /// as (layer, the plan it chose, its key); a chosen plan that does not exist, or (unless
    /// recording) a cost above a limit's burst, is an error naming the layer.
    fn layers_applying(
        &self,
        request: &R,
        cost: u64,
        record: bool,
    ) -> Result<Vec<(usize, usize, Option<String>)>, CallError> {
        let mut layer_keys = Vec::with_capacity(self.layers.len());
        for (l, layer) in self.layers.iter().enumerate() {
            let key = match &layer.keyer {
                Some(keyer) => match keyer.key(request) {
                    Some(key) => Some(key),
                    None => continue,
                },
                None => None,
            };
            let plan = layer.choose.as_ref().map_or(0, |choose| choose(request));
            let Some(limits) = layer.plans.get(plan) else {
                return Err(CallError::NoSuchPlan {
                    layer: layer.name.clone(),
                    chosen: plan,
                    plans: layer.plans.len(),
                });
            };
            for (j, limit) in limits.iter().enumerate() {
                if !record && cost > limit.burst() {
                    return Err(CallError::Decision {
                        layer: layer.name.clone(),
                        limit_index: j,
                        source: limiter_core::DecisionError::CostExceedsBurst {
                            cost,
                            burst: limit.burst(),
                        },
                    });
                }
            }
            layer_keys.push((l, plan, key));
        }
        Ok(layer_keys)
    }

    /// Every limit's Redis key, `<head>:<layer>:<limit>` then the layer's key unless the head
    /// is tagged by it, with the limit each names.
    fn keys_of_limits(
        &self,
        request: &R,
        layer_keys: Vec<(usize, usize, Option<String>)>,
    ) -> (Vec<String>, Vec<Target>) {
        let mut keys = Vec::new();
        let mut targets = Vec::new();
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
        for (l, plan, key) in layer_keys {
            let layer = &self.layers[l];
            let (head, suffix) = match (&self.tag, &key) {
                (Tag::Key, Some(key)) => (format!("{}:{}:{{{key}}}", self.prefix, self.name), None),
                (Tag::Request(_), _) => (request_head.clone().unwrap_or_default(), key),
                _ => (stack_head.clone(), key),
            };
            // Named by the limit's place, never by the plan: a changed plan finds the key and
            // the script rescales it.
            for j in 0..layer.plans[plan].len() {
                let mut name = format!("{head}:{}:{j}", layer.name);
                if let Some(key) = &suffix {
                    name.push(':');
                    name.push_str(key);
                }
                keys.push(name);
                targets.push(Target {
                    layer: l,
                    plan,
                    limit: j,
                });
            }
        }
        (keys, targets)
    }

    /// An answer without a round trip: no layer applies, or the deny cache covers the call (a
    /// record always goes to Redis: usage is never refused).
    pub(crate) fn answer_locally(&self, call: &Prepared) -> Option<RedisDecision> {
        if call.targets.is_empty() {
            return Some(RedisDecision::no_layer());
        }
        if call.record {
            return None;
        }
        let now = self.backend.local_now();
        for (key, target) in call.keys.iter().zip(&call.targets) {
            let limit = self.limit_of(target).script_fields();
            if let Some(denied) = self.backend.denied(key, limit, call.cost, now) {
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
                    LayerAnswers::from_layers([layer]),
                    Answered::Decided(Origin::DenyCache, None),
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
            args.limit(index, self.limit_of(target).wire());
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
        self.concluded(call, answer, sent, remember)
            .unwrap_or_else(|e| self.on_failure_of(request, call, e))
    }

    /// [`conclude`](Self::conclude) without the failure policy: the decision, or why the
    /// script's answer is none (the caller asks the policy).
    pub(crate) fn concluded(
        &self,
        call: &Prepared,
        answer: GroupAnswer,
        sent: Sent,
        remember: bool,
    ) -> Result<RedisDecision, BackendError> {
        match answer {
            Ok(answers) if answers.len() == call.targets.len() => {
                Ok(self.decided(call, &answers, sent, remember))
            }
            Ok(answers) => Err(BackendError::BadReply(format!(
                "{} answers for {} limits",
                answers.len(),
                call.targets.len()
            ))),
            Err(reason) => Err(BackendError::Script(reason)),
        }
    }

    /// Redis's answers to `call` (one per limit it touches) as a decision, each denial
    /// remembered in the deny cache when `remember` says so.
    pub(crate) fn decided(
        &self,
        call: &Prepared,
        answers: &[LimitAnswer],
        sent: Sent,
        remember: bool,
    ) -> RedisDecision {
        let mut layers = Vec::with_capacity(self.layers.len());
        let mut start = 0;
        while start < call.targets.len() {
            let layer = call.targets[start].layer;
            let end = call.targets[start..]
                .iter()
                .position(|t| t.layer != layer)
                .map_or(call.targets.len(), |n| start + n);
            let decisions: Vec<Decision> = (start..end)
                .map(|i| to_decision(&answers[i], self.limit_of(&call.targets[i])))
                .collect();
            layers.extend(LayerDecision::from_limits(layer, 0, &decisions));
            for (i, decision) in (start..end).zip(&decisions) {
                if remember && decision.is_denied() {
                    let until = sent.at.saturating_add(decision.retry_after_nanos());
                    let denied = Denied {
                        limit: self.limit_of(&call.targets[i]).script_fields(),
                        until,
                        // A record in debt: its wait is for a call of one unit.
                        cost: if call.record { 1 } else { call.cost },
                        decision: *decision,
                    };
                    self.backend
                        .remember_denial(&call.keys[i], denied, sent.epoch);
                }
            }
            start = end;
        }
        RedisDecision::decided(LayerAnswers::from_layers(layers), Origin::Remote)
    }

    /// Appends a lease group for `call` (mode 3): `head` (the cost, the units wanted ahead,
    /// the units refunded, the units of the live lease kept), the lease's time to live, then
    /// per limit its fields, its
    /// ledger's `KEYS` index (the ledgers follow the call's keys) and its slack in units, read
    /// from `slack` by layer and limit index.
    pub(crate) fn encode_lease(
        &self,
        call: &Prepared,
        head: [u64; 4],
        ttl_ms: u64,
        slack: &[Vec<u64>],
        args: &mut Call,
    ) {
        let n = call.targets.len();
        args.lease_group(head, ttl_ms, n);
        for (i, target) in call.targets.iter().enumerate() {
            args.limit(i.saturating_add(1), self.limit_of(target).wire());
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
            let burst = self.limit_of(target).burst();
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
            .flat_map(|layer| layer.plans.iter().flatten().map(RedisLimit::burst))
            .min()
            .unwrap_or(0)
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
