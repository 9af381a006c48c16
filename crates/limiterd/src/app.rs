//! The composition root: [`AppState::build`] turns a checked [`Config`] and envoy's loaded
//! [`Domains`] into the parts the adapters share: the metrics, then the engine (every
//! configured policy, counting into the metrics), then envoy's domains attached to the engine
//! (one policy per configured descriptor limit). The adapters (the HTTP API in `crate::http`,
//! envoy's gRPC protocol in `crate::grpc`) take the result; nothing below depends on an
//! adapter, and no part builds another. [`AppState::reloaded`] builds the parts for a new
//! configuration from the serving ones, keeping their counters (see [`crate::ops::live`]).

use std::sync::Arc;

use crate::store::RedisBackend;
use limiter_core::Clock;

use crate::config::Config;
use crate::config::keys::Keys;
use crate::engine::{Carried, Engine, EngineError, Stacks};
use crate::envoy::service::AttachError;
use crate::envoy::{Domains, Envoy};
use crate::metrics::Metrics;

/// What the handlers share.
#[derive(Debug)]
pub struct AppState<C> {
    /// Every policy's stack.
    pub engine: Engine<C>,
    /// Envoy's domains, whose limits are policies of `engine`.
    pub envoy: Envoy,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The configuration these parts were built from.
    pub config: Config,
    /// The keys accepted: the file's, and the root key from `LIMITERD_ROOT_KEY`.
    pub keys: Keys,
}

/// The keys `config` names, and the root key from the environment.
fn keys(config: &Config) -> Keys {
    Keys::new(config.auth.keys.clone(), |name| std::env::var(name).ok())
}

/// Why the service's parts could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// A configured policy's stack was refused.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A descriptor limit of an envoy file was refused.
    #[error(transparent)]
    Envoy(#[from] AttachError),
}

impl<C: Clock + Clone + Send + Sync + 'static> AppState<C> {
    /// Builds the parts for `config` and `domains` on `clock` (and `backend`, which a Redis
    /// store needs, connected by the caller).
    pub fn build(
        config: &Config,
        domains: Domains,
        clock: C,
        backend: Option<RedisBackend>,
    ) -> Result<Self, StartError> {
        let metrics = Arc::new(Metrics::new());
        let stacks = Stacks::open(&config.store, clock, backend)?;
        let mut engine = Engine::new(config, stacks, Arc::clone(&metrics))?;
        let envoy = Envoy::attach(domains, &mut engine)?.with_options(envoy_options(config));
        Ok(Self {
            engine,
            envoy,
            metrics,
            config: config.clone(),
            keys: keys(config),
        })
    }

    /// The parts for `config` and `domains` in place of these, which serve on until the
    /// caller swaps them: the same metrics, store and clock, and the counters of every policy
    /// and descriptor limit carried over ([`Engine::reloaded`]); what happened to each is in
    /// the [`Carried`].
    pub fn reloaded(
        &self,
        config: &Config,
        domains: Domains,
    ) -> Result<(Self, Carried), StartError> {
        let mut engine = self.engine.reloaded(config)?;
        let envoy = Envoy::attach(domains, &mut engine)?.with_options(envoy_options(config));
        let carried = engine.carried();
        let state = Self {
            engine,
            envoy,
            metrics: Arc::clone(&self.metrics),
            config: config.clone(),
            keys: keys(config),
        };
        Ok((state, carried))
    }
}

