//! The bodies of limiterd's fuzz targets, shared with the plain test that replays saved
//! inputs: the request parser and the configuration parser must never panic, must refuse with
//! a 400 and a message (or a line inside the file), and what they accept must hold the bounds
//! the engine relies on.

use crate::api::{self, MAX_BATCH, MAX_DURATION_MS, MAX_IDENTIFIER, MAX_NAMESPACE};
use crate::config::Config;
use crate::engine::{Item, Target, check_limit};

fn lookup(name: &str) -> Option<usize> {
    (name == "api").then_some(0)
}

fn accepted(item: &Item) {
    assert!(!item.identifier.is_empty() && item.identifier.len() <= MAX_IDENTIFIER);
    if let Target::AdHoc {
        limit,
        duration_ms,
        namespace,
    } = &item.target
    {
        assert!(*limit >= 1 && item.cost <= *limit, "{item:?}");
        assert!((1..=MAX_DURATION_MS).contains(duration_ms), "{item:?}");
        assert!(!namespace.is_empty() && namespace.len() <= MAX_NAMESPACE);
    }
}

/// One request body through both endpoints' parsers.
pub fn request(bytes: &[u8]) {
    match api::parse_request(bytes, &lookup) {
        Ok(item) => accepted(&item),
        Err(e) => {
            assert_eq!(e.status().as_u16(), 400, "{e:?}");
            assert!(!e.message.is_empty());
        }
    }
    match api::parse_many(bytes, &lookup) {
        Ok(items) => {
            assert!((1..=MAX_BATCH).contains(&items.len()));
            items.iter().for_each(accepted);
        }
        Err(e) => {
            assert_eq!(e.status().as_u16(), 400, "{e:?}");
            assert!(!e.message.is_empty());
        }
    }
}

/// One configuration file.
pub fn config(bytes: &[u8]) {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    match Config::parse(text) {
        Ok(config) => {
            assert!(!config.policies.is_empty());
            for policy in config.policies.values() {
                assert!(!policy.limits.is_empty());
                for l in &policy.limits {
                    assert!(check_limit(l.kind, l.limit).is_ok(), "{l:?}");
                }
            }
        }
        Err(e) => {
            assert!(!e.message.is_empty());
            if let Some(line) = e.line {
                assert!(
                    line >= 1 && line <= text.split('\n').count(),
                    "line {line}: {e}"
                );
            }
        }
    }
}
