//! [`HttpLimiter`]: the one seam between the middleware and a backend. An in-process
//! [`Stack`] and a [`RedisStack`](limiter_redis::RedisStack) (feature `redis`) both implement
//! it, so the middleware, its headers and its responses are the same on either.

use std::future::Future;

use limiter_core::{Clock, Limit};
use limiter_stack::{Stack, StackDecision};

use crate::key::Key;
use crate::request::HttpRequest;

/// What a backend answered for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
// A verdict is made and consumed once per request; boxing the decision would cost an
// allocation per request to save a copy.
#[allow(clippy::large_enum_variant)]
pub enum Verdict {
    /// The limits decided (in process, on Redis, from the deny cache, or on the local fallback
    /// while Redis is out): allowed iff the decision is.
    Decided(StackDecision),
    /// The backend failed and its policy is to admit: the request goes ahead, with no rate
    /// limit headers (no limit was consulted).
    FailedOpen,
    /// The backend failed and its policy is to refuse: answered 503, never 429, since the
    /// client is not over any limit.
    FailedClosed {
        /// The failure, for logs.
        reason: String,
    },
    /// The request can never be decided (a cost above a limit's burst, a clock out of range):
    /// answered 500.
    Error {
        /// What was wrong.
        reason: String,
    },
}

/// One layer as the headers describe it: its name and, per plan, its limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerInfo {
    /// The layer's name (the policy name in `RateLimit-Policy`).
    pub name: String,
    /// The name of the request key the layer reads (`by_key(name)`), checked against the
    /// middleware's keys when it is built; `None` for global layers and closures.
    pub key: Option<&'static str>,
    /// Per plan (in plan order), the plan's limits (in limit order).
    pub plans: Vec<Vec<Limit>>,
}

/// A limiter the middleware can ask: decides `cost` units for a request, and describes its
/// layers once, when the middleware is built.
pub trait HttpLimiter: Send + Sync + 'static {
    /// Decides `cost` units for `request`. A denial changes nothing.
    fn decide(&self, request: &HttpRequest, cost: u64) -> impl Future<Output = Verdict> + Send;

    /// Every layer in stack order, as a [`LayerDecision`](limiter_stack::LayerDecision) refers
    /// to them (by layer, plan and limit index).
    fn layers(&self) -> Vec<LayerInfo>;
}

impl<C> HttpLimiter for Stack<HttpRequest, Key, C>
where
    C: Clock + Send + Sync + 'static,
{
    fn decide(&self, request: &HttpRequest, cost: u64) -> impl Future<Output = Verdict> + Send {
        let verdict = match self.check_n(request, cost) {
            Ok(decision) => Verdict::Decided(decision),
            Err(e) => Verdict::Error {
                reason: e.to_string(),
            },
        };
        std::future::ready(verdict)
    }

    fn layers(&self) -> Vec<LayerInfo> {
        Stack::layers(self)
            .iter()
            .map(|layer| LayerInfo {
                name: layer.name().to_owned(),
                key: layer.key_name(),
                plans: layer
                    .plan_list()
                    .iter()
                    .map(|plan| plan.limits().copied().collect())
                    .collect(),
            })
            .collect()
    }
}

#[cfg(feature = "redis")]
impl HttpLimiter for limiter_redis::RedisStack<HttpRequest> {
    async fn decide(&self, request: &HttpRequest, cost: u64) -> Verdict {
        use limiter_redis::Source;
        match self.check_n(request, cost).await {
            Ok(answer) => match answer.source() {
                Source::FailOpen(_) => Verdict::FailedOpen,
                Source::FailClosed(e) => Verdict::FailedClosed {
                    reason: e.to_string(),
                },
                _ => Verdict::Decided(*answer.stack()),
            },
            Err(e) => Verdict::Error {
                reason: e.to_string(),
            },
        }
    }

    fn layers(&self) -> Vec<LayerInfo> {
        limiter_redis::RedisStack::layers(self)
            .zip(self.key_names())
            .map(|((name, limits), key)| LayerInfo {
                name: name.to_owned(),
                key,
                plans: vec![limits.iter().map(|l| l.limit()).collect()],
            })
            .collect()
    }
}

impl<L: HttpLimiter> HttpLimiter for std::sync::Arc<L> {
    fn decide(&self, request: &HttpRequest, cost: u64) -> impl Future<Output = Verdict> + Send {
        L::decide(self, request, cost)
    }

    fn layers(&self) -> Vec<LayerInfo> {
        L::layers(self)
    }
}
