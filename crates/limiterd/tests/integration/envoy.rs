//! Envoy's rate-limit protocol as envoy uses it: the limiterd binary started with descriptor
//! files (`tests/envoy/*.yaml`), asked by a real tonic client over loopback gRPC, and the same
//! steps asked of a fresh process over `POST /json`, in memory and on Redis. Each file's steps
//! and expected answers are in the `.json` beside it (a step repeated checks its statuses on
//! the last repetition). Every limit is per hour or per day; windows are aligned to the Unix
//! epoch, so a window turns during a test only in a run that crosses the top of an hour: a
//! run that failed across one runs again.

use limiter_testkit::redis_server;

use std::path::{Path, PathBuf};

use crate::support::windows::{DAY_MS, HOUR_MS, in_one_window};
use crate::support::{Client, Counting, Daemon, grpc_channel, temp_file};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// One step of a case file.
#[derive(Debug)]
struct Step {
    note: String,
    descriptors: Vec<Vec<(String, String)>>,
    /// Each descriptor's own `hits_addend`, where the case gives one.
    descriptor_hits: Vec<Option<u64>>,
    /// Each descriptor's limit override (`"override": [count, "UNIT"]`), where it has one.
    overrides: Vec<Option<(u32, String)>>,
    /// Each descriptor's `is_negative_hits` (`"negative": true`).
    negative: Vec<bool>,
    hits: u32,
    repeat: usize,
    overall: String,
    statuses: Vec<(String, u32)>,
    /// `Some(None)`: no limit applies; `Some(Some((count, unit, name)))`: this one.
    limit: Option<Option<(u32, String, String)>>,
}

fn steps(path: &Path) -> Vec<Step> {
    let text = std::fs::read_to_string(path).expect("case file");
    let cases: Vec<Value> = serde_json::from_str(&text).expect("JSON");
    cases
        .into_iter()
        .map(|c| Step {
            note: c["note"].as_str().expect("note").to_owned(),
            descriptor_hits: c["send"]
                .as_array()
                .expect("send")
                .iter()
                .map(|d| d.get("hits").and_then(Value::as_u64))
                .collect(),
            negative: c["send"]
                .as_array()
                .expect("send")
                .iter()
                .map(|d| d.get("negative").and_then(Value::as_bool).unwrap_or(false))
                .collect(),
            overrides: c["send"]
                .as_array()
                .expect("send")
                .iter()
                .map(|d| {
                    d.get("override").map(|o| {
                        (
                            o[0].as_u64().expect("count") as u32,
                            o[1].as_str().expect("unit").to_owned(),
                        )
                    })
                })
                .collect(),
            descriptors: c["send"]
                .as_array()
                .expect("send")
                .iter()
                .map(|d| {
                    // `[entries]`, or `{"entries": [...], "hits": n}`.
                    d.get("entries")
                        .unwrap_or(d)
                        .as_array()
                        .expect("entries")
                        .iter()
                        .map(|e| {
                            (
                                e[0].as_str().expect("key").to_owned(),
                                e[1].as_str().expect("value").to_owned(),
                            )
                        })
                        .collect()
                })
                .collect(),
            hits: c["hits"].as_u64().map_or(0, |h| h as u32),
            repeat: c["repeat"].as_u64().map_or(1, |r| r as usize),
            overall: c["expect"].as_str().expect("expect").to_owned(),
            statuses: c["statuses"]
                .as_array()
                .expect("statuses")
                .iter()
                .map(|s| {
                    (
                        s[0].as_str().expect("code").to_owned(),
                        s[1].as_u64().expect("remaining") as u32,
                    )
                })
                .collect(),
            limit: c.get("limit").map(|l| {
                l.as_array().map(|l| {
                    (
                        l[0].as_u64().expect("count") as u32,
                        l[1].as_str().expect("unit").to_owned(),
                        l.get(2).and_then(Value::as_str).unwrap_or("").to_owned(),
                    )
                })
            }),
        })
        .collect()
}

fn case_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/envoy");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/envoy")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "the case files are committed");
    files
}

fn domain_of(yaml: &Path) -> String {
    let text = std::fs::read_to_string(yaml).expect("yaml");
    text.lines()
        .find_map(|l| l.strip_prefix("domain: "))
        .expect("a domain line")
        .trim()
        .to_owned()
}

