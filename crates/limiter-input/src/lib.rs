//! What callers and operators write, read strictly: request bodies as JSON, for every API
//! limiterd serves (its own, unkey's and envoy's `POST /json`), and structured files in any
//! self-describing format (limiterd's TOML configuration); and the wildcard patterns operators
//! write ([`Wildcard`]: envoy's descriptor values, unkey's override identifiers), matched
//! without an allocation.
//!
//! serde's derived structs also read an array, by position: `["api", null, "user-1"]`
//! would pass for `{"policy": "api", "identifier": "user-1"}`, a shape no API or file format
//! documents and no one means. [`from_slice`] (JSON) and [`deserialize`] (any format) read an
//! object wherever a struct is read, at every depth; [`from_slice`] says what is wrong in
//! JSON's words (an object, an array, a whole number from 0 to 18446744073709551615), never a
//! Rust type's name, with the path to the value at fault.
//!
//! ```
//! #[derive(Debug, serde::Deserialize)]
//! struct Ask {
//!     policy: String,
//!     cost: Option<u64>,
//! }
//!
//! let ask: Ask = limiter_input::from_slice(br#"{"policy": "api", "cost": 2}"#)?;
//! assert_eq!((ask.policy.as_str(), ask.cost), ("api", Some(2)));
//!
//! let positional = limiter_input::from_slice::<Ask>(br#"["api", 2]"#).unwrap_err();
//! assert_eq!(positional.message, "invalid type: array, expected a JSON object at line 1 column 1");
//!
//! let negative = limiter_input::from_slice::<Ask>(br#"{"policy": "api", "cost": -1}"#).unwrap_err();
//! assert_eq!(negative.path.as_deref(), Some("cost"));
//! assert!(negative.message.contains("expected a whole number from 0 to 18446744073709551615"));
//! # Ok::<(), limiter_input::JsonError>(())
//! ```

pub mod fuzzing;
mod strict;
mod wildcard;
mod words;

pub use wildcard::Wildcard;
pub use words::in_plain_words;

/// JSON's word for an object, in refusals.
const JSON_OBJECT: &str = "a JSON object";

use std::fmt;

use serde::Deserialize;
use serde_json::error::Category;

/// Why a body could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError {
    /// Where the value at fault is (`requests[0].cost`); `None` for the body as a whole.
    pub path: Option<String>,
    /// What is wrong, in JSON's words, with the line and column.
    pub message: String,
    /// What kind of mistake it is.
    pub kind: JsonErrorKind,
}

/// What kind of mistake a [`JsonError`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JsonErrorKind {
    /// Not JSON: malformed, or cut short.
    Syntax,
    /// JSON, but not of the shape asked for: a value of another type, a field missing,
    /// unknown or given twice.
    Shape,
    /// One JSON value, then more than whitespace.
    Trailing,
}

impl JsonError {
    /// For a field that is missing, its name.
    pub fn missing_field(&self) -> Option<&str> {
        self.message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
    }

    /// Where the value at fault is, a missing field named inside the object it is missing
    /// from (`requests[0].identifier`); `None` for the body as a whole.
    pub fn place(&self) -> Option<String> {
        match (&self.path, self.missing_field()) {
            (Some(path), Some(name)) => Some(format!("{path}.{name}")),
            (None, Some(name)) => Some(name.to_owned()),
            (path, None) => path.clone(),
        }
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(path) => write!(f, "{path}: {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for JsonError {}

/// Reads `body` as one JSON value of type `T`, an object wherever `T` (or anything in it) is a
/// struct; see the crate docs.
pub fn from_slice<'de, T: Deserialize<'de>>(body: &'de [u8]) -> Result<T, JsonError> {
    let mut json = serde_json::Deserializer::from_slice(body);
    let strict = strict::Strict {
        inner: &mut json,
        object: JSON_OBJECT,
    };
    let value = serde_path_to_error::deserialize(strict).map_err(|e| {
        let path = e.path().to_string();
        let path = (path != "." && path != "?").then_some(path);
        let inner = e.into_inner();
        let kind = match inner.classify() {
            Category::Syntax | Category::Eof | Category::Io => JsonErrorKind::Syntax,
            Category::Data => JsonErrorKind::Shape,
        };
        JsonError {
            path,
            message: message(kind, &inner),
            kind,
        }
    })?;
    json.end().map_err(|e| JsonError {
        path: None,
        message: format!("one JSON value, then {e}"),
        kind: JsonErrorKind::Trailing,
    })?;
    Ok(value)
}

/// Reads a `T` from `deserializer` (any self-describing format) with an object wherever `T`
/// (or anything in it) is a struct: an array there is refused as `invalid type: sequence,
/// expected {object}`, `object` being the format's word for one (`"a table"` for TOML).
///
/// ```
/// #[derive(Debug, serde::Deserialize)]
/// struct Limit {
///     count: u64,
/// }
///
/// let json = &mut serde_json::Deserializer::from_str(r#"[{"count": 5}, [6]]"#);
/// let error = limiter_input::deserialize::<_, Vec<Limit>>(json, "an object").unwrap_err();
/// assert_eq!(error.to_string(), "invalid type: sequence, expected an object at line 1 column 16");
/// ```
pub fn deserialize<'de, D: serde::Deserializer<'de>, T: Deserialize<'de>>(
    deserializer: D,
    object: &'static str,
) -> Result<T, D::Error> {
    T::deserialize(strict::Strict {
        inner: deserializer,
        object,
    })
}

/// What `error` says, in JSON's words.
fn message(kind: JsonErrorKind, error: &serde_json::Error) -> String {
    let text = error.to_string();
    match kind {
        JsonErrorKind::Syntax => format!("not JSON: {text}"),
        JsonErrorKind::Shape | JsonErrorKind::Trailing => in_plain_words(&text, JSON_OBJECT),
    }
}

#[cfg(test)]
mod tests;
