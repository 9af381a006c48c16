//! Envoy's `ShouldRateLimit`, decided on the engine: each request descriptor finds its limit
//! in the domain's tree (or carries its own override), and the request is all or nothing: if
//! any enforced descriptor is over its limit, the answer is `OVER_LIMIT` and no descriptor's
//! counter moves (envoy's reference server counts every descriptor even when another one is
//! already over, so a blocked caller burns shared quota; here it does not).
//!
//! A descriptor in `shadow_mode` is evaluated and counted in the metrics
//! (`result="shadow_denied"`) but is always answered `OK` and never denies the request.
//!
//! This module is protocol-free: `crate::grpc` (feature `server`) and the HTTP `POST /json`
//! endpoint translate their wire forms to [`Request`] and from [`Response`].

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::Duration;

use limiter_core::{Clock, Decision, LimitError};
use limiter_redis::Kind;

use super::rules::{Domains, RateLimit, Rule, Unit};
use crate::config::{CheckedLimit, Keying, Policy, PolicyLimit, StoreKind};
use crate::engine::{DecideError, Engine, EngineError, Item, PolicyId, Target};

/// The most descriptors one request may carry.
pub const MAX_DESCRIPTORS: usize = 64;
/// The most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 32;
/// The longest domain, key or value, in bytes.
pub const MAX_TEXT: usize = 1_024;

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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// `OVER_LIMIT` if any enforced descriptor is.
    pub overall: Code,
    /// One status per request descriptor, in order.
    pub statuses: Vec<Status>,
}

/// A request that cannot be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvoyError {
    /// The request is malformed (gRPC `INVALID_ARGUMENT`, HTTP 400); names the field.
    #[error("{0}")]
    Invalid(String),
    /// The store failed and the policy refuses, or is full (gRPC `UNAVAILABLE`, HTTP 503).
    #[error("{0}")]
    Unavailable(String),
}

/// The loaded domains, with each configured limit's policy in the engine.
#[derive(Debug, Default)]
pub struct Envoy {
    domains: Domains,
    /// Per domain, the engine policy of each limit, by [`RateLimit::id`].
    /// `None` for a limit of `requests_per_unit: 0`, which refuses without a counter.
    policies: HashMap<String, Vec<Option<PolicyId>>>,
}

/// How a request descriptor is decided.
enum Plan<'a> {
    /// No limit applies: `OK`.
    Free,
    /// `unlimited: true`: `OK` with `u32::MAX` left.
    Unlimited,
    /// Counted on the engine.
    Counted {
        item: Item,
        shown: CurrentLimit,
        replaces: &'a [String],
    },
    /// Over before counting: `requests_per_unit` is 0, or the hits exceed it.
    Refused { shown: CurrentLimit, shadow: bool },
}

/// Why envoy's domains could not be attached to the engine: a descriptor's limit, where it is.
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
    /// The limit's stack was refused.
    #[error("{location}: {source}")]
    Engine {
        /// `file:line` of the descriptor.
        location: String,
        /// Why.
        #[source]
        source: EngineError,
    },
}

/// The engine policy for a configured limit (one layer, keyed by the descriptor's values):
/// `None` for a limit that counts nothing, or why the store cannot count it.
fn policy_for(
    limit: &RateLimit,
    on_failure: limiter_redis::OnFailure,
    store: StoreKind,
) -> Option<Result<Policy, LimitError>> {
    let checked = CheckedLimit::new(limit.kind, limit.limit()?, store);
    Some(checked.map(|limit| Policy {
        limits: vec![PolicyLimit {
            limit,
            keying: Keying::Identifier,
        }],
        on_failure,
    }))
}

/// The counter key for a descriptor's entries: each key and value length-prefixed, so no two
/// different descriptors share one.
fn identifier(entries: &[(String, String)]) -> String {
    let mut out = String::new();
    for (key, value) in entries {
        let _ = write!(out, "{}:{key}{}:{value}", key.len(), value.len());
    }
    out
}

/// The engine's (and Redis's) name for a configured limit's stack: envoy keys and values may
/// hold any character, Redis key parts may not hold `:` or braces, so the path is hashed
/// (FNV-1a, stable across processes and versions, so a fleet shares each counter).
fn stack_name(full_key: &str) -> String {
    let hash = full_key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("envoy-{hash:016x}")
}

