//! Where unkey's overrides are kept besides the process's copy: nowhere (this process's memory
//! only), a JSON file with a journal of changes beside it (`file.rs`), or Redis records every
//! instance shares (each override a field, with a version that moves on every change). What
//! an override is and which one applies is `ops::overrides`'s; this is only where their table
//! is read and written.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{BackendError, KEY_PREFIX, RedisBackend, RedisRecords, Since};

mod file;
pub use file::OverridesFile;

/// unkey's overrides on Redis: the records `overrides` under limiterd's prefix
/// (`limiterd:{records:overrides}:…`, where they have always been).
pub fn records_on(backend: &RedisBackend) -> Result<RedisRecords, String> {
    backend
        .records("overrides")
        .and_then(|records| records.with_prefix(KEY_PREFIX))
        .map_err(|e| e.to_string())
}

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

/// Every namespace's overrides, by namespace and then identifier.
pub type Table = BTreeMap<String, BTreeMap<String, Override>>;

/// One change to a [`Table`]: the override of `identifier` in `namespace` set to `entry`
/// (`None`: deleted). A line of the overrides file's journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// The namespace.
    pub namespace: String,
    /// The identifier (or pattern) changed.
    pub identifier: String,
    /// Its override now (`None`: deleted).
    pub entry: Option<Override>,
}

impl Change {
    /// Makes the change in `table` (a namespace left with no override is dropped).
    pub fn apply(&self, table: &mut Table) {
        match &self.entry {
            Some(entry) => {
                let n = table.entry(self.namespace.clone()).or_default();
                n.insert(self.identifier.clone(), entry.clone());
            }
            None => {
                if let Some(n) = table.get_mut(&self.namespace) {
                    n.remove(&self.identifier);
                    if n.is_empty() {
                        table.remove(&self.namespace);
                    }
                }
            }
        }
    }
}

/// A write that failed, so nothing changed: where (a file's path, or `redis`) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotSaved {
    /// The file, or `redis`.
    pub place: String,
    /// Why.
    pub reason: String,
}

