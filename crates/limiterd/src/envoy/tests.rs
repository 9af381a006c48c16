//! Envoy's service mounted on limiterd's engine: all or nothing on the engine's stacks, and
//! the service's statistics in limiterd's metrics. The service itself (matching, overrides,
//! malformed input, quota mode, headers, metadata) is tested in limiter-envoy, on an
//! in-process decider.
use std::sync::Arc;

use limiter_envoy::rules::Unit;
use limiter_envoy::service::{
    Code, Descriptor, HeaderNames, Options, Override, Request, Response, Status,
};

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
}

fn fixture() -> Fixture {
    fixture_of(WEB, Options::default())
}

/// `file` attached to an in-memory engine on a manual clock, with `options`.
fn fixture_of(file: &str, options: Options) -> Fixture {
    let config = Config::parse("[envoy]\nfiles = [\"web.yaml\"]\n").expect("valid");
    let domains = Domains::load([("web.yaml", file)]).expect("valid");
    let clock = ManualClock::new();
    let metrics = Arc::new(Metrics::new());
    let mut engine = Engine::new(
        &config,
        crate::engine::Stacks::open(&config.store, clock.clone(), None).expect("memory"),
        Arc::clone(&metrics),
    )
    .expect("builds");
    let envoy = Envoy::attach(domains, &mut engine)
        .expect("attaches")
        .with_options(options);
    Fixture {
        envoy,
        engine,
        metrics,
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
        self.remaining_status(pairs).limit_remaining
    }

    /// A check (`hits_addend: 0`) of `pairs`: its status.
    fn remaining_status(&self, pairs: &[(&str, &str)]) -> Status {
        let mut d = descriptor(pairs);
        d.hits_addend = Some(0);
        self.decide(vec![d]).statuses.remove(0)
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

const SWITCHES: &str = "\
domain: web
descriptors:
  - key: soft
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: user
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: tenant
    rate_limit: { unit: hour, requests_per_unit: 5 }
";

fn with_options(options: Options) -> Fixture {
    fixture_of(SWITCHES, options)
}

#[test]
fn headers_metadata_and_global_shadow_mode_follow_the_options() {
    let f = with_options(Options {
        shadow_mode: true,
        headers: Some(HeaderNames::default()),
        dynamic_metadata: true,
        ..Options::default()
    });
    for round in 1..=7_u32 {
        let r = f.decide(vec![
            descriptor(&[("tenant", "t")]),
            descriptor(&[("user", "u")]),
        ]);
        // Global shadow mode: always OK overall, while the statuses say what was over.
        assert_eq!(r.overall, Code::Ok, "round {round}");
        let over = round > 5;
        assert_eq!(r.statuses[0].code == Code::OverLimit, over, "round {round}");
        // The headers follow the descriptor closest to its limit: the tenant's.
        let remaining = 5_u32.saturating_sub(round);
        assert_eq!(
            r.headers,
            vec![
                ("RateLimit-Limit".to_owned(), "5".to_owned()),
                ("RateLimit-Remaining".to_owned(), remaining.to_string()),
                ("RateLimit-Reset".to_owned(), "3600".to_owned()),
            ],
            "round {round}"
        );
        let metadata = r.dynamic_metadata.expect("enabled");
        assert_eq!(metadata["domain"], serde_json::json!("web"));
        assert_eq!(
            metadata["descriptors"][1]["entries"],
            serde_json::json!(["user=u"])
        );
    }
    assert_eq!(f.remaining(&[("user", "u")]), 3, "what fitted was counted");
    // A limit envoy sends with the descriptor is still enforced.
    let sent = Descriptor {
        limit: Some(Override {
            requests_per_unit: 1,
            unit: Unit::Hour.number(),
        }),
        ..descriptor(&[("user", "sent")])
    };
    assert_eq!(f.decide(vec![sent.clone()]).overall, Code::Ok);
    assert_eq!(f.decide(vec![sent]).overall, Code::OverLimit);
    let text = f.metrics.render(0);
    for line in [
        "limiterd_envoy_rule_total{key=\"\",stat=\"global_shadow_mode\"} 2",
        "limiterd_envoy_rule_total{key=\"web.tenant\",stat=\"over_limit\"} 2",
        "limiterd_envoy_rule_total{key=\"web.tenant\",stat=\"within_limit\"} 5",
        // 80% of 5 is 4: the 5th hit is near the limit.
        "limiterd_envoy_rule_total{key=\"web.tenant\",stat=\"near_limit\"} 1",
        // value_to_metric: one series per value besides the rule's own.
        "limiterd_envoy_rule_total{key=\"web.user_u\",stat=\"total_hits\"} 7",
        "limiterd_envoy_rule_total{key=\"web.user\",stat=\"total_hits\"} 7",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}
