//! [`Wildcard`]: a pattern an operator writes with `*` standing for any run of characters
//! (envoy's descriptor values, unkey's override identifiers), split once when it is read so
//! that matching a request's text allocates nothing.

/// A pattern where each `*` matches any run of characters, even none; without a `*`, it
/// matches its own text only.
///
/// ```
/// use limiter_input::Wildcard;
///
/// let vip = Wildcard::new("team_*_vip");
/// assert!(vip.matches("team_red_vip"));
/// assert!(vip.matches("team__vip"));
/// assert!(!vip.matches("team_vip"));
/// assert!(Wildcard::new("*").matches(""));
/// assert!(!Wildcard::new("exact").matches("exactly"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wildcard {
    /// The pattern split at its `*`s: one part for a pattern without any.
    parts: Box<[Box<str>]>,
}

impl Wildcard {
    /// `pattern`, split at its `*`s.
    pub fn new(pattern: &str) -> Self {
        Self {
            parts: pattern.split('*').map(Box::from).collect(),
        }
    }

    /// Whether the pattern has a `*` (else it matches its own text only).
    pub fn has_star(&self) -> bool {
        self.parts.len() > 1
    }

    /// Whether `text` matches: the first part starts it, the last ends it, and the middle
    /// ones appear in order between them, none overlapping another.
    pub fn matches(&self, text: &str) -> bool {
        let (first, middle, last) = match &*self.parts {
            [only] => return text == &**only,
            [first, middle @ .., last] => (first, middle, last),
            [] => return text.is_empty(),
        };
        // Both ends no longer than the text (they may not overlap) and matched, so the range
        // between them is on character boundaries and in order.
        if text.len() < first.len().saturating_add(last.len())
            || !text.starts_with(&**first)
            || !text.ends_with(&**last)
        {
            return false;
        }
        // Each middle part at its leftmost place: taking each as early as possible leaves the
        // most room for the rest.
        let mut rest = &text[first.len()..text.len() - last.len()];
        for part in middle {
            match rest.find(&**part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Whether `text` matches `pattern`, by the definition: `*` matches any run (dynamic
    /// programming over both, character by character).
    fn by_definition(pattern: &str, text: &str) -> bool {
        let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
        // `can[j]`: the pattern so far matches the first `j` characters of the text.
        let mut can = vec![false; t.len() + 1];
        can[0] = true;
        for &c in &p {
            let mut next = vec![false; t.len() + 1];
            for j in 0..=t.len() {
                next[j] = if c == '*' {
                    can[j] || (j > 0 && next[j - 1])
                } else {
                    j > 0 && can[j - 1] && t[j - 1] == c
                };
            }
            can = next;
        }
        can[t.len()]
    }

    #[test]
    fn stars_match_any_run_anywhere() {
        for (pattern, text, want) in [
            ("foo*", "foo", true),
            ("foo*", "fo", false),
            ("bar*b", "bar-x-b", true),
            ("bar*b", "bab", false),
            ("foo*bar*baz", "foo1bar2baz", true),
            ("foo*bar*baz", "foobazbar", false),
            ("*", "", true),
            ("**", "x", true),
            ("*x*", "ab", false),
            ("a*a", "a", false),
            ("ab*ba", "aba", false),
            ("*@acme.com", "ada@acme.com", true),
            ("", "", true),
            ("", "x", false),
            ("é*ü", "éxü", true),
        ] {
            let wildcard = Wildcard::new(pattern);
            assert_eq!(wildcard.matches(text), want, "{pattern} ~ {text}");
            assert_eq!(wildcard.has_star(), pattern.contains('*'), "{pattern}");
        }
    }

    proptest! {
        /// Over a small alphabet (so parts repeat, overlap and sit next to each other), and
        /// over any characters, the split pattern matches what the definition matches.
        #[test]
        fn matches_what_the_definition_matches(
            pattern in "[ab*]{0,7}",
            text in "[ab]{0,9}",
            any_pattern in "\\PC{0,6}",
            any_text in "\\PC{0,8}",
        ) {
            prop_assert_eq!(
                Wildcard::new(&pattern).matches(&text),
                by_definition(&pattern, &text),
                "{} ~ {}", pattern, text
            );
            prop_assert_eq!(
                Wildcard::new(&any_pattern).matches(&any_text),
                by_definition(&any_pattern, &any_text)
            );
        }
    }
}