/// Starts limiterd serving `yaml` (with `extra` arguments); its gRPC address.
fn start_with(yaml: &Path, extra: &[&str]) -> (Daemon, String) {
    let mut args = vec![
        "--envoy",
        yaml.to_str().expect("UTF-8 path"),
        "--grpc-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let mut daemon = Daemon::start(&args);
    let rest = daemon.line_after("envoy rate-limit gRPC on ");
    let grpc = rest.split(';').next().expect("an address").to_owned();
    (daemon, grpc)
}

fn start(yaml: &Path) -> (Daemon, String) {
    start_with(yaml, &[])
}

async fn grpc_client(addr: &str) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::new(grpc_channel(addr).await)
}

fn wire_request(domain: &str, step: &Step) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: step
            .descriptors
            .iter()
            .zip(&step.descriptor_hits)
            .zip(&step.overrides)
            .zip(&step.negative)
            .map(|(((entries, hits), limit), negative)| RateLimitDescriptor {
                is_negative_hits: *negative,
                entries: entries
                    .iter()
                    .map(|(key, value)| Entry {
                        key: key.clone(),
                        value: value.clone(),
                    })
                    .collect(),
                hits_addend: hits
                    .map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
                limit: limit.as_ref().map(|(count, unit)| RateLimitOverride {
                    requests_per_unit: *count,
                    unit: Unit::from_str_name(unit).expect("a unit") as i32,
                }),
            })
            .collect(),
        hits_addend: step.hits,
    }
}

fn json_request(domain: &str, step: &Step) -> Value {
    json!({
        "domain": domain,
        "hitsAddend": step.hits,
        "descriptors": step.descriptors.iter().zip(&step.descriptor_hits).zip(&step.overrides).zip(&step.negative).map(|(((entries, hits), limit), negative)| {
            let mut d = json!({
                "entries": entries.iter().map(|(k, v)| json!({"key": k, "value": v})).collect::<Vec<_>>()
            });
            if let Some(hits) = hits {
                d["hitsAddend"] = json!(hits);
            }
            if let Some((count, unit)) = limit {
                d["limit"] = json!({"requestsPerUnit": count, "unit": unit});
            }
            if *negative {
                d["isNegativeHits"] = json!(true);
            }
            d
        }).collect::<Vec<_>>(),
    })
}

/// What one answer said, in the case files' terms.
#[derive(Debug, PartialEq)]
struct Seen {
    overall: String,
    statuses: Vec<(String, u32)>,
    first_limit: Option<(u32, String, String)>,
}

fn unit_name(number: i32) -> String {
    Unit::try_from(number)
        .map(|u| u.as_str_name().to_owned())
        .unwrap_or_else(|_| format!("junk {number}"))
}

async fn ask_grpc(client: &mut RateLimitServiceClient<Channel>, domain: &str, step: &Step) -> Seen {
    let response = client
        .should_rate_limit(wire_request(domain, step))
        .await
        .unwrap_or_else(|s| panic!("{}: {s:?}", step.note))
        .into_inner();
    let code = |c: i32| {
        Code::try_from(c)
            .map(|c| c.as_str_name().to_owned())
            .unwrap_or_default()
    };
    Seen {
        overall: code(response.overall_code),
        statuses: response
            .statuses
            .iter()
            .map(|s| (code(s.code), s.limit_remaining))
            .collect(),
        first_limit: response.statuses[0]
            .current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, unit_name(l.unit), l.name.clone())),
    }
}

async fn ask_json(client: &mut Client, domain: &str, step: &Step) -> Seen {
    let (status, body) = client.post("/json", &json_request(domain, step)).await;
    let overall = body["overallCode"]
        .as_str()
        .expect("overallCode")
        .to_owned();
    assert_eq!(
        status,
        if overall == "OK" { 200 } else { 429 },
        "{}: {body}",
        step.note
    );
    let statuses = body["statuses"].as_array().expect("statuses");
    Seen {
        overall,
        statuses: statuses
            .iter()
            .map(|s| {
                (
                    s["code"].as_str().expect("code").to_owned(),
                    s["limitRemaining"].as_u64().expect("limitRemaining") as u32,
                )
            })
            .collect(),
        first_limit: statuses[0].get("currentLimit").map(|l| {
            (
                l["requestsPerUnit"].as_u64().expect("count") as u32,
                l["unit"].as_str().expect("unit").to_owned(),
                l.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            )
        }),
    }
}

