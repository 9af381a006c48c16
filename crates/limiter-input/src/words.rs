//! serde's words for what it found and expected, rewritten in a format's: `sequence` is an
//! array, `map` an object (or a table), `u64` a whole number from 0 to 18446744073709551615.

/// serde's phrase, and the format's (the object's own word is the caller's).
const PHRASES: [(&str, &str); 12] = [
    ("invalid type: sequence", "invalid type: array"),
    ("invalid type: unit value", "invalid type: null"),
    ("invalid type: floating point", "invalid type: number"),
    ("invalid value: integer", "invalid value: number"),
    ("invalid type: integer", "invalid type: number"),
    ("expected a sequence", "expected an array"),
    (
        "expected u64",
        "expected a whole number from 0 to 18446744073709551615",
    ),
    (
        "expected u32",
        "expected a whole number from 0 to 4294967295",
    ),
    ("expected u16", "expected a whole number from 0 to 65535"),
    ("expected u8", "expected a whole number from 0 to 255"),
    (
        "expected i64",
        "expected a whole number from -9223372036854775808 to 9223372036854775807",
    ),
    (
        "expected i32",
        "expected a whole number from -2147483648 to 2147483647",
    ),
];

/// `text` (a serde error's message) with serde's phrases in the format's words, `object`
/// being its word for an object (`"a JSON object"`, `"a table"`). A phrase is replaced only
/// where a word ends after it (`expected u8` is not the start of `expected u64`).
///
/// ```
/// let text = "invalid type: map, expected u16 at line 2 column 9";
/// assert_eq!(
///     limiter_input::in_plain_words(text, "a table"),
///     "invalid type: table, expected a whole number from 0 to 65535 at line 2 column 9"
/// );
/// ```
pub fn in_plain_words(text: &str, object: &str) -> String {
    let noun = object
        .strip_prefix("a ")
        .or_else(|| object.strip_prefix("an "))
        .unwrap_or(object);
    let found_object = format!("invalid type: {noun}");
    let expected_object = format!("expected {object}");
    let object_phrases = [
        ("invalid type: map", found_object.as_str()),
        ("expected a map", expected_object.as_str()),
    ];
    let mut out = text.to_owned();
    for (serde, json) in PHRASES.into_iter().chain(object_phrases) {
        let mut from = 0;
        while let Some(found) = out[from..].find(serde).map(|at| at + from) {
            let end = found + serde.len();
            let whole = out[end..]
                .chars()
                .next()
                .is_none_or(|c| !c.is_ascii_alphanumeric());
            if whole {
                out.replace_range(found..end, json);
                from = found + json.len();
            } else {
                from = end;
            }
        }
    }
    out
}
