//! Envoy's service mounted on limiterd's engine: each configured limit a policy of the engine,
//! a request's items all or nothing on the engine's stacks, and the service's statistics in
//! limiterd's metrics. The service itself (matching, overrides, malformed input, quota mode,
//! headers, metadata, the statistics it reports) is tested in limiter-envoy, on an in-process
//! decider.
use std::sync::Arc;

use limiter_envoy::service::{Code, Descriptor, Options, Request, Response};

use limiter_core::ManualClock;

use super::*;
use crate::config::Config;
use crate::engine::decided_at_once;
use crate::metrics::Metrics;

const WEB: &str = "\
domain: web
descriptors:
  - key: user
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: beta
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
";

/// `WEB` attached to an in-memory engine on a manual clock, with `options`.
fn mounted(options: Options) -> (Envoy, Engine<ManualClock>, Arc<Metrics>) {
    let config = Config::parse("[envoy]\nfiles = [\"web.yaml\"]\n").expect("valid");
    let domains = Domains::load([("web.yaml", WEB)]).expect("valid");
    let metrics = Arc::new(Metrics::new());
    let stacks = crate::engine::Stacks::open(&config.store, ManualClock::new(), None);
    let mut engine =
        Engine::new(&config, stacks.expect("memory"), Arc::clone(&metrics)).expect("builds");
    let envoy = Envoy::attach(domains, &mut engine)
        .expect("attaches")
        .with_options(options);
    (envoy, engine, metrics)
}

fn decide(envoy: &Envoy, engine: &Engine<ManualClock>, pairs: &[(&str, &str)]) -> Response {
    let descriptors = pairs
        .iter()
        .map(|(k, v)| Descriptor {
            entries: vec![((*k).to_owned(), (*v).to_owned())],
            ..Descriptor::default()
        })
        .collect();
    let request = Request {
        domain: "web".into(),
        descriptors,
        hits_addend: 0,
    };
    decided_at_once(envoy.decide(engine, &request)).expect("valid")
}

#[test]
fn each_configured_limit_is_a_policy_decided_all_or_nothing_on_the_engine() {
    let (envoy, engine, metrics) = mounted(Options::default());
    let both = [("user", "alice"), ("tenant", "acme")];
    assert_eq!(decide(&envoy, &engine, &both).overall, Code::Ok);
    for _ in 0..3 {
        let over = decide(&envoy, &engine, &both);
        let codes: Vec<Code> = over.statuses.iter().map(|s| s.code).collect();
        assert_eq!(codes, [Code::OverLimit, Code::Ok]);
    }
    // The denied requests took nothing from the tenant: 9 left, then 8 for another user.
    let other = decide(&envoy, &engine, &[("user", "bob"), ("tenant", "acme")]);
    assert_eq!(other.statuses[1].limit_remaining, 8);
    // Each limit is a policy of the engine, counted in its metrics.
    let text = metrics.render(engine.keys_held());
    assert!(text.contains("policy=\"envoy:web.user\""), "{text}");
    assert!(text.contains("policy=\"envoy:web.tenant\""), "{text}");
}

#[test]
fn the_services_statistics_reach_limiterds_metrics() {
    let (envoy, engine, metrics) = mounted(Options {
        shadow_mode: true,
        ..Options::default()
    });
    for _ in 0..3 {
        let r = decide(&envoy, &engine, &[("beta", "x"), ("user", "u")]);
        assert_eq!(r.overall, Code::Ok, "global shadow mode");
    }
    let text = metrics.render(engine.keys_held());
    for line in [
        "limiterd_envoy_rule_total{key=\"\",stat=\"global_shadow_mode\"} 2",
        "limiterd_envoy_rule_total{key=\"web.beta\",stat=\"shadow_mode\"} 2",
        "limiterd_envoy_rule_total{key=\"web.user\",stat=\"over_limit\"} 2",
        "limiterd_envoy_rule_total{key=\"web.user\",stat=\"within_limit\"} 1",
        // value_to_metric: one series per value besides the rule's own.
        "limiterd_envoy_rule_total{key=\"web.user_u\",stat=\"total_hits\"} 3",
        "policy=\"envoy:web.beta\",result=\"shadow_denied\"} 2",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

/// A request's future is boxed and moved whole by the gRPC server: the paths of negative hits
/// and of hits over a counter (each a further decision, rare) are boxed behind it, so the usual
/// request's future holds one decision's (it was 1,360 bytes with them inline).
#[test]
fn a_requests_future_stays_small() {
    let (envoy, engine, _metrics) = mounted(Options::default());
    let request = Request {
        domain: "web".into(),
        descriptors: Vec::new(),
        hits_addend: 0,
    };
    let size = std::mem::size_of_val(&envoy.decide(&engine, &request));
    assert!(size <= 1_024, "Envoy::decide's future is {size} bytes");
}