impl NotSaved {
    fn at(place: &str, reason: impl std::fmt::Display) -> Self {
        Self {
            place: place.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// A removal, as Redis answered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// Not kept on Redis: the caller's copy says whether there was such an override.
    NotOnRedis,
    /// Redis held no such override.
    Missing,
    /// Removed; the records' version after.
    Removed {
        /// The version.
        version: u64,
    },
}

/// Where overrides are kept besides this process's copy.
#[derive(Debug)]
pub enum Keeping {
    /// Nowhere: this process's memory only.
    Memory,
    /// A JSON file, read at start, with a journal of the changes since it was written.
    File(Arc<OverridesFile>),
    /// Redis records shared by every instance on the store.
    Redis(RedisRecords),
}

/// One override as Redis keeps it (its namespace with it, so the table can be rebuilt).
#[derive(Serialize, Deserialize)]
struct Stored {
    namespace: String,
    entry: Override,
}

impl Keeping {
    /// Overrides kept in `path`, and the table read from it and its journal if they exist (a
    /// missing file is no overrides; an unreadable one is an error naming it).
    pub fn load(path: &Path) -> Result<(Self, Table), String> {
        let (file, table) = OverridesFile::load(path)?;
        Ok((Self::File(Arc::new(file)), table))
    }

    /// The table kept in `path` and its journal, read with nothing written (a check while
    /// limiterd may be writing them).
    pub fn read_only(path: &Path) -> Result<Table, String> {
        OverridesFile::read_only(path)
    }

    /// Where they are kept: a file, `redis`, or `None` (this process's memory only).
    pub fn kept_in(&self) -> Option<String> {
        match self {
            Self::Memory => None,
            Self::File(file) => Some(file.path().display().to_string()),
            Self::Redis(_) => Some("redis".to_owned()),
        }
    }

    /// On Redis, what Redis holds beyond a copy at version `seen` (`None`: no copy yet): the
    /// changes since, when Redis's log holds them all, else the table whole; `None` elsewhere
    /// or when nothing changed (one `GET`). A record this version cannot read is skipped with
    /// a warning naming its field, not fatal (as a change, it deletes the override it held).
    pub async fn read_if_changed(&self, seen: Option<u64>) -> Result<Option<Read>, BackendError> {
        let Self::Redis(records) = self else {
            return Ok(None);
        };
        let Some(seen) = seen else {
            let (version, fields) = records.all().await?;
            return Ok(Some(Read::whole(fields, version).await));
        };
        if records.version().await? == seen {
            return Ok(None);
        }
        Ok(match records.since(seen).await? {
            Since::Unchanged => None,
            Since::Whole { version, fields } => Some(Read::whole(fields, version).await),
            Since::Changes { version, changes } => Some(Read::Changes(
                changes.into_iter().filter_map(change_of).collect(),
                version,
            )),
        })
    }

    /// On Redis, writes `entry` of `namespace` (before this process's copy changes): the
    /// records' version after. Nothing elsewhere (`None`).
    pub async fn put(&self, namespace: &str, entry: &Override) -> Result<Option<u64>, NotSaved> {
        let Self::Redis(records) = self else {
            return Ok(None);
        };
        let stored = Stored {
            namespace: namespace.to_owned(),
            entry: entry.clone(),
        };
        let value = serde_json::to_string(&stored).unwrap_or_default();
        records
            .put(&field(namespace, &entry.identifier), &value)
            .await
            .map(Some)
            .map_err(|e| NotSaved::at("redis", e))
    }

    /// On Redis, removes the override of `identifier` in `namespace`, as Redis answers (it
    /// decides: another instance may have set or deleted it since this copy).
    pub async fn remove(&self, namespace: &str, identifier: &str) -> Result<Removal, NotSaved> {
        let Self::Redis(records) = self else {
            return Ok(Removal::NotOnRedis);
        };
        let removed = records
            .remove(&field(namespace, identifier))
            .await
            .map_err(|e| NotSaved::at("redis", e))?;
        Ok(removed.map_or(Removal::Missing, |version| Removal::Removed { version }))
    }

    /// In a file, writes `change` to `current` (the table before it), off the async workers:
    /// appended to the journal (`None`), or the table with it made, written whole (`Some`),
    /// as `file.rs` says. `None` elsewhere. With `None` the caller makes the change in its
    /// copy. Nothing is written if it fails.
    pub async fn save(
        &self,
        current: Arc<Table>,
        change: Change,
    ) -> Result<Option<Table>, NotSaved> {
        let Self::File(file) = self else {
            return Ok(None);
        };
        let file = Arc::clone(file);
        let saving = move || file.write(&current, &change);
        tokio::task::spawn_blocking(saving)
            .await
            .map_err(|e| NotSaved::at("the overrides file", e))?
    }
}

/// What Redis holds beyond a copy (`Keeping::read_if_changed`).
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// The table whole, at a version.
    Whole(Table, u64),
    /// The changes since the copy's version, in order, and the version after them.
    Changes(Vec<Change>, u64),
}

impl Read {
    /// The table of `fields`, parsed off the async workers (10,000 overrides take about 7 ms).
    async fn whole(fields: Vec<(String, String)>, version: u64) -> Self {
        Self::Whole(off_the_workers(move || table_of(fields)).await, version)
    }
}

/// The table of the records `fields` (field, value) read from Redis; a record this version
/// cannot read is skipped with a warning naming its field.
fn table_of(fields: Vec<(String, String)>) -> Table {
    let mut table = Table::new();
    for (field, value) in fields {
        if let Some(stored) = stored_in(&field, &value) {
            let entry = stored.entry;
            table
                .entry(stored.namespace)
                .or_default()
                .insert(entry.identifier.clone(), entry);
        }
    }
    table
}

/// The override record `value` of `field`, or `None` with a warning naming the field.
fn stored_in(field: &str, value: &str) -> Option<Stored> {
    serde_json::from_str::<Stored>(value)
        // Logged at each read of a changed record, never per decision.
        .inspect_err(|e| {
            tracing::warn!(
                field = %field,
                error = %e,
                "an override record on Redis is not one this version reads; it is skipped \
                 (a newer limiterd's, or written by hand: delete the field or fix it)"
            );
        })
        .ok()
}

/// A logged change of `field` (its value now, `None`: deleted) as a change of the table: a
/// value this version cannot read deletes the override the field held, as a whole read skips
/// it; `None` for a field that names no namespace and identifier.
fn change_of((field, value): (String, Option<String>)) -> Option<Change> {
    if let Some(stored) = value.and_then(|value| stored_in(&field, &value)) {
        return Some(Change {
            namespace: stored.namespace,
            identifier: stored.entry.identifier.clone(),
            entry: Some(stored.entry),
        });
    }
    let (length, rest) = field.split_once(':')?;
    let length: usize = length.parse().ok()?;
    Some(Change {
        namespace: rest.get(..length)?.to_owned(),
        identifier: rest.get(length..)?.to_owned(),
        entry: None,
    })
}

/// `work`'s result, computed on the runtime's blocking threads so no async worker (and no
/// decision queued on it) waits for it; a panic in it is the caller's.
pub(crate) async fn off_the_workers<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(done) => done,
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    }
}

