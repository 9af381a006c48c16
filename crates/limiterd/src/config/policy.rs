//! `[policies.*]`: each policy's limits (algorithm, count, period, burst, keying), checked
//! for the store they run on, its failure policy and its lease.

use crate::store::{LEASE_TTL_RANGE, Lease, OnFailure, RedisLimit, Slack};
use limiter_calendar::{Calendar, CalendarError, CalendarUnit};
use limiter_core::text::{parse_percent, parse_period};
use limiter_core::{Limit, LimitError};
use limiter_stack::Kind;
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
    calendar: Option<CalendarSpec>,
}

/// A fixed window's calendar (`period = "1mo", calendar = "Europe/Berlin"`): its unit and a
/// zone the embedded IANA database has (checked when read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CalendarSpec {
    /// A day, a week from Monday, a month or a year.
    pub unit: CalendarUnit,
    /// `UTC` or an IANA zone's name.
    pub zone: &'static str,
}

impl CalendarSpec {
    /// The calendar.
    pub fn calendar(&self) -> Result<Calendar, CalendarError> {
        Calendar::new(self.unit, self.zone)
    }
}

/// `zone` for as long as the process runs: one copy per distinct zone named (at most the
/// database's few hundred, each checked against it first).
fn interned(zone: &str) -> &'static str {
    static ZONES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut zones = ZONES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(found) = zones.iter().find(|z| **z == zone) {
        return found;
    }
    let leaked: &'static str = Box::leak(zone.to_owned().into_boxed_str());
    zones.push(leaked);
    leaked
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
        Ok(Self {
            kind,
            limit,
            store,
            calendar: None,
        })
    }

    /// `count` per window of `calendar`, a fixed window (on Redis, a quota beside the stack).
    pub fn calendar_window(
        count: u64,
        calendar: CalendarSpec,
        store: StoreKind,
    ) -> Result<Self, LimitError> {
        let unsupported = |reason: String| LimitError::Unsupported {
            algorithm: "calendar window",
            reason,
        };
        if count == 0 || count > limiter_calendar::MAX_CALENDAR_COUNT {
            return Err(unsupported(format!(
                "{count} per {}: give 1 to {}",
                calendar.unit.period(),
                limiter_calendar::MAX_CALENDAR_COUNT
            )));
        }
        Ok(Self {
            kind: Kind::FixedWindow,
            limit: Limit::new(count, calendar.unit.nominal()),
            store,
            calendar: Some(calendar),
        })
    }

    /// The same limit checked for `store`.
    pub fn on_store(self, store: StoreKind) -> Result<Self, LimitError> {
        match self.calendar {
            Some(calendar) => Self::calendar_window(self.limit.count(), calendar, store),
            None => Self::new(self.kind, self.limit, store),
        }
    }

    /// A fixed window's calendar, when its windows are the calendar's.
    pub fn calendar(&self) -> Option<CalendarSpec> {
        self.calendar
    }

    /// Whether the limit is a calendar quota kept beside the stack (on Redis, where a stack's
    /// script knows no calendar) rather than one of its layers' limits.
    pub fn is_quota_beside_stack(&self) -> bool {
        self.calendar.is_some() && self.store == StoreKind::Redis
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

/// One limit of a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyLimit {
    /// The algorithm and its limit, checked for the store.
    pub limit: CheckedLimit,
    /// Per identifier or global.
    pub keying: Keying,
}

/// The longest time to live of a concurrency limit's permits (longer work should release and
/// take a new permit, or use a rate limit).
pub const MAX_PERMIT_TTL: std::time::Duration = crate::store::MAX_PERMIT_TTL;

/// How long a permit lives unless `ttl` says otherwise.
pub const DEFAULT_PERMIT_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// A named stack of limits, all or nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// The rate limits, in the file's order (none for a policy that limits concurrency only).
    pub limits: Vec<PolicyLimit>,
    /// At most this many calls in flight, decided with the rate limits, all or nothing.
    pub concurrency: Option<ConcurrencyLimit>,
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
    let (limits, concurrency) = parse_limits(source, name, raw, store)?;
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
    if lease.is_some() && concurrency.is_some() {
        let slack = raw.lease_slack.as_ref().map(Spanned::span);
        return Err(source.error(
            slack,
            format!("policy `{name}`: a lease and a concurrency limit: permits are taken on the store per call, so remove `lease_slack` or move the concurrency limit to a policy of its own"),
        ));
    }
    Ok(Policy {
        limits,
        concurrency,
        on_failure,
        lease,
    })
}

