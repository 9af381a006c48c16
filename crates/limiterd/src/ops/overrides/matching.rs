//! What a decision reads of the overrides ([`Matching`]): per namespace, the overrides by
//! identifier and the patterns in the order they win (the most literal characters first, then
//! the smaller text), built again at each change. A decision finds an exact override in one
//! lookup and a pattern by trying them in that order, stopping at the first that matches,
//! where it used to scan every override of the namespace (patterns or not) under a lock every
//! request shared; the copy is read per shard of threads (`shards.rs`).

use std::collections::HashMap;

use limiter_input::Wildcard;

use super::{Override, Table};
use crate::engine::FastHash;

/// Every namespace's overrides, as decisions find them.
#[derive(Debug, Default)]
pub(super) struct Matching {
    namespaces: HashMap<String, Namespace, FastHash>,
}

/// One namespace's overrides: each by its identifier (a pattern's text included: asked for
/// exactly, a pattern is its own exact override), and the patterns in the order they win,
/// each split at its `*`s once (so a match allocates nothing).
#[derive(Debug)]
struct Namespace {
    by_identifier: HashMap<String, Override, FastHash>,
    patterns: Vec<(Wildcard, Override)>,
}

impl Matching {
    /// `table`'s overrides, as decisions find them.
    pub(super) fn new(table: &Table) -> Self {
        let namespaces = table
            .iter()
            .map(|(name, overrides)| {
                let mut patterns: Vec<(Wildcard, Override)> = overrides
                    .values()
                    .filter(|o| o.identifier.contains('*'))
                    .map(|o| (Wildcard::new(&o.identifier), o.clone()))
                    .collect();
                let literal = |o: &Override| o.identifier.chars().filter(|c| *c != '*').count();
                patterns.sort_by(|(_, a), (_, b)| {
                    literal(b)
                        .cmp(&literal(a))
                        .then_with(|| a.identifier.cmp(&b.identifier))
                });
                let by_identifier = overrides
                    .iter()
                    .map(|(id, o)| (id.clone(), o.clone()))
                    .collect();
                let namespace = Namespace {
                    by_identifier,
                    patterns,
                };
                (name.clone(), namespace)
            })
            .collect();
        Self { namespaces }
    }

    /// The override that applies to `identifier` in `namespace`: the exact one, else the
    /// first pattern in the order they win that matches it.
    #[inline]
    pub(super) fn find(&self, namespace: &str, identifier: &str) -> Option<&Override> {
        if self.namespaces.is_empty() {
            return None;
        }
        let n = self.namespaces.get(namespace)?;
        n.by_identifier.get(identifier).or_else(|| {
            n.patterns
                .iter()
                .find(|(pattern, _)| pattern.matches(identifier))
                .map(|(_, o)| o)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// The rule as the module docs state it, by a scan of every override: the exact one, else
    /// of the patterns that match, the one with the most literal characters, then the smaller
    /// text.
    fn by_scan<'a>(table: &'a Table, namespace: &str, identifier: &str) -> Option<&'a Override> {
        let n = table.get(namespace)?;
        if let Some(exact) = n.get(identifier) {
            return Some(exact);
        }
        let literal = |o: &Override| o.identifier.chars().filter(|c| *c != '*').count();
        n.values()
            .filter(|o| {
                let pattern = Wildcard::new(&o.identifier);
                pattern.has_star() && pattern.matches(identifier)
            })
            .min_by(|a, b| {
                literal(b)
                    .cmp(&literal(a))
                    .then_with(|| a.identifier.cmp(&b.identifier))
            })
    }

    fn table(namespaces: Vec<(bool, Vec<String>)>) -> Table {
        let mut table = Table::new();
        for (second, identifiers) in namespaces {
            let name = if second { "web" } else { "api" };
            let n: &mut BTreeMap<String, Override> = table.entry(name.to_owned()).or_default();
            for (limit, identifier) in (1..).zip(identifiers) {
                let o = Override {
                    id: format!("{name}/{identifier}"),
                    identifier: identifier.clone(),
                    limit,
                    duration_ms: 1_000,
                };
                n.insert(identifier, o);
            }
        }
        table
    }

    proptest! {
        /// On random overrides (patterns and exact identifiers over a small alphabet, so
        /// patterns overlap and tie) and random identifiers, the index finds what the scan
        /// finds.
        #[test]
        fn finds_what_a_scan_of_every_override_finds(
            namespaces in prop::collection::vec(
                (any::<bool>(), prop::collection::vec("[ab*]{0,4}", 0..12)),
                0..3,
            ),
            asked in prop::collection::vec((any::<bool>(), "[ab]{0,5}"), 1..16),
        ) {
            let table = table(namespaces);
            let matching = Matching::new(&table);
            for (second, identifier) in asked {
                let namespace = if second { "web" } else { "api" };
                prop_assert_eq!(
                    matching.find(namespace, &identifier),
                    by_scan(&table, namespace, &identifier),
                    "{} in {}", identifier, namespace
                );
            }
        }
    }
}
