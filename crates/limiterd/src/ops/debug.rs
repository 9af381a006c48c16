//! What an operator looks at: the loaded configuration as JSON ([`config`], served at
//! `GET /debug/config`), the live status ([`status`], at `GET /debug/status`: every policy's
//! totals, the identifiers denied most, readiness), and the HTML status page
//! ([`STATUS_PAGE`], at `GET /`) that reads the status every second and shows decision rates.

use serde_json::{Value, json};

use crate::app::AppState;
use crate::config::{
    Config, Keying, Login, PasswordFrom, RedisAt, RedisConnection, Store, TlsFiles,
};
use crate::envoy::Domains;
use crate::ops::live::Readiness;

/// The status page: one static file, no external resources; its script polls
/// `/debug/status` and derives rates from the totals' differences.
pub const STATUS_PAGE: &str = include_str!("status.html");

fn failure_name(on_failure: crate::store::OnFailure) -> &'static str {
    match on_failure {
        crate::store::OnFailure::Open => "open",
        crate::store::OnFailure::Closed => "closed",
        crate::store::OnFailure::Fallback => "fallback",
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn store(store: &Store) -> Value {
    match store {
        Store::Memory { max_keys } => json!({"kind": "memory", "max_keys": max_keys}),
        Store::Redis {
            connection,
            on_failure,
            fleet_size,
        } => {
            let mut shown = redis_connection(connection);
            shown["kind"] = json!("redis");
            shown["on_failure"] = json!(failure_name(*on_failure));
            shown["fleet_size"] = json!(fleet_size);
            shown
        }
    }
}

/// How limiterd reaches Redis, as `/debug/config` shows it: URLs with their passwords
/// redacted, where each password comes from (never the password), TLS files by name.
fn redis_connection(connection: &RedisConnection) -> Value {
    let urls = |urls: &[crate::store::RedisUrl]| -> Vec<String> {
        urls.iter().map(ToString::to_string).collect()
    };
    let (url, cluster, sentinel) = match &connection.at {
        RedisAt::Server(url) => (Some(url.to_string()), None, None),
        RedisAt::Cluster(seeds) => (None, Some(urls(seeds)), None),
        RedisAt::Sentinel(at) => (
            None,
            None,
            Some(json!({
                "master": at.master,
                "sentinels": urls(&at.sentinels),
                "login": login(&at.login),
                "tls": at.tls.as_ref().map(tls),
            })),
        ),
    };
    json!({
        "url": url,
        "cluster": cluster,
        "sentinel": sentinel,
        "timeout_ms": millis(connection.timeout),
        "login": login(&connection.login),
        "tls": connection.tls.as_ref().map(tls),
        "breaker": {
            "failures_to_open": connection.breaker.failures_to_open,
            "open_ms": millis(connection.breaker.open_for),
        },
        "wait_replicas": connection.wait.map(|w| json!({
            "replicas": w.replicas,
            "timeout_ms": millis(w.timeout),
        })),
    })
}

fn login(login: &Login) -> Value {
    json!({
        "username": login.username,
        "password": login.password.as_ref().map(PasswordFrom::describe),
    })
}

fn tls(tls: &TlsFiles) -> Value {
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().map(|p| p.display().to_string());
    json!({
        "ca_file": path(&tls.ca_file),
        "cert_file": path(&tls.cert_file),
        "key_file": path(&tls.key_file),
        "server_name": tls.server_name,
    })
}

/// unkey's overrides, by namespace, as `/debug/config` shows them (and where they are kept).
pub fn overrides(overrides: &super::overrides::Overrides) -> Value {
    let namespaces: serde_json::Map<String, Value> = overrides
        .snapshot()
        .into_iter()
        .map(|(namespace, list)| {
            let shown = list
                .iter()
                .map(|o| {
                    serde_json::json!({
                        "override_id": o.id,
                        "identifier": o.identifier,
                        "limit": o.limit,
                        "duration_ms": o.duration_ms,
                    })
                })
                .collect();
            (namespace, Value::Array(shown))
        })
        .collect();
    serde_json::json!({
        "file": overrides.kept_in(),
        "namespaces": namespaces,
    })
}

/// How many overrides there are, the first [`SHOWN_OVERRIDES`] (by namespace, then
/// identifier), as the status page lists them, and why the last poll of Redis could not read
/// them (`read_error`, `null` when it could or they are not on Redis).
pub fn override_list(overrides: &super::overrides::Overrides) -> Value {
    let all = overrides.snapshot();
    let count: usize = all.values().map(Vec::len).sum();
    let shown: Vec<Value> = all
        .iter()
        .flat_map(|(namespace, list)| {
            list.iter().map(move |o| {
                json!({
                    "namespace": namespace,
                    "identifier": o.identifier,
                    "limit": o.limit,
                    "duration_ms": o.duration_ms,
                })
            })
        })
        .take(SHOWN_OVERRIDES)
        .collect();
    json!({ "count": count, "shown": shown, "read_error": overrides.read_error() })
}

/// The most overrides the status page lists.
pub const SHOWN_OVERRIDES: usize = 100;

/// One policy as served: its rate limits as checked, failure policy, lease and concurrency.
fn policy_view(policy: &crate::config::Policy) -> Value {
    let limits: Vec<Value> = policy
        .limits
        .iter()
        .map(|l| {
            let limit = l.limit.limit();
            let mut view = json!({
                "algorithm": limiter_stack::Kind::id(l.limit.kind()),
                "count": limit.count(),
                "period_ms": millis(limit.period()),
                "burst": limit.burst(),
                "key": match l.keying {
                    Keying::Identifier => "identifier",
                    Keying::Global => "global",
                },
            });
            if let Some(calendar) = l.limit.calendar() {
                view["calendar"] = json!({"zone": calendar.zone, "period": calendar.unit.period()});
            }
            view
        })
        .collect();
    let mut value = json!({"limits": limits, "on_failure": failure_name(policy.on_failure)});
    if let Some(lease) = policy.lease {
        value["lease"] = json!({
            "slack": lease.slack().to_string(),
            "ttl_ms": millis(lease.time_to_live()),
        });
    }
    if let Some(concurrency) = policy.concurrency {
        value["concurrency"] = json!({
            "count": concurrency.count,
            "ttl_ms": millis(concurrency.ttl),
            "key": match concurrency.keying {
                Keying::Identifier => "identifier",
                Keying::Global => "global",
            },
        });
    }
    value
}

/// The configuration as served: every policy's limits as checked (`period_ms`, `burst`
/// resolved), the store, the `[server]` settings, and each envoy domain's effective limits
/// (one per descriptor path, with where it was written).
pub fn config(config: &Config, domains: &Domains) -> Value {
    let policies: serde_json::Map<String, Value> = config
        .policies
        .iter()
        .map(|(name, policy)| (name.clone(), policy_view(policy)))
        .collect();
    let envoy = config.envoy.as_ref().map(|envoy| {
        let domains: Vec<Value> = domains
            .iter()
            .map(|domain| {
                let limits: Vec<Value> = domain
                    .limits()
                    .map(|l| {
                        json!({
                            "key": l.full_key,
                            "name": l.name,
                            "requests_per_unit": l.requests_per_unit,
                            "unit": l.unit.name(),
                            "algorithm": limiter_stack::Kind::id(l.kind),
                            "shadow_mode": l.shadow,
                            "replaces": l.replaces,
                            "location": l.location,
                        })
                    })
                    .collect();
                json!({"domain": domain.name, "file": domain.file, "limits": limits})
            })
            .collect();
        json!({
            "listen": envoy.listen.to_string(),
            "files": envoy.files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>(),
            "domains": domains,
        })
    });
    let server = config.server;
    json!({
        "listen": config.listen.to_string(),
        "store": store(&config.store),
        "server": {
            "header_timeout_ms": millis(server.header_timeout),
            "body_timeout_ms": millis(server.body_timeout),
            "shutdown_timeout_ms": millis(server.shutdown_timeout),
            "reload_check_ms": millis(server.reload_check),
        },
        "policies": policies,
        "envoy": envoy,
    })
}

/// The live status: readiness, the store, every policy's totals (configured ones, envoy's
/// descriptor limits as `envoy:<key>`, ad-hoc limits together), and the identifiers denied
/// most.
pub fn status<C>(state: &AppState<C>, readiness: &Readiness, now_ms: u64) -> Value
where
    C: limiter_core::Clock + Clone + Send + Sync + 'static,
{
    let mut served: std::collections::HashSet<String> =
        state.config.policies.keys().cloned().collect();
    served.insert(crate::metrics::AD_HOC.to_owned());
    for domain in state.envoy.domains().iter() {
        served.extend(domain.limits().map(|l| format!("envoy:{}", l.full_key)));
    }
    // Policies a reload removed keep their totals, marked as no longer served.
    let policies: Vec<Value> = state
        .metrics
        .totals()
        .into_iter()
        .map(|(name, totals)| {
            json!({
                "serving": served.contains(&name),
                "name": name,
                "totals": totals,
            })
        })
        .collect();
    let mut store = json!({
        "kind": match state.config.store {
            Store::Memory { .. } => "memory",
            Store::Redis { .. } => "redis",
        },
        "keys_held": state.engine.keys_held(),
    });
    if let Some(health) = &readiness.store {
        store["health"] = json!(health);
    }
    json!({
        "service": "limiterd",
        "version": env!("CARGO_PKG_VERSION"),
        "now_ms": now_ms,
        "readiness": readiness,
        "store": store,
        "policies": policies,
        "top_denied": state.metrics.top_denied(),
    })
}

#[cfg(test)]
mod tests {
    use limiter_core::ManualClock;

    use super::*;
    use crate::config::BUILT_IN;

    #[test]
    fn the_configuration_view_shows_resolved_limits_and_envoy_domains() {
        let text = format!("{BUILT_IN}\n[envoy]\nfiles = [\"web.yaml\"]\n");
        let config = Config::parse(&text).expect("valid");
        let domains = Domains::load([(
            "web.yaml",
            "domain: web\ndescriptors:\n  - key: ip\n    rate_limit: { unit: day, requests_per_unit: 5 }\n",
        )])
        .expect("valid");
        let view = super::config(&config, &domains);
        let api = &view["policies"]["api"]["limits"];
        assert_eq!(api[0]["algorithm"], "token_bucket");
        assert_eq!(api[0]["burst"], 20);
        assert_eq!(api[1]["period_ms"], 3_600_000);
        assert_eq!(view["policies"]["global"]["limits"][1]["key"], "global");
        assert_eq!(view["server"]["body_timeout_ms"], 10_000);
        let limit = &view["envoy"]["domains"][0]["limits"][0];
        assert_eq!(limit["key"], "web.ip");
        assert_eq!(
            (limit["unit"].clone(), limit["requests_per_unit"].clone()),
            (json!("DAY"), json!(5))
        );
        assert_eq!(limit["algorithm"], "fixed_window");

        let state = AppState::build(&config, domains, ManualClock::new(), None).unwrap();
        let readiness = Readiness {
            ready: true,
            store_reachable: true,
            store_error: None,
            store: None,
            draining: false,
        };
        let status = super::status(&state, &readiness, 7);
        let names: Vec<&str> = status["policies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "(ad hoc)",
                "api",
                "envoy:web.ip",
                "exports",
                "global",
                "login"
            ]
        );
        assert_eq!(status["readiness"]["ready"], true);
        assert_eq!(status["store"]["kind"], "memory");
    }
}
