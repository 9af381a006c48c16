//! The usual `POST /v1/ratelimit` body read without serde: one flat JSON object of the known
//! fields, each once, with strings that need no unescaping, whole numbers and booleans, and
//! nothing after it but whitespace. [`read`] answers `None` for anything else (an escape, a
//! `null`, a float, a nested value, an unknown or repeated field, malformed JSON) and the
//! caller parses the body with serde, which names what is wrong; so this path only ever answers
//! what serde would, faster (the proptest below holds it to that).

use std::borrow::Cow;

use super::request::RawRequest;

/// The fields of `body`, or `None` to have serde read it.
pub(super) fn read(body: &[u8]) -> Option<RawRequest<'_>> {
    // Checked as UTF-8 once, whole (a JSON text is UTF-8 throughout, so serde refuses what
    // this refuses): each string is then a slice of it, not checked again.
    let text = std::str::from_utf8(body).ok()?;
    let mut at = Reader { text, pos: 0 };
    at.space();
    at.expect(b'{')?;
    at.space();
    let mut raw = RawRequest::default();
    let mut seen = 0_u16;
    let mut identifier = false;
    if at.peek() == Some(b'}') {
        return None; // no identifier: serde says so
    }
    loop {
        let key = at.string()?;
        at.space();
        at.expect(b':')?;
        at.space();
        let bit = match key {
            "policy" => 0,
            "namespace" => 1,
            "identifier" => 2,
            "limit" => 3,
            "duration_ms" => 4,
            "cost" => 5,
            "record" => 6,
            "time" => 7,
            "algorithm" => 8,
            _ => return None,
        };
        if seen & (1 << bit) != 0 {
            return None;
        }
        seen |= 1 << bit;
        match bit {
            0 => raw.policy = Some(Cow::Borrowed(at.string()?)),
            1 => raw.namespace = Some(Cow::Borrowed(at.string()?)),
            2 => {
                raw.identifier = Cow::Borrowed(at.string()?);
                identifier = true;
            }
            3 => raw.limit = Some(at.number()?),
            4 => raw.duration_ms = Some(at.number()?),
            5 => raw.cost = Some(at.number()?),
            6 => raw.record = Some(at.boolean()?),
            7 => raw.time = Some(at.number()?),
            _ => raw.algorithm = Some(Cow::Borrowed(at.string()?)),
        }
        at.space();
        match at.next()? {
            b',' => at.space(),
            b'}' => break,
            _ => return None,
        }
    }
    at.space();
    (at.pos == body.len() && identifier).then_some(raw)
}

