//! Per-identifier overrides of unkey's v2 API, set at run time: in each namespace, an
//! identifier (or a pattern with `*`, matching any run of characters) gets its own limit and
//! duration. They are data, not configuration: a reload keeps them, and in memory they are
//! kept in a JSON file written atomically (a temporary file beside it, synced, then renamed
//! over it) on every change and read at start, so they survive a restart.
//!
//! Which override applies to an identifier: an exact one first; otherwise the matching pattern
//! with the most literal characters (the most specific), ties broken by the pattern's text
//! (the smaller first), so the choice never depends on the order overrides were set. Each
//! matching identifier keeps its own counter: a pattern sets a limit, not a shared budget.
//!
//! An override's id is derived from its namespace and identifier, so setting one again keeps
//! its id, and the id is the same on every instance and after a restart.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

/// The most overrides one namespace holds unless the configuration says otherwise.
pub const DEFAULT_MAX_PER_NAMESPACE: usize = 10_000;

/// One override.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    /// Its id (`ovr_…`), stable for its namespace and identifier.
    pub id: String,
    /// The identifier or pattern it applies to.
    pub identifier: String,
    /// Units per duration.
    pub limit: u64,
    /// The window, in ms.
    pub duration_ms: u64,
}

/// Why an override was not set or found.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OverrideError {
    /// No override for that identifier.
    #[error("namespace `{namespace}` has no override for `{identifier}`")]
    NotFound {
        /// The namespace.
        namespace: String,
        /// The identifier asked for.
        identifier: String,
    },
    /// The namespace holds as many overrides as it may.
    #[error(
        "namespace `{namespace}` already holds its {max} overrides: delete one, or raise `[unkey] max_overrides_per_namespace`"
    )]
    Full {
        /// The namespace.
        namespace: String,
        /// Its bound.
        max: usize,
    },
    /// The file could not be written: the change was not made.
    #[error("the overrides could not be saved to {path}: {reason}; nothing changed")]
    Save {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
}

type Table = BTreeMap<String, BTreeMap<String, Override>>;

/// Every namespace's overrides, and where they are kept.
#[derive(Debug)]
pub struct Overrides {
    path: Option<PathBuf>,
    max_per_namespace: usize,
    table: Mutex<Table>,
}

impl Overrides {
    /// Overrides held in memory only (tests, and a service told to keep none).
    pub fn in_memory(max_per_namespace: usize) -> Self {
        Self {
            path: None,
            max_per_namespace,
            table: Mutex::new(Table::new()),
        }
    }

