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
/// where a word ends after it (`expected u8` is not the start of `expected u64`), and never
/// inside what the message quotes from the input (a field's name in backticks, a string in
/// double quotes).
///
/// ```
/// let text = "invalid type: map, expected u16 at line 2 column 9";
/// assert_eq!(
///     limiter_input::in_plain_words(text, "a table"),
///     "invalid type: table, expected a whole number from 0 to 65535 at line 2 column 9"
/// );
/// let quoted = "unknown field `expected u64`, expected `count`";
/// assert_eq!(limiter_input::in_plain_words(quoted, "a table"), quoted);
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
    let mut out = String::with_capacity(text.len() + 32);
    for (quoted, part) in parts(text) {
        if quoted {
            out.push_str(part);
            continue;
        }
        let mut plain = part.to_owned();
        for (serde, words) in PHRASES.into_iter().chain(object_phrases) {
            replace_whole(&mut plain, serde, words);
        }
        out.push_str(&plain);
    }
    out
}

/// Replaces each `phrase` in `text` that a word does not go on after.
fn replace_whole(text: &mut String, phrase: &str, with: &str) {
    let mut from = 0;
    while let Some(found) = text[from..].find(phrase).map(|at| at + from) {
        let end = found + phrase.len();
        let whole = text[end..]
            .chars()
            .next()
            .is_none_or(|c| !c.is_ascii_alphanumeric());
        if whole {
            text.replace_range(found..end, with);
            from = found + with.len();
        } else {
            from = end;
        }
    }
}

/// `text` cut into what it says and what it quotes (from a backtick or a double quote to the
/// next one; a double quote after a backslash is quoted text's own), each with whether it is
/// quoted, in order.
fn parts(text: &str) -> Vec<(bool, &str)> {
    let mut parts = Vec::new();
    let mut start = 0;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (at, c) in text.char_indices() {
        match quote {
            None if c == '`' || c == '"' => {
                parts.push((false, &text[start..at]));
                start = at;
                quote = Some(c);
            }
            Some(q) if c == q && !escaped => {
                parts.push((true, &text[start..at + 1]));
                start = at + 1;
                quote = None;
            }
            _ => {}
        }
        escaped = quote == Some('"') && c == '\\' && !escaped;
    }
    parts.push((quote.is_some(), &text[start..]));
    parts
}