/// Every repetition has the step's overall code; the last one also its statuses.
fn check(file: &Path, via: &str, step: &Step, seen: &Seen, last: bool) {
    let at = format!("{} via {via}: {}", file.display(), step.note);
    assert_eq!(seen.overall, step.overall, "{at}");
    assert_eq!(seen.statuses.len(), step.statuses.len(), "{at}");
    if last {
        assert_eq!(seen.statuses, step.statuses, "{at}");
    }
    if let Some(limit) = &step.limit {
        assert_eq!(&seen.first_limit, limit, "{at}");
    }
}

/// How a case file's steps are asked: over gRPC, or over `POST /json`.
enum Asker {
    Grpc(RateLimitServiceClient<Channel>),
    Json(Client),
}

impl Asker {
    async fn ask(&mut self, domain: &str, step: &Step) -> Seen {
        match self {
            Asker::Grpc(client) => ask_grpc(client, domain, step).await,
            Asker::Json(client) => ask_json(client, domain, step).await,
        }
    }
}

/// A case file's steps asked of a fresh limiterd (in memory, or on a Redis of its own, so
/// every run starts from empty counters), over gRPC or over `POST /json`.
async fn every_step_of(file: PathBuf, grpc: bool, on_redis: bool) {
    let steps = steps(&file.with_extension("json"));
    let domain = domain_of(&file);
    let counting = Counting::new(on_redis);
    let (daemon, grpc_addr) = start_with(&file, &counting.args());
    let mut asker = if grpc {
        Asker::Grpc(grpc_client(&grpc_addr).await)
    } else {
        Asker::Json(Client::connect(daemon.addr).await)
    };
    let via = match (grpc, on_redis) {
        (true, false) => "gRPC",
        (false, false) => "POST /json",
        (true, true) => "gRPC on Redis",
        (false, true) => "POST /json on Redis",
    };
    for step in &steps {
        for i in 1..=step.repeat {
            let seen = asker.ask(&domain, step).await;
            check(&file, via, step, &seen, i == step.repeat);
        }
    }
}