/// A position in the body.
struct Reader<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Reader<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn peek(&self) -> Option<u8> {
        self.bytes().get(self.pos).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.pos += 1;
        Some(byte)
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.next()? == byte).then_some(())
    }

    /// JSON's whitespace.
    fn space(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    /// A string with no escape and no control character (its quotes are ASCII, so both
    /// ends fall on characters' boundaries).
    fn string(&mut self) -> Option<&'a str> {
        self.expect(b'"')?;
        let start = self.pos;
        let len = self.bytes()[start..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20)?;
        let end = start + len;
        if self.bytes()[end] != b'"' {
            return None;
        }
        self.pos = end + 1;
        self.text.get(start..end)
    }

    /// A whole number that fits a `u64`, written as JSON writes one (no sign, no leading
    /// zero, no fraction or exponent).
    fn number(&mut self) -> Option<u64> {
        let start = self.pos;
        let mut value = 0_u64;
        while let Some(digit @ b'0'..=b'9') = self.peek() {
            value = value
                .checked_mul(10)?
                .checked_add(u64::from(digit - b'0'))?;
            self.pos += 1;
        }
        let digits = self.pos - start;
        let leading_zero = digits > 1 && self.bytes()[start] == b'0';
        let fraction = matches!(self.peek(), Some(b'.' | b'e' | b'E'));
        (digits > 0 && !leading_zero && !fraction).then_some(value)
    }

    fn boolean(&mut self) -> Option<bool> {
        let rest = &self.bytes()[self.pos..];
        let (value, len) = if rest.starts_with(b"true") {
            (true, 4)
        } else if rest.starts_with(b"false") {
            (false, 5)
        } else {
            return None;
        };
        self.pos += len;
        Some(value)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// serde's reading of `body`, as the slow path does it.
    fn by_serde(body: &[u8]) -> Option<RawRequest<'_>> {
        serde_json::from_slice(body).ok()
    }

    #[test]
    fn reads_the_usual_bodies() {
        let raw = read(br#" {"policy": "api", "identifier":"user-1","cost":3}"#).unwrap();
        assert_eq!(raw.policy.as_deref(), Some("api"));
        assert_eq!(raw.identifier, "user-1");
        assert_eq!(raw.cost, Some(3));
        let raw = read(
            br#"{"namespace":"n","identifier":"u","limit":10,"duration_ms":60000,"record":true,"time":1795000000000,"algorithm":"sliding_window"}"#,
        )
        .unwrap();
        assert_eq!(
            (raw.limit, raw.duration_ms, raw.record, raw.time),
            (Some(10), Some(60_000), Some(true), Some(1_795_000_000_000))
        );
        assert_eq!(raw.algorithm.as_deref(), Some("sliding_window"));
    }

    #[test]
    fn leaves_everything_unusual_to_serde() {
        for body in [
            "",
            "{}",
            "[]",
            r#"{"identifier":"u\n"}"#,
            r#"{"identifier":"caf\u00e9"}"#,
            r#"{"identifier":"u","cost":null}"#,
            r#"{"identifier":"u","cost":1.5}"#,
            r#"{"identifier":"u","cost":1e3}"#,
            r#"{"identifier":"u","cost":-1}"#,
            r#"{"identifier":"u","cost":01}"#,
            r#"{"identifier":"u","cost":99999999999999999999}"#,
            r#"{"identifier":"u","colour":1}"#,
            r#"{"identifier":"u","identifier":"v"}"#,
            r#"{"identifier":"u",}"#,
            r#"{"identifier":"u"} {}"#,
            r#"{"identifier":"u","record":"yes"}"#,
            r#"{"identifier":"u","policy":{"a":1}}"#,
            r#"{"policy":"api"}"#,
        ] {
            assert!(read(body.as_bytes()).is_none(), "{body}");
        }
    }

    #[test]
    fn reads_text_beyond_ascii_and_leaves_bytes_that_are_not_utf8_to_serde() {
        let raw = read("{\"policy\":\"api\",\"identifier\":\"café-日本\"}".as_bytes()).unwrap();
        assert_eq!(raw.identifier, "café-日本");
        assert_eq!(raw.policy.as_deref(), Some("api"));
        for body in [
            &b"{\"identifier\":\"u\xff\"}"[..],
            b"{\"identifier\":\"caf\xc3\"}",
            b"{\"identifier\":\"u\"}\xff",
            b"\xef\xbb\xbf{\"identifier\":\"u\"}",
        ] {
            assert!(read(body).is_none(), "{body:?}");
            assert!(by_serde(body).is_none(), "{body:?}");
        }
    }

    /// A JSON value as a request field might hold one, valid or not.
    fn value() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z0-9_]{0,6}".prop_map(|s| format!("\"{s}\"")),
            "[a-z\\\\\"é\n]{0,4}".prop_map(|s| format!("\"{s}\"")),
            any::<u64>().prop_map(|n| n.to_string()),
            Just("0".to_owned()),
            Just("007".to_owned()),
            Just("1.5".to_owned()),
            Just("-3".to_owned()),
            Just("1e2".to_owned()),
            Just("true".to_owned()),
            Just("false".to_owned()),
            Just("null".to_owned()),
            Just("{}".to_owned()),
            Just("99999999999999999999".to_owned()),
        ]
    }

    fn key() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "policy",
            "namespace",
            "identifier",
            "limit",
            "duration_ms",
            "cost",
            "record",
            "time",
            "algorithm",
            "colour",
        ])
    }

    proptest! {
        /// Whatever the fast path reads, serde reads the same; and every body of the usual
        /// shape is read by the fast path.
        #[test]
        fn answers_only_what_serde_would(
            fields in prop::collection::vec((key(), value()), 0..6),
            space in prop::sample::select(vec!["", " ", "\n\t "]),
            tail in prop::sample::select(vec!["", " ", "\n", "x", "}"]),
        ) {
            let inner: Vec<String> = fields
                .iter()
                .map(|(k, v)| format!("\"{k}\"{space}:{space}{v}"))
                .collect();
            let body = format!("{space}{{{space}{}{space}}}{tail}", inner.join(","));
            let fast = read(body.as_bytes());
            let slow = by_serde(body.as_bytes());
            if let Some(fast) = &fast {
                prop_assert_eq!(Some(fast), slow.as_ref(), "{}", body);
            }
        }

        #[test]
        fn reads_every_usual_body(
            identifier in "[a-zA-Z0-9_.:-]{1,40}",
            cost in any::<u64>(),
            policy in "[a-z]{1,10}",
        ) {
            let body = format!(r#"{{"policy":"{policy}","identifier":"{identifier}","cost":{cost}}}"#);
            let fast = read(body.as_bytes());
            prop_assert!(fast.is_some(), "{}", body);
            prop_assert_eq!(fast, by_serde(body.as_bytes()));
        }
    }
}
