//! Where unkey's overrides are kept besides the process's copy: nowhere (this process's memory
//! only), a JSON file written atomically (a temporary file beside it, synced, then renamed
//! over it), or Redis records every instance shares (each override a field, with a version
//! that moves on every change). What an override is and which one applies is
//! `ops::overrides`'s; this is only where their table is read and written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{BackendError, KEY_PREFIX, RedisBackend, RedisRecords};

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

/// Where overrides are kept besides this process's copy.
#[derive(Debug)]
pub enum Keeping {
    /// Nowhere: this process's memory only.
    Memory,
    /// A JSON file, read at start and written on every change.
    File(PathBuf),
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
    /// Overrides kept in `path`, and the table read from it if it exists (a missing file is
    /// no overrides; an unreadable one is an error naming it).
    pub fn load(path: &Path) -> Result<(Self, Table), String> {
        let table = match std::fs::read(path) {
            // Strictly, as a request body: an object wherever one belongs.
            Ok(bytes) => limiter_input::from_slice(&bytes)
                .map_err(|e| format!("{}: not an overrides file ({e})", path.display()))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Table::new(),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        Ok((Self::File(path.to_owned()), table))
    }

    /// Where they are kept: a file, `redis`, or `None` (this process's memory only).
    pub fn kept_in(&self) -> Option<String> {
        match self {
            Self::Memory => None,
            Self::File(path) => Some(path.display().to_string()),
            Self::Redis(_) => Some("redis".to_owned()),
        }
    }

    /// On Redis, the table as Redis holds it and its version, if the version is not `seen`
    /// (one `GET` when nothing changed); `None` elsewhere or when nothing changed. A record
    /// this version cannot read is skipped with a warning naming its field, not fatal.
    pub async fn read_if_changed(
        &self,
        seen: Option<u64>,
    ) -> Result<Option<(Table, u64)>, BackendError> {
        let Self::Redis(records) = self else {
            return Ok(None);
        };
        if let Some(seen) = seen
            && records.version().await? == seen
        {
            return Ok(None);
        }
        let (version, fields) = records.all().await?;
        let mut table = Table::new();
        for (field, value) in fields {
            match serde_json::from_str::<Stored>(&value) {
                Ok(stored) => {
                    let entry = stored.entry;
                    table
                        .entry(stored.namespace)
                        .or_default()
                        .insert(entry.identifier.clone(), entry);
                }
                // Logged at each read of a changed table, never per decision.
                Err(e) => tracing::warn!(
                    field = %field,
                    error = %e,
                    "an override record on Redis is not one this version reads; it is skipped \
                     (a newer limiterd's, or written by hand: delete the field or fix it)"
                ),
            }
        }
        Ok(Some((table, version)))
    }

    /// On Redis, writes `entry` of `namespace` (before this process's copy changes); nothing
    /// elsewhere.
    pub async fn put(&self, namespace: &str, entry: &Override) -> Result<(), NotSaved> {
        let Self::Redis(records) = self else {
            return Ok(());
        };
        let stored = Stored {
            namespace: namespace.to_owned(),
            entry: entry.clone(),
        };
        let value = serde_json::to_string(&stored).unwrap_or_default();
        records
            .put(&field(namespace, &entry.identifier), &value)
            .await
            .map(drop)
            .map_err(|e| NotSaved::at("redis", e))
    }

    /// On Redis, removes the override of `identifier` in `namespace`: whether Redis held it
    /// (Redis decides: another instance may have set or deleted it since this copy). `None`
    /// elsewhere.
    pub async fn remove(
        &self,
        namespace: &str,
        identifier: &str,
    ) -> Result<Option<bool>, NotSaved> {
        let Self::Redis(records) = self else {
            return Ok(None);
        };
        records
            .remove(&field(namespace, identifier))
            .await
            .map(Some)
            .map_err(|e| NotSaved::at("redis", e))
    }

    /// In a file, writes `table` there atomically, off the async workers, and hands it back;
    /// elsewhere hands it back at once. Nothing is written if it fails.
    pub async fn save(&self, table: Table) -> Result<Table, NotSaved> {
        let Self::File(path) = self else {
            return Ok(table);
        };
        let path = path.clone();
        tokio::task::spawn_blocking(move || write_atomically(&path, &table).map(|()| table))
            .await
            .map_err(|e| NotSaved::at("the overrides file", e))?
    }

    /// Whether a change is written to a file (so it is made on a copy of the table first).
    pub fn is_file(&self) -> bool {
        matches!(self, Self::File(_))
    }
}

/// Writes `table` to `path` atomically (a synced temporary file renamed over it).
fn write_atomically(path: &Path, table: &Table) -> Result<(), NotSaved> {
    let failed = |e: std::io::Error| NotSaved::at(&path.display().to_string(), e);
    let bytes = serde_json::to_vec_pretty(table).map_err(|e| failed(e.into()))?;
    let mut temporary = path.to_owned().into_os_string();
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

/// An override's field in Redis: the namespace length-prefixed, then the identifier.
fn field(namespace: &str, identifier: &str) -> String {
    format!("{}:{namespace}{identifier}", namespace.len())
}

#[cfg(test)]
mod tests {
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
        assert_eq!(keeping.save(one()).await, Ok(one()));
        assert_eq!(Keeping::load(&path).expect("saved").1, one());
        // No temporary file is left beside it.
        assert_eq!(std::fs::read_dir(&dir).expect("dir").count(), 1);

        // A file in a directory that does not exist cannot be written: named, and the table
        // handed to it is not reported saved.
        let missing = dir.join("gone").join("overrides.json");
        let (keeping, _) = Keeping::load(&missing).expect("missing is empty");
        let failed = keeping.save(one()).await.expect_err("no directory");
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
        assert_eq!(keeping.put("api", &one()["api"]["user_*"]).await, Ok(()));
        assert_eq!(keeping.remove("api", "user_*").await, Ok(None));
        assert_eq!(keeping.save(one()).await, Ok(one()));
        assert!(!keeping.is_file());
    }
}