/// The `[envoy]` table's service-wide switches (defaults without one).
fn envoy_options(config: &Config) -> crate::config::Options {
    config
        .envoy
        .as_ref()
        .map(|e| e.options.clone())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use limiter_core::ManualClock;

    use super::*;
    use crate::engine::{Item, Target, decided_at_once};

    #[test]
    fn builds_metrics_then_engine_then_envoy_and_counts_by_name() {
        let config = Config::parse(
            "[envoy]\nfiles = [\"web.yaml\"]\n[policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1m\" }]\n",
        )
        .unwrap();
        let domains = Domains::load([(
            "web.yaml",
            "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: { unit: minute, requests_per_unit: 5 }\n",
        )])
        .unwrap();
        let app = AppState::build(&config, domains, ManualClock::new(), None).unwrap();
        let api = app.engine.policy_id("api").expect("configured");
        assert_eq!(app.engine.policy_name(api), Some("api"));
        let item = Item {
            target: Target::Policy(api),
            identifier: "u".into(),
            cost: 1,
            shadow: false,
            charge: crate::engine::Charge::Take,
        };
        for _ in 0..2 {
            decided_at_once(app.engine.decide(std::slice::from_ref(&item))).unwrap();
        }
        let text = app.metrics.render(0);
        assert!(
            text.contains("limiterd_decisions_total{policy=\"api\",result=\"allowed\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("limiterd_decisions_total{policy=\"api\",result=\"denied\"} 1"),
            "{text}"
        );
        // The descriptor's limit is a policy of the same engine, shown from the start.
        assert!(
            text.contains("limiterd_decisions_total{policy=\"envoy:web.ip\",result=\"allowed\"} 0"),
            "{text}"
        );
    }

    #[test]
    fn a_reload_says_which_policies_kept_their_counters_and_keeps_them() {
        let text = |api_failure: &str, api: u64, exports: u64| {
            format!(
                "[policies.api]\non_failure = \"{api_failure}\"\nlimits = [{{ algorithm = \"token_bucket\", count = {api}, period = \"1m\" }}]\n\
                 [policies.exports]\nlimits = [{{ algorithm = \"concurrency\", count = {exports} }}]\n\
                 [policies.same]\nlimits = [{{ algorithm = \"concurrency\", count = 1 }}]\n"
            )
        };
        let config = Config::parse(&text("open", 5, 2)).unwrap();
        let app = AppState::build(&config, Domains::default(), ManualClock::new(), None).unwrap();
        let item = |app: &AppState<ManualClock>, cost: u64| Item {
            target: Target::Policy(app.engine.policy_id("api").expect("configured")),
            identifier: "u".into(),
            cost,
            shadow: false,
            charge: crate::engine::Charge::Take,
        };
        let remaining = |app: &AppState<ManualClock>, cost: u64| {
            let (_, answers) =
                decided_at_once(app.engine.decide(std::slice::from_ref(&item(app, cost)))).unwrap();
            answers[0].decision.remaining()
        };
        assert_eq!(remaining(&app, 2), 3);
        // Only the failure policy changed: in memory the stack is its limits, kept whole.
        let (app, carried) = app
            .reloaded(
                &Config::parse(&text("closed", 5, 2)).unwrap(),
                Domains::default(),
            )
            .unwrap();
        assert_eq!(carried.kept, ["api", "exports", "same"]);
        assert_eq!(remaining(&app, 0), 3);
        // A changed count: rescaled, the permits' policy too (its permits stay held).
        let (app, carried) = app
            .reloaded(
                &Config::parse(&text("closed", 10, 3)).unwrap(),
                Domains::default(),
            )
            .unwrap();
        assert_eq!(
            (carried.kept, carried.rescaled),
            (
                vec!["same".to_owned()],
                vec!["api".to_owned(), "exports".to_owned()]
            )
        );
        assert_eq!(remaining(&app, 0), 6, "2 of 5 used is 4 of 10");
    }

    #[test]
    fn a_redis_store_without_a_connection_is_a_typed_error() {
        let config = Config::parse(
            "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:1\"\n[policies.api]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1m\" }]\n",
        )
        .unwrap();
        let err =
            AppState::build(&config, Domains::default(), ManualClock::new(), None).unwrap_err();
        assert!(
            matches!(err, StartError::Engine(EngineError::NoBackend)),
            "{err:?}"
        );
        assert!(err.to_string().contains("no Redis connection"), "{err}");
    }
}
