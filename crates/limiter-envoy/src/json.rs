//! The JSON form of `ShouldRateLimit`, for `POST /json` on the HTTP port (as envoy's reference
//! server offers it, for debugging with curl): the request and response in protobuf's JSON
//! mapping (camelCase names; snake_case accepted too).
//!
//! ```text
//! POST /json {"domain": "web", "descriptors": [{"entries": [{"key": "remote_address", "value": "10.0.0.1"}]}]}
//! 200 {"overallCode": "OK", "statuses": [{"code": "OK",
//!      "currentLimit": {"requestsPerUnit": 10, "unit": "SECOND"},
//!      "limitRemaining": 9, "durationUntilReset": "0.100s"}]}
//! ```
//!
//! The status is 200 for `OK` and 429 for `OVER_LIMIT`.

use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::rules::Unit;
use super::service::{Descriptor, EnvoyError, Override, Request, Response};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRequest {
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
    #[serde(default, alias = "hits_addend")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDescriptor {
    #[serde(default)]
    entries: Vec<RawEntry>,
    limit: Option<RawOverride>,
    #[serde(alias = "hits_addend")]
    hits_addend: Option<u64>,
    #[serde(default, alias = "is_negative_hits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawOverride {
    #[serde(alias = "requests_per_unit")]
    requests_per_unit: u32,
    /// A name (`"SECOND"`) or the enum's number.
    unit: Value,
}

/// Parses a `POST /json` body.
pub fn parse(body: &[u8]) -> Result<Request, EnvoyError> {
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let raw: RawRequest = serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let path = e.path().to_string();
        EnvoyError::Invalid(format!(
            "{path}: {}: send {{\"domain\": \"...\", \"descriptors\": [{{\"entries\": [{{\"key\": \"...\", \"value\": \"...\"}}]}}]}}",
            e.into_inner()
        ))
    })?;
    deserializer
        .end()
        .map_err(|e| EnvoyError::Invalid(format!("{e}: send one JSON object")))?;
    let descriptors = raw
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(i, d)| {
            let limit = match d.limit {
                None => None,
                Some(l) => Some(Override {
                    requests_per_unit: l.requests_per_unit,
                    unit: match &l.unit {
                        Value::Number(n) => n.as_i64().and_then(|n| i32::try_from(n).ok()).unwrap_or(0),
                        Value::String(name) => Unit::parse(name).map(Unit::number).ok_or_else(|| {
                            EnvoyError::Invalid(format!(
                                "descriptors[{i}].limit.unit: `{name}` is not a unit: send SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR"
                            ))
                        })?,
                        _ => 0,
                    },
                }),
            };
            Ok(Descriptor {
                entries: d.entries.into_iter().map(|e| (e.key, e.value)).collect(),
                limit,
                hits_addend: d.hits_addend,
                negative_hits: d.is_negative_hits,
            })
        })
        .collect::<Result<_, EnvoyError>>()?;
    Ok(Request {
        domain: raw.domain,
        descriptors,
        hits_addend: raw.hits_addend,
    })
}

/// A duration as protobuf's JSON writes it: seconds with 0, 3, 6 or 9 decimals and an `s`.
pub fn duration(d: Duration) -> String {
    let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
    if nanos == 0 {
        format!("{secs}s")
    } else if nanos % 1_000_000 == 0 {
        format!("{secs}.{:03}s", nanos / 1_000_000)
    } else if nanos % 1_000 == 0 {
        format!("{secs}.{:06}s", nanos / 1_000)
    } else {
        format!("{secs}.{nanos:09}s")
    }
}

/// The response as JSON.
pub fn render(response: &Response) -> Value {
    let statuses: Vec<Value> = response
        .statuses
        .iter()
        .map(|s| {
            let mut status = Map::new();
            status.insert("code".into(), json!(s.code.name()));
            if let Some(l) = &s.current_limit {
                let mut limit = Map::new();
                if !l.name.is_empty() {
                    limit.insert("name".into(), json!(l.name));
                }
                limit.insert("requestsPerUnit".into(), json!(l.requests_per_unit));
                limit.insert("unit".into(), json!(l.unit.name()));
                status.insert("currentLimit".into(), Value::Object(limit));
            }
            status.insert("limitRemaining".into(), json!(s.limit_remaining));
            if let Some(d) = s.duration_until_reset {
                status.insert("durationUntilReset".into(), json!(duration(d)));
            }
            Value::Object(status)
        })
        .collect();
    let mut out = Map::new();
    out.insert("overallCode".into(), json!(response.overall.name()));
    out.insert("statuses".into(), Value::Array(statuses));
    if !response.headers.is_empty() {
        let headers: Vec<Value> = response
            .headers
            .iter()
            .map(|(key, value)| json!({ "key": key, "value": value }))
            .collect();
        out.insert("responseHeadersToAdd".into(), Value::Array(headers));
    }
    if let Some(metadata) = &response.dynamic_metadata {
        out.insert("dynamicMetadata".into(), Value::Object(metadata.clone()));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_protobuf_json_mapping() {
        let request = parse(
            br#"{"domain":"web","hitsAddend":2,"descriptors":[
                {"entries":[{"key":"a","value":"1"},{"key":"b"}],"hits_addend":5},
                {"entries":[{"key":"c","value":"2"}],"limit":{"requestsPerUnit":7,"unit":"minute"}},
                {"entries":[{"key":"d","value":"3"}],"limit":{"requests_per_unit":8,"unit":4}}]}"#,
        )
        .expect("valid");
        assert_eq!(request.domain, "web");
        assert_eq!(request.hits_addend, 2);
        let d = &request.descriptors;
        assert_eq!(
            d[0].entries,
            [("a".into(), "1".into()), ("b".into(), String::new())]
        );
        assert_eq!(d[0].hits_addend, Some(5));
        assert_eq!(
            d[1].limit,
            Some(Override {
                requests_per_unit: 7,
                unit: 2
            })
        );
        assert_eq!(d[2].limit.map(|l| l.unit), Some(4));
    }

    #[test]
    fn refusals_name_the_field() {
        for (body, field) in [
            (&br#"{"descriptors":[]}"#[..], "domain"),
            (br#"{"domain":"web","descriptors":[{"entries":[{"value":"x"}]}]}"#, "descriptors[0].entries[0]"),
            (br#"{"domain":"web","descriptors":[{"entries":[],"limit":{"requestsPerUnit":1,"unit":"fortnight"}}]}"#, "descriptors[0].limit.unit"),
            (br#"{"domain":"web","hitsAddend":-1}"#, "hitsAddend"),
            (br#"{"domain":"web","extra":1}"#, "extra"),
            (br#"{"domain":"web"} {}"#, "one JSON object"),
        ] {
            let EnvoyError::Invalid(message) = parse(body).expect_err(field) else {
                panic!("invalid")
            };
            assert!(message.contains(field), "{field}: {message}");
        }
    }

    #[test]
    fn durations_are_written_as_protobuf_json_does() {
        assert_eq!(duration(Duration::from_secs(60)), "60s");
        assert_eq!(duration(Duration::from_millis(1_500)), "1.500s");
        assert_eq!(duration(Duration::from_micros(2)), "0.000002s");
        assert_eq!(duration(Duration::from_nanos(1)), "0.000000001s");
    }
}
