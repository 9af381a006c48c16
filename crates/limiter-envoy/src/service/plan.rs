//! What each request descriptor asks of the [`Decider`]: its limit in the domain's tree (or
//! its override), the identifier it is counted under, and the rule's statistics.

use std::fmt::Write as _;

use limiter_stack::Kind;

use crate::decider::{Answer, Charge, Item, LimitSpec, RuleStats, Target};
use crate::rules::{RateLimit, Rule, Unit};

use super::*;

/// How a request descriptor is decided.
pub(super) enum Plan<'a, L, S> {
    /// No limit applies: `OK`.
    Free,
    /// `unlimited: true`: `OK` with `u32::MAX` left.
    Unlimited,
    /// Counted on the engine.
    Counted {
        item: Item<L>,
        shown: CurrentLimit,
        stats: Stats<'a, S>,
    },
    /// Hits given back (`is_negative_hits`): what the counter holds after, if it has one.
    GivenBack {
        shown: CurrentLimit,
        answer: Option<Answer>,
    },
    /// Over before counting: `requests_per_unit` is 0 (no counter: `item` is `None`), or the
    /// hits exceed it (the item that records them, as the reference counts them).
    Refused {
        shown: CurrentLimit,
        stats: Stats<'a, S>,
        item: Option<Item<L>>,
    },
}

/// What a matched limit reports besides its status: how it is enforced and where it is
/// counted in the metrics.
pub(super) struct Stats<'a, S> {
    /// The configured limit (`None` for a limit sent with the request).
    pub(super) limit: Option<&'a RateLimit>,
    /// `shadow_mode`: never denies.
    pub(super) shadow: bool,
    /// `quota_mode`: never denies; an over answer is named in the dynamic metadata.
    pub(super) quota: bool,
    /// The configured limit's statistics.
    pub(super) counters: Option<&'a S>,
    /// The metric name, where `value_to_metric` or `detailed_metric` makes one per value.
    pub(super) detailed_key: Option<String>,
}

impl<S> Stats<'_, S> {
    pub(super) fn adhoc() -> Self {
        Self {
            limit: None,
            shadow: false,
            quota: false,
            counters: None,
            detailed_key: None,
        }
    }
}

/// What the decider is asked to count for a configured limit: `None` for one that counts
/// nothing (`requests_per_unit: 0` refuses without a counter).
pub(super) fn spec_for(limit: &RateLimit) -> Option<LimitSpec> {
    Some(LimitSpec {
        kind: limit.kind,
        limit: limit.limit()?,
        lease: limit.lease,
    })
}

/// The counter key for a descriptor's entries: each key and value length-prefixed, so no two
/// different descriptors share one; an entry counted under its node's wildcard
/// (`share_threshold`) is written `*` and the pattern instead. A key longer than
/// [`MAX_KEY_BYTES`] is kept as its SHA-1.
pub(super) fn identifier(
    entries: &[(String, String)],
    shared: impl Fn(usize) -> Option<String>,
) -> String {
    let mut out = String::new();
    for (level, (key, value)) in entries.iter().enumerate() {
        match shared(level) {
            Some(pattern) => {
                let _ = write!(out, "{}:{key}*{}:{pattern}", key.len(), pattern.len());
            }
            None => {
                let _ = write!(out, "{}:{key}{}:{value}", key.len(), value.len());
            }
        }
    }
    if out.len() > MAX_KEY_BYTES {
        let digest = sha1_smol::Sha1::from(out.as_bytes()).digest();
        out = format!("sha1:{digest}");
    }
    out
}

/// The engine's (and Redis's) name for a configured limit's stack: envoy keys and values may
/// hold any character, Redis key parts may not hold `:` or braces, so the path is hashed
/// (FNV-1a, stable across processes and versions, so a fleet shares each counter).
pub(super) fn stack_name(full_key: &str) -> String {
    let hash = full_key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("envoy-{hash:016x}")
}