/// `{ algorithm = "fixed_window", count = N, period = "1mo", calendar = "Europe/Berlin" }`:
/// windows of a day, a week from Monday, a month or a year, starting at local midnight.
fn parse_calendar_limit(
    source: &Source<'_>,
    policy: &str,
    entry: &Spanned<RawLimit>,
    zone: &Spanned<String>,
    store: &Store,
) -> Result<PolicyLimit, ConfigError> {
    let raw = entry.get_ref();
    if raw.algorithm.get_ref() != "fixed_window" {
        return Err(source.at(&raw.algorithm, format!("policy `{policy}`: a `calendar` window is a fixed window: write `algorithm = \"fixed_window\"`")));
    }
    if let Some(burst) = &raw.burst {
        return Err(source.at(
            burst,
            format!("policy `{policy}`: a calendar window has no `burst`"),
        ));
    }
    let Some(period) = &raw.period else {
        return Err(source.at(entry, format!("policy `{policy}`: a calendar window needs a `period`: \"1d\", \"1w\", \"1mo\" or \"1y\"")));
    };
    let unit: CalendarUnit = period
        .get_ref()
        .parse()
        .map_err(|e: CalendarError| source.at(period, format!("policy `{policy}`: {e}")))?;
    Calendar::new(unit, zone.get_ref())
        .map_err(|e| source.at(zone, format!("policy `{policy}`: {e}")))?;
    let spec = CalendarSpec {
        unit,
        zone: interned(zone.get_ref()),
    };
    let limit = CheckedLimit::calendar_window(*raw.count.get_ref(), spec, store.kind())
        .map_err(|e| source.at(entry, format!("policy `{policy}`: {e}")))?;
    Ok(PolicyLimit {
        limit,
        keying: parse_keying(source, raw)?,
    })
}

/// `{ algorithm = "concurrency", count = N, ttl = "30s", key = "identifier" | "global" }`.
fn parse_concurrency(
    source: &Source<'_>,
    policy: &str,
    entry: &Spanned<RawLimit>,
) -> Result<ConcurrencyLimit, ConfigError> {
    let raw = entry.get_ref();
    if let Some(period) = &raw.period {
        return Err(source.at(period, format!("policy `{policy}`: a concurrency limit has no `period`: give `count` (permits held at once) and `ttl` (how long a permit lives unless released)")));
    }
    if let Some(burst) = &raw.burst {
        return Err(source.at(burst, format!("policy `{policy}`: a concurrency limit has no `burst`: give `count` (permits held at once) and `ttl`")));
    }
    let count = *raw.count.get_ref();
    if count == 0 || count > crate::store::MAX_PERMITS {
        return Err(source.at(
            &raw.count,
            format!(
                "policy `{policy}`: `count = {count}` permits: give 1 to {}",
                crate::store::MAX_PERMITS
            ),
        ));
    }
    let ttl = match &raw.ttl {
        None => DEFAULT_PERMIT_TTL,
        Some(ttl) => parse_period(ttl.get_ref())
            .filter(|p| !p.is_zero() && *p <= MAX_PERMIT_TTL)
            .ok_or_else(|| {
                source.at(
                    ttl,
                    format!(
                        "policy `{policy}`: `ttl = {:?}`: write a period from 1ms to {MAX_PERMIT_TTL:?}, such as \"30s\"",
                        ttl.get_ref()
                    ),
                )
            })?,
    };
    Ok(ConcurrencyLimit {
        count,
        ttl,
        keying: parse_keying(source, raw)?,
    })
}

fn parse_keying(source: &Source<'_>, raw: &RawLimit) -> Result<Keying, ConfigError> {
    match raw.key.as_ref().map(|k| k.get_ref().as_str()) {
        None | Some("identifier") => Ok(Keying::Identifier),
        Some("global") => Ok(Keying::Global),
        Some(other) => {
            let key = raw.key.as_ref().map(Spanned::span);
            Err(source.error(
                key,
                format!("`key = {other:?}`: use \"identifier\" (the default) or \"global\""),
            ))
        }
    }
}

/// A policy's `limits`: its rate limits, at most [`MAX_LIMITS_PER_KEYING`] per keying, and at
/// most one concurrency limit.
fn parse_limits(
    source: &Source<'_>,
    name: &str,
    raw: &RawPolicy,
    store: &Store,
) -> Result<(Vec<PolicyLimit>, Option<ConcurrencyLimit>), ConfigError> {
    let mut limits = Vec::new();
    let mut concurrency = None;
    for entry in raw.limits.get_ref() {
        if entry.get_ref().algorithm.get_ref() == "concurrency" {
            if concurrency.is_some() {
                return Err(source.at(
                    entry,
                    format!("policy `{name}` has two concurrency limits: keep one"),
                ));
            }
            concurrency = Some(parse_concurrency(source, name, entry)?);
            continue;
        }
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
    Ok((limits, concurrency))
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
    if let Some(zone) = &raw.calendar {
        return parse_calendar_limit(source, policy, entry, zone, store);
    }
    if let Some(ttl) = &raw.ttl {
        return Err(source.at(ttl, format!("policy `{policy}`: `ttl` belongs to a concurrency limit (`algorithm = \"concurrency\"`); a {} limit has a `period`", raw.algorithm.get_ref())));
    }
    let Some(raw_period) = &raw.period else {
        return Err(source.at(
            entry,
            format!(
                "policy `{policy}`: a {} limit needs a `period`, such as `period = \"1m\"`",
                raw.algorithm.get_ref()
            ),
        ));
    };
    let period = parse_period(raw_period.get_ref())
        .ok_or_else(|| source.at(raw_period, format!("`period = {:?}`: write a whole number with a unit, such as \"500ms\", \"1s\", \"1m\", \"1h\" or \"1d\" (a calendar month or year: `period = \"1mo\", calendar = \"UTC\"` or a zone, on a fixed window)", raw_period.get_ref())))?;
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
    let keying = parse_keying(source, raw)?;
    // The algorithm must accept the limit here, in process and, for a Redis store, on Redis.
    let limit = CheckedLimit::new(kind, limit, store.kind())
        .map_err(|e| source.at(entry, format!("policy `{policy}`: {e}")))?;
    Ok(PolicyLimit { limit, keying })
}