/// Every case file, each way (their limits are per hour or per day: a run that crossed the
/// top of an hour and failed runs again).
#[tokio::test]
async fn every_case_file_over_grpc_and_over_json() {
    for file in case_files() {
        for (grpc, on_redis) in [(true, false), (false, false), (true, true), (false, true)] {
            let file = file.clone();
            in_one_window(HOUR_MS, move || every_step_of(file.clone(), grpc, on_redis)).await;
        }
    }
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument_and_the_service_goes_on() {
    let file = case_files().remove(0);
    let domain = domain_of(&file);
    let (daemon, addr) = start(&file);
    let mut grpc = grpc_client(&addr).await;
    let empty = |domain: &str| RateLimitRequest {
        domain: domain.to_owned(),
        ..RateLimitRequest::default()
    };
    // No domain or no descriptors: the reference's error, gRPC UNKNOWN.
    for (request, field) in [(empty(""), "domain"), (empty(&domain), "descriptors")] {
        let status = grpc.should_rate_limit(request).await.expect_err("empty");
        assert_eq!(status.code(), tonic::Code::Unknown, "{status:?}");
        assert!(status.message().starts_with(field), "{status:?}");
    }
    let negative = RateLimitRequest {
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".into(),
                value: "v".into(),
            }],
            is_negative_hits: true,
            ..RateLimitDescriptor::default()
        }],
        ..empty(&domain)
    };
    // Negative hits are given back (the case files check the counts): answered, never refused.
    let answer = grpc
        .should_rate_limit(negative)
        .await
        .expect("is_negative_hits is served")
        .into_inner();
    assert_eq!(answer.overall_code, Code::Ok as i32, "{answer:?}");
    // A descriptor with no entries, or an empty key, matches no limit and is answered: the
    // request is not refused, so envoy's failure_mode_deny: false cannot wave it through.
    let mut http = Client::connect(daemon.addr).await;
    let (status, body) = http
        .post(
            "/json",
            &json!({"domain": domain, "descriptors": [{"entries": []}, {"entries": [{"key": "", "value": "x"}]}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["statuses"].as_array().map(Vec::len), Some(2), "{body}");
    let (status, body) = http.post("/json", &json!({"domain": ""})).await;
    assert_eq!(status, 400, "{body}");
    // protobuf's JSON writes a descriptor's `hitsAddend` (a `UInt64Value`) as a string.
    let entries = json!([{"key": "k", "value": "string-hits"}]);
    let (status, body) = http
        .post(
            "/json",
            &json!({"domain": domain, "descriptors": [{"entries": entries, "hitsAddend": "2"}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // An array is never read as the request's object by position.
    let (status, body) = http.post("/json", &json!([domain, [], 1])).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("invalid type: array, expected a JSON object"),
        "{body}"
    );
    let (status, metrics) = http.send("GET", "/metrics", "").await;
    assert_eq!(status, 200);
    assert!(
        metrics.contains("limiterd_invalid_requests_total 4"),
        "{metrics}"
    );
}

#[test]
fn check_config_reads_descriptor_files_and_points_at_the_line() {
    let bad = temp_file(
        "bad.yaml",
        "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .args(["check-config", bad.to_str().expect("UTF-8")])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("bad.yaml:4:25: descriptors[0].rate_limit.unit: `fortnight` is not a unit"),
        "{stderr}"
    );
    // A TOML configuration naming the file (relative to itself) is checked through it.
    let toml = temp_file("with-envoy.toml", "[envoy]\nfiles = [\"bad.yaml\"]\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .args(["check-config", toml.to_str().expect("UTF-8")])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.yaml:4:25"));

    // A field the reference ignores where it means nothing: valid, with a warning naming it.
    let stray = temp_file(
        "stray.yaml",
        "domain: web\ndescriptors:\n  - key: a\n    unit: second\n    rate_limit: { unit: minute, requests_per_unit: 1 }\n",
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
        .args(["check-config", stray.to_str().expect("UTF-8")])
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: ")
            && stderr
                .contains("stray.yaml:4:5: descriptors[0].unit: means nothing here and is ignored"),
        "{stderr}"
    );

    for file in case_files() {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_limiterd"))
            .args(["check-config", file.to_str().expect("UTF-8")])
            .output()
            .expect("runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("valid; domain"));
    }
}

#[tokio::test]
async fn two_processes_on_one_redis_share_every_descriptor_counter() {
    in_one_window(DAY_MS, two_processes_share_every_descriptor_counter).await;
}

/// Two processes on one fresh Redis: a user's daily 5 is counted once across both, and the
/// denied requests take nothing from the tenant's hourly sliding window.
async fn two_processes_share_every_descriptor_counter() {
    let server = redis_server::RedisServer::start();
    let file = temp_file(
        &format!("shared-{}.yaml", server.port),
        "domain: shared\ndescriptors:\n  - key: user\n    rate_limit: { unit: day, requests_per_unit: 5 }\n  - key: tenant\n    rate_limit: { unit: hour, requests_per_unit: 20, algorithm: sliding_window }\n",
    );
    let url = server.url();
    let (_a, first) = start_with(&file, &["--redis", &url]);
    let (_b, second) = start_with(&file, &["--redis", &url]);
    let step = |user: &str| Step {
        note: format!("user {user}"),
        descriptors: vec![
            vec![("user".into(), user.into())],
            vec![("tenant".into(), "acme".into())],
        ],
        descriptor_hits: vec![None, None],
        overrides: vec![None, None],
        negative: vec![false, false],
        hits: 0,
        repeat: 1,
        overall: String::new(),
        statuses: Vec::new(),
        limit: None,
    };
    let mut clients = [grpc_client(&first).await, grpc_client(&second).await];
    let mut admitted = 0;
    for i in 0..12 {
        let seen = ask_grpc(&mut clients[i % 2], "shared", &step("alice")).await;
        if seen.overall == "OK" {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 5, "one daily limit across both processes");
    // The seven denied requests took nothing from the tenant: 20 - 5 left, seen by either.
    let seen = ask_grpc(&mut clients[1], "shared", &step("bob")).await;
    assert_eq!(seen.overall, "OK");
    assert_eq!(seen.statuses[1], ("OK".to_owned(), 14));
}