impl<L: Copy + PartialEq, S: RuleStats> Envoy<L, S> {
    pub(super) fn plan<'a>(
        &'a self,
        request: &Request,
        descriptor: &Descriptor,
    ) -> (Plan<'a, L, S>, &'a [String]) {
        let Some(domain) = self.domains.get(&request.domain) else {
            return (Plan::Free, &[]);
        };
        let hits = match descriptor.hits_addend {
            Some(hits) => hits,
            None => u64::from(request.hits_addend.max(1)),
        };
        // A limit sent with the descriptor replaces the configured one; one with no known unit
        // is ignored (the configured limit still applies, so junk cannot buy a way around it).
        if let Some(o) = descriptor.limit
            && let Some(unit) = Unit::from_number(o.unit)
        {
            return (
                sent_limit(request, descriptor, o.requests_per_unit, unit, hits),
                &[],
            );
        }
        let Some(matched) = domain.matched(&descriptor.entries) else {
            return (Plan::Free, &[]);
        };
        let limit = match matched.rule {
            Rule::Unlimited { replaces, .. } => return (Plan::Unlimited, replaces),
            Rule::Limited(limit) => limit,
        };
        let shown = CurrentLimit {
            name: limit.name.clone(),
            requests_per_unit: limit.requests_per_unit,
            unit: limit.unit,
        };
        let stats = Stats {
            limit: Some(limit),
            shadow: limit.shadow,
            quota: limit.quota_mode,
            counters: self
                .counters
                .get(&request.domain)
                .and_then(|c| c.get(limit.id)),
            detailed_key: matched.metric_key(&request.domain, &descriptor.entries),
        };
        let policy = self
            .policies
            .get(&request.domain)
            .and_then(|ids| ids.get(limit.id).copied().flatten());
        let item = policy.map(|policy| {
            let id = identifier(&descriptor.entries, |level| {
                matched
                    .shares(level)
                    .then(|| matched.path[level].value.clone().unwrap_or_default())
            });
            Item {
                target: Target::Limit(policy),
                identifier: id,
                cost: hits,
                // Neither a shadow nor a quota-mode limit denies the request.
                shadow: limit.shadow || limit.quota_mode || self.options.shadow_mode,
                charge: Charge::Take,
            }
        });
        let plan = match item {
            Some(item) if hits <= u64::from(limit.requests_per_unit) => {
                Plan::Counted { item, shown, stats }
            }
            item => Plan::Refused { shown, stats, item },
        };
        (plan, &limit.replaces)
    }
}

/// The plan of a limit sent with the descriptor, `requests_per_unit` per `unit`. Each unit
/// counts on its own counter, as the reference keys its counters by the unit's window: 10 a
/// day and then 42 an hour are two counters.
fn sent_limit<'a, L, S>(
    request: &Request,
    descriptor: &Descriptor,
    requests_per_unit: u32,
    unit: Unit,
    hits: u64,
) -> Plan<'a, L, S> {
    let shown = CurrentLimit {
        name: String::new(),
        requests_per_unit,
        unit,
    };
    let duration_ms = u64::try_from(unit.duration().as_millis()).unwrap_or(u64::MAX);
    let item = Item {
        target: Target::AdHoc {
            kind: Kind::FixedWindow,
            limit: u64::from(requests_per_unit),
            duration_ms,
            namespace: format!("envoy:{}:{}", request.domain, unit.name()),
        },
        identifier: identifier(&descriptor.entries, |_| None),
        cost: hits,
        shadow: false,
        charge: Charge::Take,
    };
    let stats = Stats::adhoc();
    if requests_per_unit == 0 {
        Plan::Refused {
            shown,
            stats,
            item: None,
        }
    } else if u64::from(requests_per_unit) < hits {
        Plan::Refused {
            shown,
            stats,
            item: Some(item),
        }
    } else {
        Plan::Counted { item, shown, stats }
    }
}
