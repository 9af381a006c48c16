//! `[policies.*]`: each policy's limits (algorithm, count, period, burst, keying), checked
//! for the store they run on, its failure policy and its lease.

use limiter_core::text::{parse_percent, parse_period};
use limiter_core::{Limit, LimitError};
use limiter_redis::{Kind, LEASE_TTL_RANGE, Lease, OnFailure, RedisLimit, Slack};
use toml::Spanned;

use super::*;

/// A limit its algorithm accepts on the store it will run on. It is checked once, where it is
/// read (the file, an envoy descriptor, an ad-hoc request), and trusted from then on: the
/// engine builds stacks from it without checking again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckedLimit {
    kind: Kind,
    limit: Limit,
    store: StoreKind,
}

impl CheckedLimit {
    /// `limit` counted by `kind` on `store`, or why that store cannot count it.
    pub fn new(kind: Kind, limit: Limit, store: StoreKind) -> Result<Self, LimitError> {
        match store {
            StoreKind::Memory => kind.check(limit)?,
            StoreKind::Redis => {
                RedisLimit::new(kind, limit)?;
            }
        }
        Ok(Self { kind, limit, store })
    }

    /// The algorithm.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Count per period, burst.
    pub fn limit(&self) -> Limit {
        self.limit
    }

    /// The store it was checked for.
    pub fn store(&self) -> StoreKind {
        self.store
    }
}

/// How a limit is keyed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Keying {
    /// A state per identifier.
    Identifier,
    /// One state for every identifier.
    Global,
}

impl Keying {
    /// The name of the layer a policy's limits of this keying make (in metrics, headers and
    /// Redis keys).
    pub fn layer_name(self) -> &'static str {
        match self {
            Self::Identifier => "identifier",
            Self::Global => "global",
        }
    }
}

/// One limit of a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyLimit {
    /// The algorithm and its limit, checked for the store.
    pub limit: CheckedLimit,
    /// Per identifier or global.
    pub keying: Keying,
}

/// A named stack of limits, all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The limits, in the file's order.
    pub limits: Vec<PolicyLimit>,
    /// What the policy does when Redis fails (the store's unless set).
    pub on_failure: OnFailure,
    /// On Redis, decide against leases within this slack (`lease_slack`); ignored in memory,
    /// where every decision is local already.
    pub lease: Option<Lease>,
}

pub(super) fn parse_policy(
    source: &Source<'_>,
    name: &str,
    policy: &Spanned<RawPolicy>,
    default_failure: OnFailure,
    store: &Store,
) -> Result<Policy, ConfigError> {
    let raw = policy.get_ref();
    if raw.limits.get_ref().is_empty() {
        return Err(source.at(
            &raw.limits,
            format!("policy `{name}` has no limits: add one such as {{ algorithm = \"token_bucket\", count = 10, period = \"1s\" }}"),
        ));
    }
    let mut limits = Vec::new();
    for entry in raw.limits.get_ref() {
        let limit = parse_limit(source, name, entry, store)?;
        let same = limits
            .iter()
            .filter(|l: &&PolicyLimit| l.keying == limit.keying)
            .count();
        if same == MAX_LIMITS_PER_KEYING {
            return Err(source.at(
                entry,
                format!(
                    "policy `{name}` has more than {MAX_LIMITS_PER_KEYING} limits keyed the same way: merge some or split the policy"
                ),
            ));
        }
        limits.push(limit);
    }
    let on_failure = match &raw.on_failure {
        None => default_failure,
        Some(value) => parse_failure(source, value)?,
    };
    // While Redis is out, each of `fleet_size` processes falls back to its share of a limit.
    if let (Store::Redis { fleet_size, .. }, OnFailure::Fallback) = (store, on_failure) {
        for (entry, limit) in raw.limits.get_ref().iter().zip(&limits) {
            let limit = limit.limit.limit();
            let most = limit.count().min(limit.burst());
            if most < *fleet_size {
                return Err(source.at(
                    entry,
                    format!(
                        "policy `{name}`: {limit} cannot be shared by `fleet_size = {fleet_size}` processes while Redis is out (each would get 0); raise the count to {fleet_size} or more, lower `fleet_size` to {most}, or give the policy another `on_failure`"
                    ),
                ));
            }
        }
    }
    let lease = parse_lease(source, name, raw)?;
    if let (Some(lease), Some(slack)) = (&lease, &raw.lease_slack) {
        // A slack no lease can use on one of the policy's limits: refused here, with the
        // smallest (or largest) one that works, rather than silently per call.
        for limit in &limits {
            if let Some(reason) = lease.slack().refusal(limit.limit.limit().burst()) {
                return Err(source.at(
                    slack,
                    format!("policy `{name}`, limit {}: {reason}", limit.limit.limit()),
                ));
            }
        }
    }
    Ok(Policy {
        limits,
        on_failure,
        lease,
    })
}

