//! The body of limiter-envoy's fuzz target (`fuzz/fuzz_targets/envoy_rules.rs`), shared with
//! the plain test that replays its saved inputs (`tests/fuzz_regressions.rs`): the descriptor
//! loader must never panic, must refuse with the file and a line inside it, and what it
//! accepts must hold the bounds the service relies on.

use crate::rules::{Domains, MAX_TEXT, Rule};

/// One envoy descriptor file; the first line of the input, if it parses as entries
/// (`key=value,key=value`), is also matched against what loads.
pub fn rules(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    match Domains::load([("fuzz.yaml", text)]) {
        Ok(domains) => {
            for domain in domains.iter() {
                assert!(!domain.name.is_empty() && domain.name.len() <= MAX_TEXT);
                for (i, limit) in domain.limits().enumerate() {
                    assert_eq!(limit.id, i, "ids follow the walk");
                    if let Some(l) = limit.limit() {
                        assert!(limit.kind.check(l).is_ok(), "{limit:?}");
                    } else {
                        assert_eq!(limit.requests_per_unit, 0);
                    }
                }
                let entries: Vec<(String, String)> = text
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|pair| pair.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                if let Some(Rule::Limited(limit)) = domain.rule(&entries) {
                    assert!(domain.limits().any(|l| l == limit));
                }
                assert_eq!(domain.rule(&[]), None);
            }
        }
        Err(e) => {
            assert!(!e.message.is_empty());
            assert!(e.to_string().starts_with("fuzz.yaml"), "{e}");
            if let Some(mark) = e.mark {
                let lines = crate::yaml::line_count(text);
                assert!(mark.line >= 1 && mark.line <= lines, "{e}");
            }
        }
    }
}
