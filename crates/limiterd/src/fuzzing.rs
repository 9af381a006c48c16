//! The bodies of limiterd's fuzz targets, shared with the plain test that replays saved
//! inputs: the request parsers (the API's and envoy's `POST /json`) and the configuration
//! parser must never panic, must refuse with a 400 and a message (or a line inside the file),
//! and what they accept must hold the bounds the engine relies on. (Envoy's descriptor loader
//! is fuzzed in limiter-envoy.)

use crate::app::AppState;
use crate::config::Config;
use crate::engine::{Charge, Engine, Item, PolicyId, Target};
use crate::envoy::Envoy;
use crate::envoy::rules::Domains;
use crate::envoy::service::{Code, EnvoyError};
use crate::http::request::{
    self as api, MAX_BATCH, MAX_DURATION_MS, MAX_IDENTIFIER, MAX_NAMESPACE,
};
use limiter_core::ManualClock;
use std::sync::OnceLock;

fn lookup(name: &str) -> Option<PolicyId> {
    (name == "api").then_some(PolicyId::from_index(0))
}

fn accepted(item: &Item) {
    assert!(!item.identifier.is_empty() && item.identifier.len() <= MAX_IDENTIFIER);
    if let Target::AdHoc {
        kind: _,
        limit,
        duration_ms,
        namespace,
    } = &item.target
    {
        assert!(
            *limit >= 1 && (item.cost <= *limit || item.charge == Charge::Record),
            "{item:?}"
        );
        assert!((1..=MAX_DURATION_MS).contains(duration_ms), "{item:?}");
        assert!(!namespace.is_empty() && namespace.len() <= MAX_NAMESPACE);
    }
}

/// Whether `bytes` is a JSON object, as far as its first byte says: every body the parsers
/// accept is one (an array is never read as an object by position).
fn an_object(bytes: &[u8]) -> bool {
    bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{')
}

/// One request body through both endpoints' parsers.
pub fn request(bytes: &[u8]) {
    envoy_json(bytes);
    match api::parse_request(bytes, &lookup) {
        Ok(asked) => {
            assert!(an_object(bytes));
            accepted(&asked.items);
        }
        Err(e) => {
            assert_eq!(e.status().as_u16(), 400, "{e:?}");
            assert!(!e.message.is_empty());
        }
    }
    match api::parse_many(bytes, &lookup) {
        Ok(asked) => {
            assert!(an_object(bytes));
            let items = asked.items;
            assert!((1..=MAX_BATCH).contains(&items.len()));
            items.iter().for_each(accepted);
        }
        Err(e) => {
            assert_eq!(e.status().as_u16(), 400, "{e:?}");
            assert!(!e.message.is_empty());
        }
    }
}

/// A small domain on a memory engine, for [`envoy_json`].
const FUZZ_DOMAIN: &str = "\
domain: web
descriptors:
  - key: a
    rate_limit: { unit: second, requests_per_unit: 2, algorithm: token_bucket }
    descriptors:
      - key: b
        value: x*
        rate_limit: { unit: minute, requests_per_unit: 3, name: ab }
  - key: c
    shadow_mode: true
    rate_limit: { unit: hour, requests_per_unit: 1, replaces: [{ name: ab }] }
  - key: d
    rate_limit: { unit: day, requests_per_unit: 0 }
";

type FuzzEnvoy = (Envoy, Engine<ManualClock>);

fn fuzz_envoy() -> &'static FuzzEnvoy {
    static ENVOY: OnceLock<FuzzEnvoy> = OnceLock::new();
    ENVOY.get_or_init(|| {
        let config = Config::parse("[envoy]\nfiles = [\"web.yaml\"]\n").expect("valid");
        let domains = Domains::load([("web.yaml", FUZZ_DOMAIN)]).expect("valid");
        let app = AppState::build(&config, domains, ManualClock::new(), None).expect("builds");
        (app.envoy, app.engine)
    })
}

/// One envoy `POST /json` body: parsed, then decided on a memory engine, which answers every
/// descriptor or refuses the request as invalid (never a store failure, never a panic).
pub fn envoy_json(bytes: &[u8]) {
    let request = match crate::envoy::json::parse(bytes) {
        Ok(request) => {
            assert!(an_object(bytes));
            request
        }
        Err(EnvoyError::Invalid(message)) => return assert!(!message.is_empty()),
        Err(e) => panic!("parsing never reports the store: {e}"),
    };
    let (envoy, engine) = fuzz_envoy();
    let result = crate::engine::decided_at_once(envoy.decide(engine, &request));
    match result {
        Ok(response) => {
            assert_eq!(response.statuses.len(), request.descriptors.len());
            let over = response.statuses.iter().any(|s| s.code == Code::OverLimit);
            assert!(!over || response.overall == Code::OverLimit);
        }
        Err(EnvoyError::Invalid(message)) => assert!(!message.is_empty()),
        Err(EnvoyError::Empty(message)) => {
            assert!(
                request.domain.is_empty() || request.descriptors.is_empty(),
                "{message}"
            );
        }
        Err(e) => panic!("a memory engine without max_keys never fails: {e}"),
    }
}

/// One configuration file.
pub fn config(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    match Config::parse(text) {
        Ok(config) => {
            assert!(!config.policies.is_empty());
            for policy in config.policies.values() {
                assert!(!policy.limits.is_empty());
                for l in &policy.limits {
                    assert!(l.limit.kind().check(l.limit.limit()).is_ok(), "{l:?}");
                }
                if let Some(lease) = policy.lease {
                    let (least, most) = crate::store::LEASE_TTL_RANGE;
                    let ttl = lease.time_to_live();
                    assert!(ttl >= least && ttl <= most, "{lease:?}");
                    if let crate::store::Slack::PartsPerMillion(ppm) = lease.slack() {
                        assert!(ppm <= 1_000_000, "{lease:?}");
                    }
                }
            }
        }
        Err(e) => {
            assert!(!e.message.is_empty());
            if let Some(line) = e.line {
                assert!(
                    line >= 1 && line <= text.split('\n').count(),
                    "line {line}: {e}"
                );
            }
        }
    }
}