/// An override's field in Redis: the namespace length-prefixed, then the identifier.
fn field(namespace: &str, identifier: &str) -> String {
    format!("{}:{namespace}{identifier}", namespace.len())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn one() -> Table {
        let entry = Override {
            id: "ovr_1".to_owned(),
            identifier: "user_*".to_owned(),
            limit: 5,
            duration_ms: 60_000,
        };
        Table::from([(
            "api".to_owned(),
            BTreeMap::from([(entry.identifier.clone(), entry)]),
        )])
    }

    /// A change setting `one()`'s override, and the table it makes of an empty one.
    fn one_change() -> (Change, Table) {
        let change = Change {
            namespace: "api".to_owned(),
            identifier: "user_*".to_owned(),
            entry: Some(one()["api"]["user_*"].clone()),
        };
        let mut table = Table::new();
        change.apply(&mut table);
        assert_eq!(table, one());
        (change, table)
    }

    /// A deletion drops the override, and the namespace with its last one.
    #[test]
    fn a_change_sets_and_deletes_one_override() {
        let (mut change, mut table) = one_change();
        let other = Change {
            identifier: "ada".to_owned(),
            ..change.clone()
        };
        other.apply(&mut table);
        assert_eq!(table["api"].len(), 2);
        change.entry = None;
        change.apply(&mut table);
        assert_eq!(table["api"].keys().collect::<Vec<_>>(), ["ada"]);
        Change {
            entry: None,
            ..other
        }
        .apply(&mut table);
        assert!(table.is_empty(), "{table:?}");
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("limiterd-store-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[tokio::test]
    async fn a_file_reads_back_what_was_saved_and_a_failed_save_names_the_file() {
        let dir = scratch("file");
        let path = dir.join("overrides.json");
        let (keeping, table) = Keeping::load(&path).expect("a missing file is no overrides");
        assert!(table.is_empty());
        assert_eq!(keeping.kept_in(), Some(path.display().to_string()));
        let (change, table) = one_change();
        assert_eq!(
            keeping.save(Arc::new(Table::new()), change.clone()).await,
            Ok(Some(table.clone()))
        );
        assert_eq!(Keeping::load(&path).expect("saved").1, table);
        // No temporary file is left beside it.
        assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 1);

        // A file in a directory that does not exist cannot be written: named, and the table
        // handed to it is not reported saved.
        let missing = dir.join("gone").join("overrides.json");
        let (keeping, _) = Keeping::load(&missing).expect("missing is empty");
        let failed = keeping
            .save(Arc::new(Table::new()), change)
            .await
            .expect_err("no directory");
        assert!(failed.place.contains("gone"), "{failed:?}");
        // A file that is not an overrides file is refused by name.
        std::fs::write(&path, "not json").expect("write");
        let refused = Keeping::load(&path).expect_err("not json");
        assert!(refused.contains("not an overrides file"), "{refused}");
        // Read strictly: an override given as an array is refused by its place, not read by
        // position (serde alone would).
        let positional = r#"{"api": {"user_*": ["ovr_1", "user_*", 5, 60000]}}"#;
        assert!(serde_json::from_str::<Table>(positional).is_ok());
        std::fs::write(&path, positional).expect("write");
        let refused = Keeping::load(&path).expect_err("an array");
        assert!(
            refused.contains(
                "not an overrides file (api.user_*: invalid type: array, expected a JSON object"
            ),
            "{refused}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn memory_keeps_nothing_elsewhere() {
        let keeping = Keeping::Memory;
        assert_eq!(keeping.kept_in(), None);
        assert_eq!(keeping.read_if_changed(None).await.ok(), Some(None));
        assert_eq!(keeping.put("api", &one()["api"]["user_*"]).await, Ok(None));
        assert_eq!(
            keeping.remove("api", "user_*").await,
            Ok(Removal::NotOnRedis)
        );
        let (change, _) = one_change();
        assert_eq!(keeping.save(Arc::new(one()), change).await, Ok(None));
    }
}
