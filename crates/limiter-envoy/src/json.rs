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

use std::fmt;
use std::marker::PhantomData;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::{Map, Value, json};

use super::rules::Unit;
use super::service::{Descriptor, EnvoyError, Override, Request, Response};

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawRequest {
    domain: String,
    #[serde(default)]
    descriptors: Vec<RawDescriptor>,
    #[serde(default, alias = "hits_addend", deserialize_with = "proto_int")]
    hits_addend: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawDescriptor {
    #[serde(default)]
    entries: Vec<RawEntry>,
    limit: Option<RawOverride>,
    #[serde(default, alias = "hits_addend", deserialize_with = "proto_int_or_null")]
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
    #[serde(alias = "requests_per_unit", deserialize_with = "proto_int")]
    requests_per_unit: u32,
    /// A name (`"SECOND"`) or the enum's number.
    unit: Value,
}

/// An integer as protobuf's JSON mapping gives one: a number, or its decimal digits in a string
/// (how it writes 64-bit integers, such as a descriptor's `hitsAddend`; every integer is read
/// from either), or `null` for 0.
fn proto_int<'de, D: Deserializer<'de>, T: ProtoUnsigned>(deserializer: D) -> Result<T, D::Error> {
    deserializer.deserialize_any(ProtoInt(PhantomData))
}

/// [`proto_int`] for a field that may be `null` (protobuf's JSON for an unset wrapper).
fn proto_int_or_null<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<u64>, D::Error> {
    Option::<ProtoIntValue>::deserialize(deserializer).map(|v| v.map(|ProtoIntValue(n)| n))
}

/// A `u64` read by [`proto_int`].
struct ProtoIntValue(u64);

impl<'de> Deserialize<'de> for ProtoIntValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        proto_int(deserializer).map(ProtoIntValue)
    }
}

/// An unsigned integer type of protobuf's (`uint32`, `uint64`), and its largest value.
trait ProtoUnsigned: TryFrom<u64> {
    const MAX: u64;
}

impl ProtoUnsigned for u32 {
    const MAX: u64 = u32::MAX as u64;
}

impl ProtoUnsigned for u64 {
    const MAX: u64 = u64::MAX;
}

/// Reads a protobuf JSON integer that fits `T`.
struct ProtoInt<T>(PhantomData<T>);

impl<T: ProtoUnsigned> Visitor<'_> for ProtoInt<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a whole number from 0 to {} (a number, or its digits in a string)",
            T::MAX
        )
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<T, E> {
        T::try_from(n).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(n), &self))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<T, E> {
        let n = u64::try_from(n).map_err(|_| E::invalid_value(de::Unexpected::Signed(n), &self))?;
        self.visit_u64(n)
    }

    /// `null`: protobuf's JSON for the field's default, 0.
    fn visit_unit<E: de::Error>(self) -> Result<T, E> {
        self.visit_u64(0)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<T, E> {
        let digits = text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty();
        match text.parse::<u64>() {
            Ok(n) if digits => self.visit_u64(n),
            _ => Err(E::invalid_value(de::Unexpected::Str(text), &self)),
        }
    }
}