fn invalid(field: &str, message: impl std::fmt::Display) -> EnvoyError {
    EnvoyError::Invalid(format!("{field}: {message}"))
}

impl Envoy {
    /// Envoy's `domains`, with a policy on `engine` for every configured limit that counts
    /// (`requests_per_unit: 0` refuses without a counter), in [`Domains::iter`] and
    /// [`super::Domain::limits`] order, counted in the metrics as `envoy:<full key>`. A limit's
    /// failure policy is the store's.
    pub fn attach<C: Clock + Clone + Send + Sync + 'static>(
        domains: Domains,
        engine: &mut Engine<C>,
    ) -> Result<Self, AttachError> {
        let on_failure = engine.default_failure();
        let store = engine.store_kind();
        let mut policies = HashMap::new();
        for domain in domains.iter() {
            let mut ids = Vec::new();
            for limit in domain.limits() {
                let located = |source| AttachError::Engine {
                    location: limit.location.to_string(),
                    source,
                };
                let id = match policy_for(limit, on_failure, store) {
                    None => None,
                    Some(Err(e)) => {
                        return Err(AttachError::Limit {
                            location: limit.location.to_string(),
                            source: e,
                        });
                    }
                    Some(Ok(policy)) => Some(
                        engine
                            .add_policy(
                                &format!("envoy:{}", limit.full_key),
                                &stack_name(&limit.full_key),
                                &policy,
                            )
                            .map_err(located)?,
                    ),
                };
                ids.push(id);
            }
            policies.insert(domain.name.clone(), ids);
        }
        Ok(Self { domains, policies })
    }

    /// The loaded domains.
    pub fn domains(&self) -> &Domains {
        &self.domains
    }

    fn check(request: &Request) -> Result<(), EnvoyError> {
        if request.domain.is_empty() {
            return Err(invalid(
                "domain",
                "is empty: send the domain your descriptors are configured under",
            ));
        }
        if request.domain.len() > MAX_TEXT {
            return Err(invalid(
                "domain",
                format!("is longer than {MAX_TEXT} bytes"),
            ));
        }
        if request.descriptors.is_empty() || request.descriptors.len() > MAX_DESCRIPTORS {
            return Err(invalid(
                "descriptors",
                format!(
                    "send 1 to {MAX_DESCRIPTORS} descriptors, not {}",
                    request.descriptors.len()
                ),
            ));
        }
        for (i, d) in request.descriptors.iter().enumerate() {
            let field = format!("descriptors[{i}].entries");
            if d.entries.is_empty() || d.entries.len() > MAX_ENTRIES {
                return Err(invalid(
                    &field,
                    format!("send 1 to {MAX_ENTRIES} entries, not {}", d.entries.len()),
                ));
            }
            for (j, (key, value)) in d.entries.iter().enumerate() {
                if key.is_empty() {
                    return Err(invalid(&format!("{field}[{j}].key"), "is empty"));
                }
                if key.len() > MAX_TEXT || value.len() > MAX_TEXT {
                    return Err(invalid(
                        &format!("{field}[{j}]"),
                        format!("a key or value is longer than {MAX_TEXT} bytes"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn plan<'a>(
        &'a self,
        request: &Request,
        index: usize,
        descriptor: &Descriptor,
    ) -> Result<Plan<'a>, EnvoyError> {
        let Some(domain) = self.domains.get(&request.domain) else {
            return Ok(Plan::Free);
        };
        let hits = match descriptor.hits_addend {
            Some(hits) => hits,
            None => u64::from(request.hits_addend.max(1)),
        };
        let id = identifier(&descriptor.entries);
        if let Some(o) = descriptor.limit {
            let unit = Unit::from_number(o.unit).ok_or_else(|| {
                invalid(
                    &format!("descriptors[{index}].limit.unit"),
                    format!("{} is not a unit: send SECOND to YEAR", o.unit),
                )
            })?;
            let shown = CurrentLimit {
                name: String::new(),
                requests_per_unit: o.requests_per_unit,
                unit,
            };
            if u64::from(o.requests_per_unit) < hits || o.requests_per_unit == 0 {
                return Ok(Plan::Refused {
                    shown,
                    shadow: false,
                });
            }
            let duration_ms = u64::try_from(unit.duration().as_millis()).unwrap_or(u64::MAX);
            let item = Item {
                target: Target::AdHoc {
                    kind: Kind::FixedWindow,
                    limit: u64::from(o.requests_per_unit),
                    duration_ms,
                    namespace: format!("envoy:{}", request.domain),
                },
                identifier: id,
                cost: hits,
                shadow: false,
            };
            return Ok(Plan::Counted {
                item,
                shown,
                replaces: &[],
            });
        }
        match domain.rule(&descriptor.entries) {
            None => Ok(Plan::Free),
            Some(Rule::Unlimited) => Ok(Plan::Unlimited),
            Some(Rule::Limited(limit)) => {
                let shown = CurrentLimit {
                    name: limit.name.clone(),
                    requests_per_unit: limit.requests_per_unit,
                    unit: limit.unit,
                };
                let policy = self
                    .policies
                    .get(&request.domain)
                    .and_then(|ids| ids.get(limit.id).copied().flatten());
                match policy {
                    Some(policy) if hits <= u64::from(limit.requests_per_unit) => {
                        Ok(Plan::Counted {
                            item: Item {
                                target: Target::Policy(policy),
                                identifier: id,
                                cost: hits,
                                shadow: limit.shadow,
                            },
                            shown,
                            replaces: &limit.replaces,
                        })
                    }
                    _ => Ok(Plan::Refused {
                        shown,
                        shadow: limit.shadow,
                    }),
                }
            }
        }
    }

    /// Decides `request` on `engine`, all or nothing across its enforced descriptors.
    pub async fn decide<C: Clock + Clone + Send + Sync + 'static>(
        &self,
        engine: &Engine<C>,
        request: &Request,
    ) -> Result<Response, EnvoyError> {
        Self::check(request)?;
        let mut plans = request
            .descriptors
            .iter()
            .enumerate()
            .map(|(i, d)| self.plan(request, i, d))
            .collect::<Result<Vec<_>, _>>()?;
        // A matched limit named in another matched limit's `replaces` does not apply.
        let replaced: HashSet<&str> = plans
            .iter()
            .flat_map(|p| match p {
                Plan::Counted { replaces, .. } => replaces.iter().map(String::as_str).collect(),
                _ => Vec::new(),
            })
            .collect();
        if !replaced.is_empty() {
            for plan in &mut plans {
                let name = match plan {
                    Plan::Counted { shown, .. } | Plan::Refused { shown, .. } => &shown.name,
                    _ => continue,
                };
                if !name.is_empty() && replaced.contains(name.as_str()) {
                    *plan = Plan::Free;
                }
            }
        }
        let refused = plans
            .iter()
            .any(|p| matches!(p, Plan::Refused { shadow: false, .. }));
        // Something is over before counting: only report the others (cost 0), so nothing moves.
        let (slots, items): (Vec<Option<usize>>, Vec<Item>) = {
            let mut slots = Vec::with_capacity(plans.len());
            let mut items = Vec::new();
            for plan in &plans {
                if let Plan::Counted { item, .. } = plan {
                    let mut item = item.clone();
                    if refused {
                        item.cost = 0;
                    }
                    slots.push(Some(items.len()));
                    items.push(item);
                } else {
                    slots.push(None);
                }
            }
            (slots, items)
        };
        let (all, answers) = if items.is_empty() {
            (true, Vec::new())
        } else {
            engine.decide(&items).await.map_err(|e| match e {
                DecideError::Invalid { .. } | DecideError::TooManyShapes => {
                    EnvoyError::Invalid(e.to_string())
                }
                DecideError::Full(_) | DecideError::Unavailable(_) => {
                    EnvoyError::Unavailable(e.to_string())
                }
            })?
        };
        let over = refused || !all;
        let statuses = plans
            .iter()
            .zip(&slots)
            .map(|(plan, slot)| match plan {
                Plan::Free => Status {
                    code: Code::Ok,
                    current_limit: None,
                    limit_remaining: 0,
                    duration_until_reset: None,
                },
                Plan::Unlimited => Status {
                    code: Code::Ok,
                    current_limit: None,
                    limit_remaining: u32::MAX,
                    duration_until_reset: None,
                },
                Plan::Refused { shown, shadow } => Status {
                    code: if *shadow { Code::Ok } else { Code::OverLimit },
                    current_limit: Some(shown.clone()),
                    limit_remaining: 0,
                    duration_until_reset: Some(shown.unit.duration()),
                },
                Plan::Counted { shown, item, .. } => {
                    match slot.and_then(|i| answers.get(i)) {
                        Some(answer) => status(shown, &answer.decision, item.shadow),
                        // The engine answers every item; were one missing, say over.
                        None => Status {
                            code: Code::OverLimit,
                            current_limit: Some(shown.clone()),
                            limit_remaining: 0,
                            duration_until_reset: None,
                        },
                    }
                }
            })
            .collect();
        Ok(Response {
            overall: if over { Code::OverLimit } else { Code::Ok },
            statuses,
        })
    }
}

fn status(shown: &CurrentLimit, decision: &Decision, shadow: bool) -> Status {
    let remaining = u32::try_from(decision.remaining()).unwrap_or(u32::MAX);
    if decision.is_allowed() {
        Status {
            code: Code::Ok,
            current_limit: Some(shown.clone()),
            limit_remaining: remaining,
            duration_until_reset: Some(Duration::from_nanos(decision.reset_after_nanos())),
        }
    } else {
        Status {
            code: if shadow { Code::Ok } else { Code::OverLimit },
            current_limit: Some(shown.clone()),
            limit_remaining: 0,
            duration_until_reset: Some(Duration::from_nanos(decision.retry_after_nanos())),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use limiter_core::ManualClock;

    use super::*;
    use crate::config::Config;
    use crate::engine::decided_at_once;
    use crate::metrics::Metrics;

    const WEB: &str = "\
domain: web
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: ip
    rate_limit: { unit: second, requests_per_unit: 10, algorithm: token_bucket }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 3, name: path, replaces: [{ name: generic }] }
  - key: generic
    rate_limit: { unit: minute, requests_per_unit: 1, name: generic }
  - key: beta
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: blocked
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: internal
    rate_limit: { unlimited: true }
";

    struct Fixture {
        envoy: Envoy,
        engine: Engine<ManualClock>,
        metrics: Arc<Metrics>,
        clock: ManualClock,
    }

    fn fixture() -> Fixture {
        let config = Config::parse("[envoy]\nfiles = [\"web.yaml\"]\n").expect("valid");
        let domains = Domains::load([("web.yaml", WEB)]).expect("valid");
        let clock = ManualClock::new();
        let metrics = Arc::new(Metrics::new());
        let mut engine =
            Engine::new(&config, clock.clone(), None, Arc::clone(&metrics)).expect("builds");
        let envoy = Envoy::attach(domains, &mut engine).expect("attaches");
        Fixture {
            envoy,
            engine,
            metrics,
            clock,
        }
    }

    fn descriptor(pairs: &[(&str, &str)]) -> Descriptor {
        Descriptor {
            entries: pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Descriptor::default()
        }
    }

    fn request(descriptors: Vec<Descriptor>) -> Request {
        Request {
            domain: "web".into(),
            descriptors,
            hits_addend: 0,
        }
    }

    impl Fixture {
        fn decide(&self, descriptors: Vec<Descriptor>) -> Response {
            decided_at_once(self.envoy.decide(&self.engine, &request(descriptors))).expect("valid")
        }

        /// What `pairs` has left, without taking anything.
        fn remaining(&self, pairs: &[(&str, &str)]) -> u32 {
            let mut d = descriptor(pairs);
            d.hits_addend = Some(0);
            self.decide(vec![d]).statuses[0].limit_remaining
        }
    }

    fn codes(response: &Response) -> Vec<Code> {
        response.statuses.iter().map(|s| s.code).collect()
    }

    #[test]
    fn a_request_over_one_limit_moves_no_other_counter() {
        let f = fixture();
        let pair = || {
            vec![
                descriptor(&[("user", "alice")]),
                descriptor(&[("tenant", "acme")]),
            ]
        };
        let first = f.decide(pair());
        assert_eq!(first.overall, Code::Ok);
        assert_eq!(first.statuses[1].limit_remaining, 9);
        for _ in 0..5 {
            let over = f.decide(pair());
            assert_eq!(over.overall, Code::OverLimit);
            assert_eq!(codes(&over), [Code::OverLimit, Code::Ok]);
        }
        // envoy's reference server would have counted the tenant six times (4 left); the
        // denied requests took nothing here.
        assert_eq!(f.remaining(&[("tenant", "acme")]), 9);
        // Another user of the tenant still gets in.
        assert_eq!(
            f.decide(vec![
                descriptor(&[("user", "bob")]),
                descriptor(&[("tenant", "acme")])
            ])
            .overall,
            Code::Ok
        );
        assert_eq!(f.remaining(&[("tenant", "acme")]), 8);
    }

    #[test]
    fn algorithms_follow_the_clock_and_report_their_reset() {
        let f = fixture();
        for _ in 0..10 {
            assert_eq!(
                f.decide(vec![descriptor(&[("ip", "10.0.0.1")])]).overall,
                Code::Ok
            );
        }
        let over = f.decide(vec![descriptor(&[("ip", "10.0.0.1")])]);
        assert_eq!(over.overall, Code::OverLimit);
        // A token every 100 ms: the wait is exactly one emission interval.
        assert_eq!(
            over.statuses[0].duration_until_reset,
            Some(Duration::from_millis(100))
        );
        f.clock.advance(Duration::from_millis(99));
        assert_eq!(
            f.decide(vec![descriptor(&[("ip", "10.0.0.1")])]).overall,
            Code::OverLimit
        );
        f.clock.advance(Duration::from_millis(1));
        let ok = f.decide(vec![descriptor(&[("ip", "10.0.0.1")])]);
        assert_eq!((ok.overall, ok.statuses[0].limit_remaining), (Code::Ok, 0));
        let shown = ok.statuses[0].current_limit.clone().expect("a limit");
        assert_eq!((shown.requests_per_unit, shown.unit), (10, Unit::Second));

        // The fixed window (the default) resets at the end of its minute.
        f.clock.advance(Duration::from_secs(20));
        let user = f.decide(vec![descriptor(&[("user", "carol")])]);
        let reset = user.statuses[0].duration_until_reset.expect("a reset");
        assert!(
            reset <= Duration::from_secs(60) && reset > Duration::ZERO,
            "{reset:?}"
        );
        let over = f.decide(vec![descriptor(&[("user", "carol")])]);
        assert_eq!(over.statuses[0].duration_until_reset, Some(reset));
        f.clock.advance(reset);
        assert_eq!(
            f.decide(vec![descriptor(&[("user", "carol")])]).overall,
            Code::Ok
        );
    }

    #[test]
    fn shadow_mode_reports_but_never_denies() {
        let f = fixture();
        for round in 0..3 {
            let r = f.decide(vec![
                descriptor(&[("beta", "x")]),
                descriptor(&[("tenant", "t")]),
            ]);
            assert_eq!(r.overall, Code::Ok, "round {round}");
            assert_eq!(codes(&r), [Code::Ok, Code::Ok]);
            // Admitted once (0 left), then over: a shadow denial reports 0 left, code OK.
            assert_eq!(r.statuses[0].limit_remaining, 0);
        }
        assert_eq!(
            f.remaining(&[("tenant", "t")]),
            7,
            "the enforced limit counted all three"
        );
        let text = f.metrics.render(0);
        assert!(
            text.contains("policy=\"envoy:web.beta\",result=\"shadow_denied\"} 2"),
            "{text}"
        );
        // A shadow limit does not shield an enforced one.
        let r = f.decide(vec![
            descriptor(&[("beta", "x")]),
            descriptor(&[("user", "u")]),
        ]);
        assert_eq!(r.overall, Code::Ok);
        let r = f.decide(vec![
            descriptor(&[("beta", "x")]),
            descriptor(&[("user", "u")]),
        ]);
        assert_eq!(
            (r.overall, codes(&r)),
            (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
        );
    }

    #[test]
    fn replaced_unlimited_blocked_and_unknown_descriptors() {
        let f = fixture();
        // `path` replaces `generic` when both match: generic (1/min) is not applied.
        for _ in 0..3 {
            let r = f.decide(vec![
                descriptor(&[("path", "/a")]),
                descriptor(&[("generic", "g")]),
            ]);
            assert_eq!(r.overall, Code::Ok);
            assert_eq!(r.statuses[1].current_limit, None);
        }
        assert_eq!(f.remaining(&[("generic", "g")]), 1, "never counted");
        // Alone, generic applies.
        assert_eq!(
            f.decide(vec![descriptor(&[("generic", "g")])]).overall,
            Code::Ok
        );
        assert_eq!(
            f.decide(vec![descriptor(&[("generic", "g")])]).overall,
            Code::OverLimit
        );

        let r = f.decide(vec![
            descriptor(&[("internal", "x")]),
            descriptor(&[("nothing", "x")]),
        ]);
        assert_eq!(r.overall, Code::Ok);
        assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
        assert_eq!(r.statuses[1].current_limit, None);

        // `requests_per_unit: 0` refuses, and the request takes nothing elsewhere.
        let r = f.decide(vec![
            descriptor(&[("tenant", "z")]),
            descriptor(&[("blocked", "x")]),
        ]);
        assert_eq!(
            (r.overall, codes(&r)),
            (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
        );
        assert_eq!(f.remaining(&[("tenant", "z")]), 10);

        let unknown = decided_at_once(f.envoy.decide(
            &f.engine,
            &Request {
                domain: "elsewhere".into(),
                descriptors: vec![descriptor(&[("user", "a")])],
                hits_addend: 0,
            },
        ))
        .expect("valid");
        assert_eq!(unknown.overall, Code::Ok);
        assert_eq!(unknown.statuses[0].current_limit, None);
    }

    #[test]
    fn hits_overrides_and_refusals() {
        let f = fixture();
        // Request-level hits (0 means 1) and a descriptor's own.
        let mut r = request(vec![descriptor(&[("tenant", "h")])]);
        r.hits_addend = 4;
        let answer = decided_at_once(f.envoy.decide(&f.engine, &r)).expect("valid");
        assert_eq!(answer.statuses[0].limit_remaining, 6);
        let mut d = descriptor(&[("tenant", "h")]);
        d.hits_addend = Some(7);
        let over = f.decide(vec![d.clone()]);
        assert_eq!(over.overall, Code::OverLimit);
        assert_eq!(f.remaining(&[("tenant", "h")]), 6);
        // More hits than the limit could ever hold: over, not an error.
        d.hits_addend = Some(11);
        assert_eq!(f.decide(vec![d]).overall, Code::OverLimit);

        // An override replaces the configured limit, with its own counter.
        let mut o = descriptor(&[("tenant", "h")]);
        o.limit = Some(Override {
            requests_per_unit: 2,
            unit: Unit::Hour.number(),
        });
        for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
            let r = f.decide(vec![o.clone()]);
            assert_eq!(r.overall, expected);
            let shown = r.statuses[0].current_limit.clone().expect("shown");
            assert_eq!((shown.requests_per_unit, shown.unit), (2, Unit::Hour));
        }
        assert_eq!(f.remaining(&[("tenant", "h")]), 6);

        for (req, field) in [
            (Request::default(), "domain"),
            (request(Vec::new()), "descriptors"),
            (request(vec![descriptor(&[])]), "descriptors[0].entries"),
            (
                request(vec![descriptor(&[("", "v")])]),
                "descriptors[0].entries[0].key",
            ),
            (
                request(vec![Descriptor {
                    limit: Some(Override {
                        requests_per_unit: 1,
                        unit: 0,
                    }),
                    ..descriptor(&[("a", "b")])
                }]),
                "descriptors[0].limit.unit",
            ),
            (
                request(
                    (0..=MAX_DESCRIPTORS)
                        .map(|_| descriptor(&[("a", "b")]))
                        .collect(),
                ),
                "descriptors",
            ),
        ] {
            let EnvoyError::Invalid(message) =
                decided_at_once(f.envoy.decide(&f.engine, &req)).expect_err(field)
            else {
                panic!("invalid")
            };
            assert!(message.starts_with(field), "{field}: {message}");
        }
    }
}
