//! The strict reading against serde_json's own: the same values from objects, refusals of
//! arrays where structs belong (at every depth), and messages in JSON's words.

use proptest::prelude::*;
use serde_json::{Value, json};

use super::fuzzing::{Outer, objects_where_structs_belong};
use super::*;

fn strict(body: &str) -> Result<Outer, JsonError> {
    from_slice(body.as_bytes())
}

#[test]
fn reads_what_serde_reads_from_objects() {
    let body = r#"{"name": "n", "count": 3, "inner": {"key": "k", "value": 1},
        "list": [{"key": "a"}, {"key": "b", "value": 2}], "numbers": [1, 2], "any": [1, {"x": null}]}"#;
    let read = strict(body).unwrap();
    assert_eq!(read, serde_json::from_str::<Outer>(body).unwrap());
    assert_eq!(read.list.unwrap()[1].value, 2);
    assert_eq!(read.any, Some(json!([1, {"x": null}])));
}

#[test]
fn refuses_an_array_wherever_a_struct_belongs() {
    for (body, path) in [
        (r#"["n", 3, null, null, null, null]"#, None),
        (r#"{"inner": ["k", 1]}"#, Some("inner")),
        (r#"{"list": [{"key": "a"}, ["b", 2]]}"#, Some("list[1]")),
    ] {
        // serde_json alone reads each, by position.
        assert!(serde_json::from_str::<Outer>(body).is_ok(), "{body}");
        let error = strict(body).unwrap_err();
        assert_eq!(error.kind, JsonErrorKind::Shape, "{body}");
        assert_eq!(error.path.as_deref(), path, "{body}");
        assert!(
            error
                .message
                .starts_with("invalid type: array, expected a JSON object at line 1"),
            "{body}: {}",
            error.message
        );
    }
}

#[test]
fn says_what_is_wrong_in_json_words_with_the_path() {
    let cases = [
        (
            r#"{"count": "5"}"#,
            Some("count"),
            "invalid type: string \"5\", expected a whole number from 0 to 18446744073709551615",
        ),
        (
            r#"{"count": -1}"#,
            Some("count"),
            "invalid value: number `-1`, expected a whole number from 0 to 18446744073709551615",
        ),
        (
            r#"{"count": 1.5}"#,
            Some("count"),
            "invalid type: number `1.5`, expected a whole number from 0 to 18446744073709551615",
        ),
        (
            r#"{"numbers": [1, 4294967296]}"#,
            Some("numbers[1]"),
            "invalid value: number `4294967296`, expected a whole number from 0 to 4294967295",
        ),
        (
            r#"{"inner": {"value": 1}}"#,
            Some("inner"),
            "missing field `key`",
        ),
        (r#"{"extra": 1}"#, Some("extra"), "unknown field `extra`"),
        (
            r#"{"count": 1, "count": 2}"#,
            None,
            "duplicate field `count`",
        ),
        (
            r#"{"list": {"key": "a"}}"#,
            Some("list"),
            "invalid type: JSON object, expected an array",
        ),
        (
            r#"{"inner": null, "list": 3}"#,
            Some("list"),
            "invalid type: number `3`, expected an array",
        ),
        ("null", None, "invalid type: null, expected a JSON object"),
    ];
    for (body, path, message) in cases {
        let error = strict(body).unwrap_err();
        // The place names a missing field inside its object; else it is the path.
        match error.missing_field() {
            Some(name) => assert_eq!(
                error.place(),
                Some(path.map_or(name.to_owned(), |p| format!("{p}.{name}"))),
                "{body}"
            ),
            None => assert_eq!(error.place(), error.path, "{body}"),
        }
        assert_eq!(error.kind, JsonErrorKind::Shape, "{body}");
        assert_eq!(error.path.as_deref(), path, "{body}");
        assert!(
            error.message.starts_with(message),
            "{body}: {}",
            error.message
        );
        assert!(
            !error.message.contains("struct"),
            "{body}: {}",
            error.message
        );
    }
}

#[test]
fn tells_a_body_that_is_not_json_from_one_of_another_shape() {
    for body in ["not json", "", "{\"count\": ", "{'count': 1}"] {
        let error = strict(body).unwrap_err();
        assert_eq!(error.kind, JsonErrorKind::Syntax, "{body:?}");
        assert!(
            error.message.starts_with("not JSON: "),
            "{body:?}: {}",
            error.message
        );
    }
    let error = strict(r#"{"count": 1} {"count": 2}"#).unwrap_err();
    assert_eq!(error.kind, JsonErrorKind::Trailing);
    assert_eq!(
        error.message,
        "one JSON value, then trailing characters at line 1 column 14"
    );
    assert_eq!(error.to_string(), error.message);
    let nested = strict(r#"{"inner": [1]}"#).unwrap_err();
    assert!(nested.to_string().starts_with("inner: invalid type: array"));
}

#[test]
fn never_rewrites_what_the_message_quotes_from_the_input() {
    let error = strict(r#"{"count": "a \"expected u8\" map"}"#).unwrap_err();
    assert_eq!(
        error.message,
        "invalid type: string \"a \\\"expected u8\\\" map\", expected a whole number from 0 to 18446744073709551615 at line 1 column 33"
    );
    let error = strict(r#"{"expected u64": 1}"#).unwrap_err();
    assert!(
        error
            .message
            .starts_with("unknown field `expected u64`, expected one of"),
        "{}",
        error.message
    );
}

#[test]
fn rewrites_whole_words_only() {
    assert_eq!(
        in_plain_words(
            "invalid type: string \"x\", expected u8 at line 1",
            "a JSON object"
        ),
        "invalid type: string \"x\", expected a whole number from 0 to 255 at line 1"
    );
    // `expected u8` is not the start of `expected u64`, nor `map` of `mapping`.
    assert_eq!(
        in_plain_words("expected u64, invalid type: mapping", "a JSON object"),
        "expected a whole number from 0 to 18446744073709551615, invalid type: mapping"
    );
}

/// Any JSON value, a few levels deep, with the field names `Outer` and `Inner` know.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u32>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z]{0,3}".prop_map(Value::from),
    ];
    let names = prop_oneof![
        Just("name"),
        Just("count"),
        Just("inner"),
        Just("list"),
        Just("numbers"),
        Just("any"),
        Just("key"),
        Just("value"),
    ];
    leaf.prop_recursive(4, 24, 4, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(names.clone(), inner, 0..5).prop_map(|m| Value::Object(
                m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect()
            )),
        ]
    })
}

proptest! {
    /// The strict reading accepts exactly what serde_json accepts with objects where structs
    /// belong, and reads the same value from it.
    #[test]
    fn strict_is_serde_with_objects_only(value in any_json()) {
        let body = serde_json::to_vec(&value).unwrap();
        // The fuzz target's own checks, then this one's.
        fuzzing::json(&body);
        let by_serde = serde_json::from_slice::<Outer>(&body);
        let by_strict = from_slice::<Outer>(&body);
        match (&by_serde, &by_strict) {
            (Ok(expected), Ok(read)) => prop_assert_eq!(expected, read),
            (Ok(_), Err(e)) => {
                prop_assert!(!objects_where_structs_belong(&value), "{}: {}", value, e);
                prop_assert_eq!(e.kind, JsonErrorKind::Shape);
            }
            (Err(_), Ok(read)) => prop_assert!(false, "serde refused {} and strict read {:?}", value, read),
            (Err(_), Err(e)) => prop_assert_eq!(e.kind, JsonErrorKind::Shape),
        }
        if objects_where_structs_belong(&value) {
            prop_assert_eq!(by_serde.is_ok(), by_strict.is_ok(), "{}", value);
        }
    }
}