/// `lease_slack` (`"N%"` of each limit, up to four decimals, or a whole number of units) and
/// `lease_ttl` (a period).
fn parse_lease(
    source: &Source<'_>,
    policy: &str,
    raw: &RawPolicy,
) -> Result<Option<Lease>, ConfigError> {
    let Some(slack) = &raw.lease_slack else {
        if let Some(ttl) = &raw.lease_ttl {
            return Err(source.at(
                ttl,
                format!("policy `{policy}`: `lease_ttl` without `lease_slack`; add `lease_slack = \"1%\"` (or remove `lease_ttl`)"),
            ));
        }
        return Ok(None);
    };
    let fix = "write a share of each limit such as \"1%\" or \"0.5%\", or a whole number of units such as 100";
    let slack_value =
        match slack.get_ref() {
            toml::Value::Integer(n) => u64::try_from(*n).map(Slack::units).map_err(|_| {
                source.at(
                    slack,
                    format!("policy `{policy}`: `lease_slack = {n}` is negative; {fix}"),
                )
            })?,
            toml::Value::String(text) => parse_percent(text)
                .map(Slack::PartsPerMillion)
                .ok_or_else(|| {
                    source.at(
                        slack,
                        format!("policy `{policy}`: `lease_slack = {text:?}`: {fix}"),
                    )
                })?,
            other => {
                return Err(source.at(
                    slack,
                    format!(
                        "policy `{policy}`: `lease_slack` is a {}: {fix}",
                        other.type_str()
                    ),
                ));
            }
        };
    let mut lease = Lease::new(slack_value);
    if let Some(ttl) = &raw.lease_ttl {
        let (least, most) = LEASE_TTL_RANGE;
        let period = parse_period(ttl.get_ref()).filter(|p| *p >= least && *p <= most);
        let Some(period) = period else {
            return Err(source.at(
                ttl,
                format!(
                    "policy `{policy}`: `lease_ttl = {:?}`: write a period from {least:?} to {most:?}, such as \"1s\"",
                    ttl.get_ref()
                ),
            ));
        };
        lease = lease.ttl(period);
    }
    Ok(Some(lease))
}

fn parse_limit(
    source: &Source<'_>,
    policy: &str,
    entry: &Spanned<RawLimit>,
    store: &Store,
) -> Result<PolicyLimit, ConfigError> {
    let raw = entry.get_ref();
    let kind: Kind = raw.algorithm.get_ref().parse().map_err(|e| {
        let given = raw.algorithm.get_ref();
        source.at(&raw.algorithm, format!("`algorithm = {given:?}`: {e}"))
    })?;
    let period = parse_period(raw.period.get_ref())
        .ok_or_else(|| source.at(&raw.period, format!("`period = {:?}`: write a whole number with a unit, such as \"500ms\", \"1s\", \"1m\", \"1h\" or \"1d\"", raw.period.get_ref())))?;
    let limit = Limit::new(*raw.count.get_ref(), period);
    let limit = match &raw.burst {
        None => limit,
        Some(burst) => {
            let with_burst = limit.with_burst(*burst.get_ref());
            if let Err(e @ LimitError::ZeroBurst) = with_burst.check() {
                return Err(source.at(burst, format!("policy `{policy}`: {e}")));
            }
            with_burst
        }
    };
    limit
        .check()
        .map_err(|e| source.at(&raw.count, format!("policy `{policy}`: {e}")))?;
    let keying = match raw.key.as_ref().map(|k| k.get_ref().as_str()) {
        None | Some("identifier") => Keying::Identifier,
        Some("global") => Keying::Global,
        Some(other) => {
            let key = raw.key.as_ref().map(Spanned::span);
            return Err(source.error(
                key,
                format!("`key = {other:?}`: use \"identifier\" (the default) or \"global\""),
            ));
        }
    };
    // The algorithm must accept the limit here, in process and, for a Redis store, on Redis.
    let limit = CheckedLimit::new(kind, limit, store.kind())
        .map_err(|e| source.at(entry, format!("policy `{policy}`: {e}")))?;
    Ok(PolicyLimit { limit, keying })
}
