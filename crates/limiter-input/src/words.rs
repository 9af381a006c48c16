//! serde's words for what it found and expected, rewritten in JSON's: `sequence` is an array,
//! `map` an object, `u64` a whole number from 0 to 18446744073709551615.

/// serde's phrase, and JSON's.
const PHRASES: [(&str, &str); 14] = [
    ("invalid type: sequence", "invalid type: array"),
    ("invalid type: map", "invalid type: object"),
    ("invalid type: unit value", "invalid type: null"),
    ("invalid type: floating point", "invalid type: number"),
    ("invalid value: integer", "invalid value: number"),
    ("invalid type: integer", "invalid type: number"),
    ("expected a sequence", "expected an array"),
    ("expected a map", "expected a JSON object"),
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

/// `text` (a serde error's message) with serde's phrases in JSON's words. A phrase is
/// replaced only where a word ends after it (`expected u8` is not the start of `expected
/// u64`).
pub(crate) fn in_json_words(text: &str) -> String {
    let mut out = text.to_owned();
    for (serde, json) in PHRASES {
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
