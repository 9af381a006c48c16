//! The in-process limiters behind the seam: a [`Stack`] (every method: decisions at a reading,
//! grants and refunds, records, plans added while serving), any direct limiter of the core and
//! a keyed one with its keyer ([`KeyedBy`]), which only decide.

use std::future::ready;

use limiter_core::{Clock, Limit, Limiter};

use super::*;
use crate::{Grant, LayerDecision, Stack};

impl<R, K, C> AsyncLimiter<R> for Stack<R, K, C>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + Send + Sync,
    Self: Send + Sync,
{
    #[inline]
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
        Decide::Now(self.check_n(request, cost).map(Outcome::in_process))
    }

    #[inline]
    fn decide_request_each<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        each: &'a mut LayerAnswers,
    ) -> Decide<'a> {
        Decide::Now(
            self.check_each(request, cost, each)
                .map(Outcome::in_process),
        )
    }

    fn layers(&self) -> Vec<LayerInfo> {
        Stack::layers(self)
            .iter()
            .map(|layer| LayerInfo {
                name: layer.name().to_owned(),
                key: layer.key_name(),
                plans: layer
                    .all_plans()
                    .map(|plan| plan.limits().copied().collect())
                    .collect(),
            })
            .collect()
    }
}

impl<R, K, C> Charges<R> for Stack<R, K, C>
where
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + Send + Sync,
    Self: Send + Sync,
{
    fn ask<'a>(&'a self, request: &'a R, ask: Ask) -> Decide<'a> {
        let now = ask.at.unwrap_or_else(|| self.clock().now());
        let decision = match ask.charge {
            Charge::Take => self.decide_at(request, ask.cost, now).map(|(d, _)| d),
            Charge::Record => self.record_at(request, ask.cost, now),
            Charge::Refund => self.refund_units(request, ask.cost),
        };
        Decide::Now(decision.map(Outcome::in_process))
    }

    fn take_undoable<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        at: Option<u64>,
    ) -> Decide<'a, Result<Taken<'a>, CallError>>
    where
        R: Sync,
    {
        undo_with_grant(self, request, cost, at)
    }
}

impl<R, K: std::hash::Hash + Eq + Clone, C: Clock> HoldsKeys for Stack<R, K, C> {
    fn keys_held(&self) -> u64 {
        self.len()
    }
}

impl<R, K: std::hash::Hash + Eq + Clone, C: Clock> OpenPlans for Stack<R, K, C> {
    fn add_plan(&self, layer: usize, plan: Plan) -> Result<usize, BuildError> {
        Stack::add_plan(self, layer, plan)
    }
}

impl<R, K, C> Refunds<R> for Stack<R, K, C>
where
    R: Sync,
    K: std::hash::Hash + Eq + Clone + Send + Sync + 'static,
    C: Clock + Send + Sync,
    Self: Send + Sync,
{
    type Grant = Grant;

    fn take_with_grant<'a>(
        &'a self,
        request: &'a R,
        cost: u64,
        at: Option<u64>,
    ) -> Granted<'a, Grant> {
        let now = at.unwrap_or_else(|| self.clock().now());
        let decided = self.decide_at(request, cost, now);
        Decide::Now(decided.map(|(decision, grant)| (Outcome::in_process(decision), grant)))
    }

    fn refund<'a>(
        &'a self,
        request: &'a R,
        mut grant: Grant,
    ) -> Pending<'a, Result<Outcome, CallError>> {
        let units = grant.left();
        let answer = Stack::refund(self, request, &mut grant, units)
            .map_err(|e| CallError::Refund {
                reason: e.to_string(),
            })
            .and_then(|()| self.peek(request).map(Outcome::in_process));
        Box::pin(ready(answer))
    }
}

/// The name a direct or keyed limiter's one layer reports when it was given none.
pub const DEFAULT_LAYER_NAME: &str = "limit";

fn one_layer(limit: &Limit, name: &str, key: Option<&'static str>) -> Vec<LayerInfo> {
    vec![LayerInfo {
        name: name.to_owned(),
        key,
        plans: vec![vec![*limit]],
    }]
}

fn as_layer(
    name: &str,
    decided: Result<limiter_core::Decision, limiter_core::DecisionError>,
) -> Result<Outcome, CallError> {
    match decided {
        Ok(decision) => Ok(Outcome::in_process(StackDecision::from_layers(
            LayerDecision::from_limits(0, 0, &[decision]),
        ))),
        Err(source) => Err(CallError::Decision {
            layer: name.to_owned(),
            limit_index: 0,
            source,
        }),
    }
}

/// A direct limiter (one state for every call) decides any request as a one-layer stack named
/// [`DEFAULT_LAYER_NAME`].
impl<R: ?Sized, L: Limiter<Key = ()>> AsyncLimiter<R> for L {
    #[inline]
    fn decide_request<'a>(&'a self, _: &'a R, cost: u64) -> Decide<'a> {
        Decide::Now(as_layer(
            DEFAULT_LAYER_NAME,
            Limiter::decide(self, &(), cost),
        ))
    }

    fn layers(&self) -> Vec<LayerInfo> {
        one_layer(self.limit(), DEFAULT_LAYER_NAME, None)
    }
}

/// A keyed limiter and the keyer that names a request's key: a one-layer stack to adapters. A
/// request the keyer returns `None` for is admitted with nothing counted (no layer applied).
#[derive(Clone, Debug)]
pub struct KeyedBy<L, F> {
    name: String,
    limiter: L,
    keyer: F,
}

impl<L, F> KeyedBy<L, F> {
    /// `limiter`, keyed by `keyer`, reported as a layer named `name`.
    pub fn new(name: impl Into<String>, limiter: L, keyer: F) -> Self {
        Self {
            name: name.into(),
            limiter,
            keyer,
        }
    }

    /// The keyed limiter.
    pub fn limiter(&self) -> &L {
        &self.limiter
    }
}

impl<R, L, F> AsyncLimiter<R> for KeyedBy<L, F>
where
    L: Limiter,
    L::Key: Sized,
    F: Keyer<R, L::Key> + Send + Sync,
{
    fn decide_request<'a>(&'a self, request: &'a R, cost: u64) -> Decide<'a> {
        let Some(key) = self.keyer.key(request) else {
            return Decide::Now(Ok(Outcome::in_process(StackDecision::from_layers([]))));
        };
        Decide::Now(as_layer(
            &self.name,
            Limiter::decide(&self.limiter, &key, cost),
        ))
    }

    fn layers(&self) -> Vec<LayerInfo> {
        one_layer(self.limiter.limit(), &self.name, self.keyer.key_name())
    }
}
