//! Envoy's `ShouldRateLimit`, decided on a [`Decider`]: each request descriptor finds its limit
//! in the domain's tree (or carries its own override), and the request is all or nothing: if
//! any enforced descriptor is over its limit, the answer is `OVER_LIMIT` and no counter that
//! is within its limit moves (envoy's reference server counts every descriptor even when
//! another one is already over, so a blocked caller burns shared quota; here it does not).
//!
//! Hits on a counter they take over its limit are counted as the reference counts them: the
//! counter goes over (a debt: every later check of it is over until its window ends, or, for a
//! token bucket or sliding window, until the debt is paid back). That is envoy's
//! check-then-charge pattern (a check with `hits_addend: 0` on the request path, the usage
//! charged on the response path, where the answer is ignored): usage that already happened is
//! never dropped. A check is over only while its counter is over its limit: exactly at the
//! limit it is `OK` with nothing left, as there.
//!
//! A descriptor in `shadow_mode` is evaluated and counted in the metrics
//! (`result="shadow_denied"`) but is always answered `OK` and never denies the request.
//!
//! This module is protocol-free: `crate::grpc` (feature `grpc`) and [`crate::json`] (the
//! HTTP `POST /json` endpoint of the service mounting this crate) translate their wire forms
//! to [`Request`] and from [`Response`].
//!
//! Its parts: `plan.rs` (what each descriptor asks of the decider), `decide.rs` (the
//! request decided all or nothing, over hits counted, negative hits given back),
//! `answer.rs` (statuses, headers and metadata as the reference sends them).

use std::collections::HashMap;
use std::time::Duration;

use limiter_core::LimitError;

pub use crate::decider::EnvoyError;
use crate::decider::{AddLimitError, Decider};
use crate::rules::{Domains, Unit};
pub use crate::settings::{HeaderNames, Options};

mod answer;
mod decide;
mod plan;

use decide::Outcome;
use plan::{Plan, Stats, spec_for, stack_name};

/// The most descriptors one request is decided for: a request with more is answered
/// `OVER_LIMIT` for every descriptor, counting nothing (never an error, which envoy's default
/// `failure_mode_deny: false` would let through unlimited).
pub const MAX_DESCRIPTORS: usize = 4_096;
/// A counter key (a descriptor's entries, length-prefixed) longer than this is kept as its
/// SHA-1 instead, so a long value costs no more memory than a short one.
pub const MAX_KEY_BYTES: usize = 512;

/// A `ShouldRateLimit` request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Which domain's descriptors.
    pub domain: String,
    /// What to decide, all or nothing.
    pub descriptors: Vec<Descriptor>,
    /// Units each descriptor takes (0 means 1), unless it says otherwise.
    pub hits_addend: u32,
}

/// One request descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// `(key, value)` entries, outermost first.
    pub entries: Vec<(String, String)>,
    /// A limit sent by envoy, used instead of the configured one.
    pub limit: Option<Override>,
    /// Units this descriptor takes, overriding the request's (0 only reports).
    pub hits_addend: Option<u64>,
    /// `is_negative_hits`: the hits are given back to the descriptor's counter instead of
    /// taken (units taken earlier and not used), never above full.
    pub negative_hits: bool,
}

/// A limit sent with a descriptor (`RateLimitOverride`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Override {
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit's protocol number (0 or junk is refused).
    pub unit: i32,
}

/// `OK` or `OVER_LIMIT`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// Admitted.
    Ok,
    /// Over a limit.
    OverLimit,
}

impl Code {
    /// The protocol's number (`OK` is 1, `OVER_LIMIT` 2).
    pub fn number(self) -> i32 {
        match self {
            Code::Ok => 1,
            Code::OverLimit => 2,
        }
    }

    /// The protocol's name.
    pub fn name(self) -> &'static str {
        match self {
            Code::Ok => "OK",
            Code::OverLimit => "OVER_LIMIT",
        }
    }
}

/// The limit a descriptor was decided by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CurrentLimit {
    /// The configured name (empty if none).
    pub name: String,
    /// Requests per unit.
    pub requests_per_unit: u32,
    /// The unit.
    pub unit: Unit,
}

/// One descriptor's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// `OK` or `OVER_LIMIT`.
    pub code: Code,
    /// The limit, if one applied.
    pub current_limit: Option<CurrentLimit>,
    /// Units left (`u32::MAX` for an unlimited descriptor).
    pub limit_remaining: u32,
    /// Admitted: until the limit is whole again; over: until this request would fit.
    pub duration_until_reset: Option<Duration>,
}