    /// Overrides kept in `path`: read from it if it exists (a missing file is no overrides;
    /// an unreadable one is an error naming it).
    pub fn load(path: &Path, max_per_namespace: usize) -> Result<Self, String> {
        let table = match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|e| format!("{}: not an overrides file ({e})", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Table::new(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Ok(Self {
            path: Some(path.to_owned()),
            max_per_namespace,
            table: Mutex::new(table),
        })
    }

    /// Where they are kept, if in a file.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn table(&self) -> std::sync::MutexGuard<'_, Table> {
        // A poisoned table is still the table: every change completes before it is visible.
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sets (or changes) the override of `identifier` in `namespace`; its id.
    pub fn set(
        &self,
        namespace: &str,
        identifier: &str,
        limit: u64,
        duration_ms: u64,
    ) -> Result<String, OverrideError> {
        let mut table = self.table();
        let held = table.get(namespace).map_or(0, BTreeMap::len);
        let exists = table
            .get(namespace)
            .is_some_and(|n| n.contains_key(identifier));
        if !exists && held >= self.max_per_namespace {
            return Err(OverrideError::Full {
                namespace: namespace.to_owned(),
                max: self.max_per_namespace,
            });
        }
        let id = override_id(namespace, identifier);
        let mut changed = table.clone();
        changed.entry(namespace.to_owned()).or_default().insert(
            identifier.to_owned(),
            Override {
                id: id.clone(),
                identifier: identifier.to_owned(),
                limit,
                duration_ms,
            },
        );
        self.save(&changed)?;
        *table = changed;
        Ok(id)
    }

    /// The override set for exactly `identifier` (a pattern is asked for by its text).
    pub fn get(&self, namespace: &str, identifier: &str) -> Result<Override, OverrideError> {
        self.table()
            .get(namespace)
            .and_then(|n| n.get(identifier))
            .cloned()
            .ok_or_else(|| not_found(namespace, identifier))
    }

    /// Deletes the override set for exactly `identifier`.
    pub fn delete(&self, namespace: &str, identifier: &str) -> Result<(), OverrideError> {
        let mut table = self.table();
        if !table
            .get(namespace)
            .is_some_and(|n| n.contains_key(identifier))
        {
            return Err(not_found(namespace, identifier));
        }
        let mut changed = table.clone();
        if let Some(n) = changed.get_mut(namespace) {
            n.remove(identifier);
            if n.is_empty() {
                changed.remove(namespace);
            }
        }
        self.save(&changed)?;
        *table = changed;
        Ok(())
    }

    /// Up to `limit` overrides of `namespace` after `cursor` (an identifier), in identifier
    /// order, and the cursor of the next page if there is one.
    pub fn list(
        &self,
        namespace: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> (Vec<Override>, Option<String>) {
        let table = self.table();
        let Some(n) = table.get(namespace) else {
            return (Vec::new(), None);
        };
        let after = |id: &&String| cursor.is_none_or(|c| id.as_str() > c);
        let mut page: Vec<Override> = n
            .iter()
            .filter(|(id, _)| after(id))
            .take(limit.saturating_add(1))
            .map(|(_, o)| o.clone())
            .collect();
        let next = (page.len() > limit).then(|| {
            page.truncate(limit);
            page.last()
                .map(|o| o.identifier.clone())
                .unwrap_or_default()
        });
        (page, next)
    }

    /// The override that applies to `identifier` in `namespace` (see the module docs).
    pub fn find(&self, namespace: &str, identifier: &str) -> Option<Override> {
        let table = self.table();
        let n = table.get(namespace)?;
        if let Some(exact) = n.get(identifier) {
            return Some(exact.clone());
        }
        n.values()
            .filter(|o| o.identifier.contains('*') && matches(&o.identifier, identifier))
            .min_by(|a, b| {
                let literal = |o: &Override| o.identifier.chars().filter(|c| *c != '*').count();
                literal(b)
                    .cmp(&literal(a))
                    .then_with(|| a.identifier.cmp(&b.identifier))
            })
            .cloned()
    }

    /// Every namespace's overrides, for the debug views.
    pub fn snapshot(&self) -> BTreeMap<String, Vec<Override>> {
        self.table()
            .iter()
            .map(|(ns, n)| (ns.clone(), n.values().cloned().collect()))
            .collect()
    }

    /// Writes `table` to the file atomically; nothing in memory changes if it fails.
    fn save(&self, table: &Table) -> Result<(), OverrideError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let failed = |e: std::io::Error| OverrideError::Save {
            path: path.display().to_string(),
            reason: e.to_string(),
        };
        let bytes = serde_json::to_vec_pretty(table).map_err(|e| failed(e.into()))?;
        let mut temporary = path.clone().into_os_string();
        temporary.push(".tmp");
        let temporary = PathBuf::from(temporary);
        {
            use std::io::Write;
            let mut file = std::fs::File::create(&temporary).map_err(failed)?;
            file.write_all(&bytes).map_err(failed)?;
            file.sync_all().map_err(failed)?;
        }
        std::fs::rename(&temporary, path).map_err(failed)
    }
}

fn not_found(namespace: &str, identifier: &str) -> OverrideError {
    OverrideError::NotFound {
        namespace: namespace.to_owned(),
        identifier: identifier.to_owned(),
    }
}

/// `ovr_` and 16 hex digits of the SHA-256 of the namespace and identifier (length-prefixed).
fn override_id(namespace: &str, identifier: &str) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(format!("{}:{namespace}{identifier}", namespace.len()));
    let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("ovr_{hex}")
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters.
fn matches(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return pattern == text;
    }
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    for middle in &parts[1..parts.len() - 1] {
        match rest.find(middle) {
            Some(at) => rest = &rest[at + middle.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_any_run_of_characters() {
        for (pattern, text, want) in [
            ("user_*", "user_1", true),
            ("user_*", "user_", true),
            ("user_*", "admin_1", false),
            ("*@acme.com", "ada@acme.com", true),
            ("*@acme.com", "ada@acme.co", false),
            ("a*b*c", "abc", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "acb", false),
            ("ab*ba", "aba", false),
            ("*", "", true),
            ("exact", "exact", true),
        ] {
            assert_eq!(matches(pattern, text), want, "{pattern} ~ {text}");
        }
    }

    #[test]
    fn exact_beats_patterns_and_the_most_specific_pattern_wins() {
        let o = Overrides::in_memory(10);
        o.set("api", "*", 1, 1_000).unwrap();
        o.set("api", "user_*", 2, 1_000).unwrap();
        o.set("api", "*_vip", 3, 1_000).unwrap();
        o.set("api", "user_ada", 4, 1_000).unwrap();
        let limit = |id: &str| o.find("api", id).map(|o| o.limit);
        assert_eq!(limit("user_ada"), Some(4), "exact");
        assert_eq!(limit("user_bob"), Some(2), "5 literal characters beat 0");
        // `user_*` and `*_vip` both have 4 or 5 literals: `user_` (5) beats `_vip` (4).
        assert_eq!(limit("user_vip"), Some(2));
        assert_eq!(limit("cy_vip"), Some(3));
        assert_eq!(limit("cy"), Some(1));
        assert_eq!(o.find("web", "user_ada"), None, "per namespace");
        // Ties go to the smaller pattern text, whatever order they were set in.
        let t = Overrides::in_memory(10);
        t.set("n", "b*", 1, 1_000).unwrap();
        t.set("n", "*b", 2, 1_000).unwrap();
        assert_eq!(
            t.find("n", "bb").map(|o| o.identifier),
            Some("*b".to_owned())
        );
    }

    #[test]
    fn ids_are_stable_pages_follow_cursors_and_namespaces_are_bounded() {
        let o = Overrides::in_memory(3);
        let id = o.set("api", "a", 1, 1_000).unwrap();
        assert_eq!(
            o.set("api", "a", 9, 2_000).unwrap(),
            id,
            "setting again keeps the id"
        );
        assert_eq!(o.get("api", "a").unwrap().limit, 9);
        assert_ne!(o.set("api", "b", 1, 1_000).unwrap(), id);
        o.set("api", "c", 1, 1_000).unwrap();
        assert!(matches!(
            o.set("api", "d", 1, 1_000),
            Err(OverrideError::Full { max: 3, .. })
        ));
        assert!(
            o.set("api", "c", 2, 1_000).is_ok(),
            "changing one is not adding one"
        );
        let (first, cursor) = o.list("api", None, 2);
        assert_eq!(
            first
                .iter()
                .map(|o| o.identifier.as_str())
                .collect::<Vec<_>>(),
            ["a", "b"]
        );
        let (rest, end) = o.list("api", cursor.as_deref(), 2);
        assert_eq!((rest.len(), end), (1, None));
        o.delete("api", "b").unwrap();
        assert!(matches!(
            o.delete("api", "b"),
            Err(OverrideError::NotFound { .. })
        ));
        assert!(matches!(
            o.get("api", "b"),
            Err(OverrideError::NotFound { .. })
        ));
    }

    #[test]
    fn a_file_keeps_them_across_a_restart() {
        let dir = std::env::temp_dir().join(format!("limiterd-overrides-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("overrides.json");
        let _ = std::fs::remove_file(&path);
        let o = Overrides::load(&path, 10).unwrap();
        let id = o.set("api", "user_*", 5, 60_000).unwrap();
        o.set("api", "gone", 1, 1_000).unwrap();
        o.delete("api", "gone").unwrap();
        drop(o);
        let again = Overrides::load(&path, 10).unwrap();
        assert_eq!(
            again.find("api", "user_7").map(|o| (o.id, o.limit)),
            Some((id, 5))
        );
        assert!(again.get("api", "gone").is_err());
        std::fs::write(&path, "not json").unwrap();
        assert!(
            Overrides::load(&path, 10)
                .unwrap_err()
                .contains("overrides.json")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
