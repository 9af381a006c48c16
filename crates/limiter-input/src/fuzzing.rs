//! The body of the `input_json` fuzz target, shared with the plain test that replays its saved
//! inputs (`tests/fuzz_regressions.rs`) and with the proptest (`tests.rs`): bytes read by
//! [`from_slice`] and by serde_json alone, as an [`Outer`] (the shapes limiterd's bodies have:
//! an object in an object, a list of objects, a list of numbers, any value). The strict
//! reading never panics, reads what serde_json reads wherever objects are where structs
//! belong, with the same value, and calls malformed only what is.

use serde::Deserialize;
use serde_json::Value;

use crate::{JsonErrorKind, from_slice};

/// An object inside [`Outer`].
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Inner {
    /// Required.
    pub key: String,
    /// 0 when left out.
    #[serde(default)]
    pub value: u64,
}

/// A body of every shape the fuzz target checks.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Outer {
    /// A string.
    pub name: Option<String>,
    /// A whole number.
    pub count: Option<u64>,
    /// An object.
    pub inner: Option<Inner>,
    /// A list of objects.
    pub list: Option<Vec<Inner>>,
    /// A list of numbers.
    pub numbers: Option<Vec<u32>>,
    /// Any value at all (arrays included).
    pub any: Option<Value>,
}

/// Whether `value`, read as an [`Outer`], has an object wherever a struct is read.
pub fn objects_where_structs_belong(value: &Value) -> bool {
    let Value::Object(outer) = value else {
        return false;
    };
    let inner_ok = |v: &Value| v.is_null() || v.is_object();
    let list_ok = |v: &Value| match v {
        Value::Array(items) => items.iter().all(Value::is_object),
        _ => true,
    };
    outer.get("inner").is_none_or(inner_ok) && outer.get("list").is_none_or(list_ok)
}

/// One input (see the module docs).
pub fn json(bytes: &[u8]) {
    let strict = from_slice::<Outer>(bytes);
    let loose = serde_json::from_slice::<Outer>(bytes);
    let value = serde_json::from_slice::<Value>(bytes);
    match (&strict, &loose) {
        (Ok(read), Ok(expected)) => assert_eq!(read, expected),
        (Ok(read), Err(e)) => {
            panic!("serde_json refused ({e}) what the strict reading read: {read:?}")
        }
        (Err(e), Ok(_)) => {
            assert_eq!(e.kind, JsonErrorKind::Shape, "{e}");
            let value = value.as_ref().expect("serde_json read it");
            assert!(!objects_where_structs_belong(value), "{value}: {e}");
        }
        (Err(e), Err(_)) => {
            // What it calls not JSON (or JSON and more) is not one JSON value for serde_json
            // either. (Not the converse: `7-` is refused for its shape before its end is read.)
            let malformed = matches!(e.kind, JsonErrorKind::Syntax | JsonErrorKind::Trailing);
            assert!(!malformed || value.is_err(), "{e}");
        }
    }
    if let Err(e) = &strict {
        assert!(!e.message.is_empty());
        if e.kind == JsonErrorKind::Shape {
            assert!(!e.message.contains("expected struct"), "{e}");
        }
    }
}