/// The answer to a request.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// `OVER_LIMIT` if any enforced descriptor is (`OK` under global shadow mode).
    pub overall: Code,
    /// One status per request descriptor, in order.
    pub statuses: Vec<Status>,
    /// Headers for envoy to add to the client's response (`response_headers_to_add`), when
    /// [`Options::headers`] enables them.
    pub headers: Vec<(String, String)>,
    /// `dynamic_metadata`: the request's descriptors when [`Options::dynamic_metadata`] is
    /// set, and `quotaModeEnabled` / `quotaModeViolations` when a `quota_mode` limit matched.
    pub dynamic_metadata: Option<serde_json::Map<String, serde_json::Value>>,
}

/// The loaded domains, with each configured limit counted by a [`Decider`] whose limits are
/// `L` and whose statistics are `S` (its [`Decider::Limit`] and [`Decider::Stats`]).
pub struct Envoy<L, S> {
    domains: Domains,
    /// Per domain, the decider's handle of each limit, by [`RateLimit::id`](crate::rules::RateLimit::id).
    /// `None` for a limit of `requests_per_unit: 0`, which refuses without a counter.
    policies: HashMap<String, Vec<Option<L>>>,
    /// Per domain, each limit's statistics, by [`RateLimit::id`](crate::rules::RateLimit::id).
    counters: HashMap<String, Vec<S>>,
    options: Options,
}

impl<L, S> std::fmt::Debug for Envoy<L, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Envoy")
            .field("domains", &self.domains)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<L, S> Default for Envoy<L, S> {
    fn default() -> Self {
        Self {
            domains: Domains::default(),
            policies: HashMap::new(),
            counters: HashMap::new(),
            options: Options::default(),
        }
    }
}

/// Why envoy's domains could not be attached to the decider: a descriptor's limit, where it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The store cannot count the limit.
    #[error("{location}: {source}")]
    Limit {
        /// `file:line` of the descriptor.
        location: String,
        /// Why.
        #[source]
        source: LimitError,
    },
    /// The decider refused the limit.
    #[error("{location}: {source}")]
    Refused {
        /// `file:line` of the descriptor.
        location: String,
        /// Why.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl<L, S> Envoy<L, S> {
    /// Envoy's `domains`, with every configured limit that counts added to `decider`
    /// (`requests_per_unit: 0` refuses without a counter), in [`Domains::iter`] and
    /// [`crate::Domain::limits`] order, named `envoy:<full key>` in the metrics.
    pub fn attach<D: Decider<Limit = L, Stats = S>>(
        domains: Domains,
        decider: &mut D,
    ) -> Result<Self, AttachError> {
        let mut policies = HashMap::new();
        let mut counters = HashMap::new();
        for domain in domains.iter() {
            let mut ids = Vec::new();
            let mut stats = Vec::new();
            for limit in domain.limits() {
                stats.push(decider.rule_stats(&limit.full_key));
                let location = || limit.location.to_string();
                let id = match spec_for(limit) {
                    None => None,
                    Some(spec) => {
                        let name = format!("envoy:{}", limit.full_key);
                        let added = decider.add_limit(&name, &stack_name(&limit.full_key), &spec);
                        Some(added.map_err(|e| match e {
                            AddLimitError::Limit(source) => AttachError::Limit {
                                location: location(),
                                source,
                            },
                            AddLimitError::Refused(source) => AttachError::Refused {
                                location: location(),
                                source,
                            },
                        })?)
                    }
                };
                ids.push(id);
            }
            policies.insert(domain.name.clone(), ids);
            counters.insert(domain.name.clone(), stats);
        }
        Ok(Self {
            domains,
            policies,
            counters,
            options: Options::default(),
        })
    }

    /// With service-wide `options`.
    #[must_use]
    pub fn with_options(mut self, options: Options) -> Self {
        self.options = options;
        self
    }

    /// The service-wide options.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The loaded domains.
    pub fn domains(&self) -> &Domains {
        &self.domains
    }

    /// Refuses only what the reference refuses: no domain, or no descriptors. Everything else
    /// is decided (an entry with an empty key, or a descriptor with no entries, matches no
    /// limit, as there).
    fn check(request: &Request) -> Result<(), EnvoyError> {
        if request.domain.is_empty() {
            return Err(EnvoyError::Empty(
                "domain: rate limit domain must not be empty: send the domain your descriptors are configured under".into(),
            ));
        }
        if request.descriptors.is_empty() {
            return Err(EnvoyError::Empty(
                "descriptors: rate limit descriptor list must not be empty: send at least one descriptor".into(),
            ));
        }
        Ok(())
    }
}