/// Parses a `POST /json` body: an object wherever protobuf's JSON has one (never an array
/// read by position), refused with the path to the value at fault.
pub fn parse(body: &[u8]) -> Result<Request, EnvoyError> {
    let raw: RawRequest = limiter_input::from_slice(body).map_err(|e| {
        let message = format!(
            "{}: send {{\"domain\": \"...\", \"descriptors\": [{{\"entries\": [{{\"key\": \"...\", \"value\": \"...\"}}]}}]}}",
            e.message
        );
        EnvoyError::Invalid(match e.path {
            Some(path) => format!("{path}: {message}"),
            None => message,
        })
    })?;
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
                        Value::Number(n) => n.as_i64().and_then(|n| i32::try_from(n).ok()).ok_or_else(|| {
                            EnvoyError::Invalid(format!(
                                "descriptors[{i}].limit.unit: {n} is not a unit: send SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR (or the enum's number)"
                            ))
                        })?,
                        Value::String(name) => Unit::parse(name).map(Unit::number).ok_or_else(|| {
                            EnvoyError::Invalid(format!(
                                "descriptors[{i}].limit.unit: `{name}` is not a unit: send SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR"
                            ))
                        })?,
                        // protobuf's JSON for the default: UNKNOWN, refused as the number 0 is.
                        Value::Null => 0,
                        other => {
                            return Err(EnvoyError::Invalid(format!(
                                "descriptors[{i}].limit.unit: {other} is not a unit: send SECOND, MINUTE, HOUR, DAY, WEEK, MONTH or YEAR (or the enum's number)"
                            )));
                        }
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
            (br#"{"domain":"web"} {}"#, "one JSON value, then trailing characters"),
        ] {
            let EnvoyError::Invalid(message) = parse(body).expect_err(field) else {
                panic!("invalid")
            };
            assert!(message.contains(field), "{field}: {message}");
        }
    }

    #[test]
    fn integers_are_read_as_protobuf_json_writes_them() {
        // A descriptor's `hitsAddend` is a `UInt64Value`: protobuf's JSON writes it as a
        // string; every integer is read from a number or a string, and `null` is the default.
        let request = parse(
            br#"{"domain":"web","hitsAddend":"3","descriptors":[
                {"entries":[{"key":"a","value":"1"}],"hitsAddend":"18446744073709551615"},
                {"entries":[{"key":"b","value":"2"}],"hitsAddend":null,
                 "limit":{"requestsPerUnit":"9","unit":null}}]}"#,
        )
        .expect("valid");
        assert_eq!(request.hits_addend, 3);
        assert_eq!(request.descriptors[0].hits_addend, Some(u64::MAX));
        assert_eq!(request.descriptors[1].hits_addend, None);
        assert_eq!(
            request.descriptors[1].limit,
            Some(Override {
                requests_per_unit: 9,
                unit: 0
            })
        );
        assert_eq!(
            parse(br#"{"domain":"web","hitsAddend":null}"#)
                .unwrap()
                .hits_addend,
            0
        );
        for (body, field, says) in [
            (
                &br#"{"domain":"web","hitsAddend":"4294967296"}"#[..],
                "hitsAddend",
                "from 0 to 4294967295",
            ),
            (
                br#"{"domain":"web","hitsAddend":"-1"}"#,
                "hitsAddend",
                "from 0 to 4294967295",
            ),
            (
                br#"{"domain":"web","hitsAddend":" 1"}"#,
                "hitsAddend",
                "its digits in a string",
            ),
            (
                br#"{"domain":"web","hitsAddend":1.5}"#,
                "hitsAddend",
                "from 0 to 4294967295",
            ),
            (
                br#"{"domain":"web","descriptors":[{"hitsAddend":"x"}]}"#,
                "descriptors[0].hitsAddend",
                "18446744073709551615",
            ),
            (
                br#"{"domain":"web","descriptors":[{"limit":{"requestsPerUnit":1,"unit":true}}]}"#,
                "descriptors[0].limit.unit",
                "is not a unit",
            ),
            (
                br#"{"domain":"web","descriptors":[{"limit":{"requestsPerUnit":1,"unit":2.5}}]}"#,
                "descriptors[0].limit.unit",
                "is not a unit",
            ),
        ] {
            let EnvoyError::Invalid(message) = parse(body).expect_err(field) else {
                panic!("invalid")
            };
            assert!(message.starts_with(field), "{field}: {message}");
            assert!(message.contains(says), "{field}: {message}");
        }
    }

    #[test]
    fn an_array_is_never_read_as_an_object() {
        // serde reads a struct from an array by position; protobuf's JSON never writes one.
        for (body, field) in [
            (&br#"["web", [], 1]"#[..], None),
            (
                br#"{"domain":"web","descriptors":[[[], null, null, false]]}"#,
                Some("descriptors[0]"),
            ),
            (
                br#"{"domain":"web","descriptors":[{"entries":[["k","v"]]}]}"#,
                Some("descriptors[0].entries[0]"),
            ),
            (
                br#"{"domain":"web","descriptors":[{"entries":[],"limit":[1,"SECOND"]}]}"#,
                Some("descriptors[0].limit"),
            ),
        ] {
            let EnvoyError::Invalid(message) = parse(body).expect_err("an array") else {
                panic!("invalid")
            };
            let says = "invalid type: array, expected a JSON object";
            match field {
                Some(field) => assert!(
                    message.starts_with(&format!("{field}: {says}")),
                    "{message}"
                ),
                None => assert!(message.starts_with(says), "{message}"),
            }
            assert!(!message.contains("struct"), "{message}");
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
