//! Rate limit response headers: the IETF draft's `RateLimit-Policy` and `RateLimit`
//! (draft-ietf-httpapi-ratelimit-headers, Structured Field lists, one item per stacked policy),
//! the legacy `X-RateLimit-*` trio, or none; and `Retry-After`.
//!
//! Policies are described once, when the middleware is built: per layer and plan, the
//! `RateLimit-Policy` items and the quoted names the `RateLimit` items reuse. A response only
//! formats the numbers, into the thread's header buffer (`values.rs`): no allocation per
//! response.

use std::fmt::Write as _;

use http::header::{HeaderMap, HeaderName, HeaderValue, RETRY_AFTER};
use limiter_core::Limit;
use limiter_stack::{LayerAnswers, StackDecision};

use limiter_stack::LayerInfo;

use crate::values;

/// Which rate limit headers responses carry (denied and allowed alike).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HeaderMode {
    /// None (a 429 still carries `Retry-After`).
    Off,
    /// `X-RateLimit-Limit`, `X-RateLimit-Remaining` and `X-RateLimit-Reset` (seconds from
    /// now), for the binding layer.
    Legacy,
    /// The IETF draft: `RateLimit-Policy: "per-ip";q=10;w=1, "global";q=1000;w=1` and
    /// `RateLimit: "per-ip";r=9;t=1, "global";r=999;t=1`, one item per layer that applied
    /// (per limit in the policy; per layer, for its binding limit, in `RateLimit`).
    #[default]
    Ietf,
}

/// The largest Integer a Structured Field carries (RFC 8941, 15 digits).
pub(crate) const SF_INTEGER_MAX: u64 = 999_999_999_999_999;

const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");
const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
const X_LIMIT: HeaderName = HeaderName::from_static("x-ratelimit-limit");
const X_REMAINING: HeaderName = HeaderName::from_static("x-ratelimit-remaining");
const X_RESET: HeaderName = HeaderName::from_static("x-ratelimit-reset");

/// Whole seconds in `nanos`, rounded up (a client told to wait never waits too little), capped
/// at what a Structured Field Integer holds.
pub(crate) fn ceil_seconds(nanos: u64) -> u64 {
    nanos.div_ceil(1_000_000_000).min(SF_INTEGER_MAX)
}

/// Appends `n` in decimal (the hot path's `write!`, without the formatting machinery).
pub(crate) fn sf_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// One plan of one layer, described for the headers.
#[derive(Debug)]
struct PlanHeaders {
    /// The `RateLimit-Policy` items for every limit of the plan, comma-separated.
    policy: String,
    /// The same as a header value, for a response where this plan's layer alone applied (a
    /// static value: nothing is formatted, allocated or counted per response).
    policy_value: Option<HeaderValue>,
    /// Per limit, its quoted policy name.
    names: Vec<String>,
}

/// Every layer's plans, described once.
#[derive(Debug)]
pub(crate) struct Policies {
    /// Per layer: its name and its plans.
    layers: Vec<(String, Vec<PlanHeaders>)>,
}

impl Policies {
    /// Names each limit after its layer (`"per-ip"`), or, where a plan has several, after its
    /// layer and position (`"per-ip.0"`, `"per-ip.1"`), so no two items share a name.
    pub(crate) fn new(layers: &[LayerInfo]) -> Self {
        let layers = layers
            .iter()
            .map(|layer| {
                let plans = layer
                    .plans
                    .iter()
                    .map(|limits| plan_headers(&layer.name, limits))
                    .collect();
                (layer.name.clone(), plans)
            })
            .collect();
        Self { layers }
    }

    fn plan(&self, layer: usize, plan: usize) -> Option<&PlanHeaders> {
        self.layers.get(layer)?.1.get(plan)
    }

    /// The name of the layer at `layer`.
    pub(crate) fn layer_name(&self, layer: usize) -> Option<&str> {
        self.layers.get(layer).map(|(name, _)| name.as_str())
    }

    /// `mode`'s headers for `decision`, rendered (so the decision itself need not be kept).
    #[inline]
    pub(crate) fn render(
        &self,
        mode: HeaderMode,
        decision: &StackDecision,
        each: &LayerAnswers,
    ) -> RateHeaders {
        match mode {
            HeaderMode::Off => RateHeaders::None,
            HeaderMode::Legacy => legacy(decision),
            HeaderMode::Ietf => self.ietf(each),
        }
    }

    /// The IETF headers of every layer's answer in `each`. The usual answer (one layer)
    /// reuses its plan's policy value; several are joined. Values are written into the
    /// thread's header buffer (`values.rs`): nothing is allocated per response.
    pub(crate) fn ietf(&self, each: &LayerAnswers) -> RateHeaders {
        let applied = || {
            each.iter().filter_map(|layer| {
                let plan = self.plan(layer.layer, layer.plan)?;
                let name = plan.names.get(layer.limit_index)?;
                Some((layer, plan, name))
            })
        };
        let mut plans = applied().map(|(_, plan, _)| plan);
        let policy = match (plans.next(), plans.next()) {
            (None, _) => return RateHeaders::None,
            (Some(only), None) => only.policy_value.clone(),
            (Some(_), Some(_)) => values::value(|out| {
                for (i, (_, plan, _)) in applied().enumerate() {
                    if i > 0 {
                        out.bytes(b", ");
                    }
                    out.bytes(plan.policy.as_bytes());
                }
            }),
        };
        let state = values::value(|out| {
            for (i, (layer, _, name)) in applied().enumerate() {
                // `t`: for a denial, the wait `Retry-After` gives; else when the binding
                // limit (the one with the fewest left, which `r` reports) is full again.
                let d = &layer.decision;
                let wait = if d.is_allowed() {
                    layer.limit_reset_after_nanos
                } else {
                    d.retry_after_nanos()
                };
                if i > 0 {
                    out.bytes(b", ");
                }
                out.bytes(name.as_bytes());
                out.bytes(b";r=");
                out.number(d.remaining().min(SF_INTEGER_MAX));
                out.bytes(b";t=");
                out.number(ceil_seconds(wait));
            }
        });
        // Both are printable ASCII by construction (`sf_string` and digits).
        match (policy, state) {
            (Some(policy), Some(state)) => RateHeaders::Ietf { policy, state },
            _ => RateHeaders::None,
        }
    }
}

