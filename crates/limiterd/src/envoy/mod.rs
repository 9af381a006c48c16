//! Envoy's protocol mounted on limiterd: the engine is envoy's [`Decider`] (each configured
//! descriptor limit a policy of the engine, each request's items decided all or nothing on
//! it, its statistics in limiterd's metrics); `crate::grpc` serves it over gRPC. The protocol itself (descriptor files, matching, statuses,
//! settings, wire forms) is the `limiter-envoy` crate, which knows nothing of limiterd.

use limiter_core::Clock;
use limiter_envoy::service::EnvoyError;
use limiter_envoy::{AddLimitError, Answer, Decider, Item, LimitSpec, RuleStats};
pub use limiter_envoy::{Domain, Domains, RulesError};
pub use limiter_envoy::{json, rules, service, yaml};

use crate::config::{CheckedLimit, Keying, Policy, PolicyLimit};
use crate::engine::{self, DecideError, Engine, PolicyId};
use crate::metrics::RuleCounters;

/// Envoy's domains, their limits counted as policies of limiterd's engine.
pub type Envoy = limiter_envoy::Envoy<PolicyId, RuleCounters>;

impl RuleStats for RuleCounters {
    fn add(&self, stat: &str, n: u64) {
        RuleCounters::add(self, stat, n);
    }
}

impl<C: Clock + Clone + Send + Sync + 'static> Decider for Engine<C> {
    type Limit = PolicyId;
    type Stats = RuleCounters;

    /// A policy of one layer keyed by the descriptor's values, with the store's failure
    /// policy; refused if the store cannot count the limit.
    fn add_limit(
        &mut self,
        name: &str,
        stack_name: &str,
        spec: &LimitSpec,
    ) -> Result<PolicyId, AddLimitError> {
        let limit = CheckedLimit::new(spec.kind, spec.limit, self.store_kind())?;
        let policy = Policy {
            concurrency: None,
            limits: vec![PolicyLimit {
                limit,
                keying: Keying::Identifier,
            }],
            on_failure: self.stacks().default_failure(),
            lease: spec.lease,
        };
        self.add_policy(name, stack_name, &policy)
            .map_err(|e| AddLimitError::Refused(Box::new(e)))
    }

    async fn decide(&self, items: &[Item<PolicyId>]) -> Result<(bool, Vec<Answer>), EnvoyError> {
        let items: Vec<engine::Item> = items.iter().map(engine_item).collect();
        let (admitted, answers) = Engine::decide(self, &items).await.map_err(|e| match e {
            DecideError::Invalid { .. } | DecideError::TooManyShapes => {
                EnvoyError::Invalid(e.to_string())
            }
            DecideError::Full(_) | DecideError::Unavailable(_) => {
                EnvoyError::Unavailable(e.to_string())
            }
        })?;
        let answers = answers
            .into_iter()
            .map(|a| Answer {
                decision: a.decision,
            })
            .collect();
        Ok((admitted, answers))
    }

    fn rule_stats(&self, full_key: &str) -> RuleCounters {
        self.metrics().envoy_rule(full_key)
    }

    fn stat(&self, key: &str, stat: &'static str, n: u64) {
        self.metrics().envoy_stat(key, stat, n);
    }
}

/// An envoy item as the engine decides it.
fn engine_item(item: &Item<PolicyId>) -> engine::Item {
    use limiter_envoy::Target;
    engine::Item {
        target: match &item.target {
            Target::Limit(id) => engine::Target::Policy(*id),
            Target::AdHoc {
                kind,
                limit,
                duration_ms,
                namespace,
            } => engine::Target::AdHoc {
                kind: *kind,
                limit: *limit,
                duration_ms: *duration_ms,
                namespace: namespace.clone(),
            },
        },
        identifier: item.identifier.as_str().into(),
        cost: item.cost,
        shadow: item.shadow,
        charge: item.charge,
    }
}

#[cfg(test)]
mod tests;