fn plan_headers(layer: &str, limits: &[Limit]) -> PlanHeaders {
    let names: Vec<String> = if limits.len() == 1 {
        vec![sf_string(layer)]
    } else {
        (0..limits.len())
            .map(|i| sf_string(&format!("{layer}.{i}")))
            .collect()
    };
    let mut policy = String::new();
    for (name, limit) in names.iter().zip(limits) {
        if !policy.is_empty() {
            policy.push_str(", ");
        }
        let _ = write!(
            policy,
            "{name};q={};w={}",
            limit.count().min(SF_INTEGER_MAX),
            ceil_seconds(limit.period_nanos())
        );
        if limit.burst() != limit.count() {
            // A vendor parameter: the draft's `q` is the quota per window, the burst is extra.
            let _ = write!(policy, ";burst={}", limit.burst().min(SF_INTEGER_MAX));
        }
    }
    let policy_value = values::constant(&policy);
    PlanHeaders {
        policy,
        policy_value,
        names,
    }
}

fn legacy(decision: &StackDecision) -> RateHeaders {
    if decision.binding().is_none() {
        return RateHeaders::None;
    }
    let d = decision.decision();
    let limit = values::number(d.limit().min(SF_INTEGER_MAX));
    let remaining = values::number(d.remaining().min(SF_INTEGER_MAX));
    let reset = values::number(ceil_seconds(d.reset_after_nanos()));
    match (limit, remaining, reset) {
        (Some(limit), Some(remaining), Some(reset)) => RateHeaders::Legacy {
            limit,
            remaining,
            reset,
        },
        _ => RateHeaders::None,
    }
}

/// The rate limit headers of one response, rendered.
#[derive(Debug, Default)]
pub(crate) enum RateHeaders {
    /// None (headers off, no layer applied, or the backend failed open).
    #[default]
    None,
    /// `RateLimit-Policy` and `RateLimit`.
    Ietf {
        policy: HeaderValue,
        state: HeaderValue,
    },
    /// `X-RateLimit-Limit`, `-Remaining` and `-Reset`.
    Legacy {
        limit: HeaderValue,
        remaining: HeaderValue,
        reset: HeaderValue,
    },
}

impl RateHeaders {
    /// Whether there are none to add.
    #[inline]
    pub(crate) fn is_none(&self) -> bool {
        matches!(self, Self::None)
    }

    /// Adds them to `headers`, replacing any the service set.
    #[inline]
    pub(crate) fn apply(self, headers: &mut HeaderMap) {
        match self {
            Self::None => {}
            Self::Ietf { policy, state } => {
                headers.insert(RATELIMIT_POLICY, policy);
                headers.insert(RATELIMIT, state);
            }
            Self::Legacy {
                limit,
                remaining,
                reset,
            } => {
                headers.insert(X_LIMIT, limit);
                headers.insert(X_REMAINING, remaining);
                headers.insert(X_RESET, reset);
            }
        }
    }
}

/// `Retry-After` in whole seconds, rounded up: the earliest a retry of the same cost can be
/// admitted (never 0 for a denial: any positive wait rounds up to 1).
pub(crate) fn retry_after(nanos: u64, headers: &mut HeaderMap) {
    if let Some(value) = values::number(ceil_seconds(nanos).max(1)) {
        headers.insert(RETRY_AFTER, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_quoted_escaped_and_printable() {
        assert_eq!(sf_string("per-ip"), r#""per-ip""#);
        assert_eq!(sf_string(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(sf_string("café\n"), r#""caf??""#);
    }

    #[test]
    fn seconds_round_up_and_cap() {
        assert_eq!(ceil_seconds(0), 0);
        assert_eq!(ceil_seconds(1), 1);
        assert_eq!(ceil_seconds(1_000_000_000), 1);
        assert_eq!(ceil_seconds(1_000_000_001), 2);
        assert_eq!(ceil_seconds(u64::MAX), 18_446_744_074);
    }

    #[test]
    fn plans_with_several_limits_name_each() {
        let limits = [Limit::per_second(10), Limit::per_minute(100).with_burst(20)];
        let plan = plan_headers("api", &limits);
        assert_eq!(plan.names, [r#""api.0""#, r#""api.1""#]);
        assert_eq!(
            plan.policy,
            r#""api.0";q=10;w=1, "api.1";q=100;w=60;burst=20"#
        );
        let one = plan_headers("ip", &limits[..1]);
        assert_eq!(one.policy, r#""ip";q=10;w=1"#);
    }
}
