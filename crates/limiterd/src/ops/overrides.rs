//! Per-identifier overrides of unkey's v2 API, set at run time: in each namespace, an
//! identifier (or a pattern with `*`, matching any run of characters) gets its own limit and
//! duration. They are data, not configuration: a reload keeps them. Where they are kept is the
//! store room's ([`crate::store::overrides`]): in memory, a JSON file read at start, each
//! change appended to a journal beside it, so they survive a restart; on Redis, records every
//! instance shares: each change is written there first, and every instance polls their
//! version every [`REFRESH_EVERY`], reading them again when it moved, so an override set on
//! one instance applies on the others within that interval and a round trip. Decisions read
//! the copy held here, never the file or Redis (indexed for them, a copy per shard of
//! threads, changed one override at a time: `matching.rs`); reads of the overrides themselves
//! (`getOverride`, `listOverrides`) catch up with Redis first ([`Overrides::catch_up`]), so
//! they answer another instance's change at once.
//!
//! Which override applies to an identifier: an exact one first; otherwise the matching pattern
//! with the most literal characters (the most specific), ties broken by the pattern's text
//! (the smaller first), so the choice never depends on the order overrides were set. Each
//! matching identifier keeps its own counter: a pattern sets a limit, not a shared budget.
//!
//! An override's id is derived from its namespace and identifier, so setting one again keeps
//! its id, and the id is the same on every instance and after a restart.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};

use crate::shards::PerThread;
use crate::store::RedisRecords;
pub use crate::store::overrides::Override;
use crate::store::overrides::{Change, Keeping, NotSaved, Read, Removal, Table, off_the_workers};
use limiter_core::Paced;

mod matching;
use matching::Matching;

/// How often an instance on Redis looks for overrides another instance changed.
pub const REFRESH_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// The most changes read from Redis's log that are made to the index on the async worker
/// (each namespace they touch copied once: about 0.1 ms in a namespace of 10,000); more are
/// made to a copy indexed whole on the blocking threads.
const FEW_CHANGES: usize = 8;

/// The least time between two warnings of a poll failure that lasts but changes.
pub const CHANGES_WARNED_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

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
        "namespace `{namespace}` already holds its {max} overrides: delete one, or raise `[overrides] max_per_namespace`"
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

/// Every namespace's overrides, and where they are kept.
#[derive(Debug)]
pub struct Overrides {
    keeping: Keeping,
    /// The copy decisions read (many at once), and (on Redis) the version it was read at
    /// (`None`: not read from Redis yet). Written only for in-memory work: a change being
    /// saved to a file or Redis never holds it, so a decision never waits on a write.
    table: RwLock<(Arc<Table>, Option<u64>)>,
    /// The same overrides as decisions find them, a copy per shard of threads, replaced with
    /// every change of `table` (under its write lock).
    matching: PerThread<Matching>,
    /// Held by one change or refresh at a time, across its write to (or read of) the file or
    /// Redis, so no two of them lose each other's work.
    writing: tokio::sync::Mutex<()>,
    /// Why the last poll of Redis could not read them (`None`: it could, or no poll yet), for
    /// `/debug/status`; only [`poll`](Self::poll) writes it.
    read_error: Mutex<Option<String>>,
    /// Paces the warnings of a failure that lasts but changes (an outage's errors name the
    /// breaker's next probe, so they differ at every poll).
    changes_warned: Paced,
}

impl Overrides {
    /// Overrides held in memory only (tests, and a service told to keep none).
    pub fn in_memory() -> Self {
        Self::kept(Keeping::Memory, Table::new())
    }

    fn kept(keeping: Keeping, table: Table) -> Self {
        Self {
            keeping,
            matching: PerThread::new(Matching::new(&table)),
            table: RwLock::new((Arc::new(table), None)),
            writing: tokio::sync::Mutex::new(()),
            read_error: Mutex::new(None),
            changes_warned: Paced::new(CHANGES_WARNED_EVERY),
        }
    }

    /// Overrides kept in Redis, shared by every instance on it: read now if Redis answers
    /// (else none until it does; the store's failure policy keeps deciding meanwhile), then
    /// kept fresh by [`refresh`](Self::refresh).
    pub async fn on_redis(records: RedisRecords) -> Self {
        let overrides = Self::kept(Keeping::Redis(records), Table::new());
        if let Err(e) = overrides.refresh().await {
            tracing::warn!(error = %e, "the overrides could not be read from Redis yet; they apply once it answers");
        }
        overrides
    }

    /// On Redis, reads the overrides again if another instance changed them (one `GET` when
    /// nothing changed); whether they changed. Elsewhere, nothing to do.
    ///
    /// It holds `writing` from the read to its copy being installed: a read taken before a
    /// change of this instance and installed after it would undo that change here until the
    /// next poll (a deleted override found again, a set one missing).
    pub async fn refresh(&self) -> Result<bool, crate::store::BackendError> {
        let _writing = self.writing.lock().await;
        self.refresh_writing().await
    }

    /// [`refresh`](Self::refresh), with `writing` held by the caller.
    async fn refresh_writing(&self) -> Result<bool, crate::store::BackendError> {
        let seen = self.table().1;
        let (table, version) = match self.keeping.read_if_changed(seen).await? {
            None => return Ok(false),
            Some(Read::Changes(changes, version)) if changes.len() <= FEW_CHANGES => {
                self.install_changes(&changes, version);
                return Ok(true);
            }
            Some(Read::Changes(changes, version)) => {
                // Many: made to a copy, indexed whole below.
                let current = Arc::clone(&self.table().0);
                let changed = off_the_workers(move || {
                    let mut table = Table::clone(&current);
                    changes.iter().for_each(|change| change.apply(&mut table));
                    table
                })
                .await;
                (changed, version)
            }
            Some(Read::Whole(table, version)) => (table, version),
        };
        // Indexed off the async workers: 10,000 overrides take about 4 ms.
        let (matching, table) = off_the_workers(move || (Matching::new(&table), table)).await;
        self.install(table, matching, Some(version));
        Ok(true)
    }

    /// One poll of Redis (every [`REFRESH_EVERY`]): [`refresh`](Self::refresh), with its
    /// failure kept for `/debug/status` and logged as a warning when it starts (a key holding
    /// what no change wrote is named in it) and when it changes, at most once every
    /// [`CHANGES_WARNED_EVERY`] (an outage's errors differ at every poll), quietly otherwise,
    /// and its end logged too.
    pub async fn poll(&self) {
        let result = self.refresh().await.map_err(|e| e.to_string());
        let mut read_error = self
            .read_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let last = read_error.as_deref();
        match &result {
            Ok(_) if last.is_some() => tracing::info!("the overrides are read from Redis again"),
            Ok(_) => {}
            Err(error) if last.is_none() => {
                // Starts the pace, so a change right after is not warned again.
                let _ = self.changes_warned.due();
                tracing::warn!(
                    %error,
                    "the overrides cannot be read from Redis: this instance decides by the copy it has until they can; retrying"
                );
            }
            Err(error) if last != Some(error.as_str()) && self.changes_warned.due().is_some() => {
                tracing::warn!(%error, "the overrides still cannot be read from Redis, now for this reason");
            }
            Err(error) => {
                tracing::debug!(%error, "the overrides still cannot be read from Redis");
            }
        }
        *read_error = result.err();
    }

    /// Why the last poll of Redis could not read the overrides (`None`: it could).
    pub fn read_error(&self) -> Option<String> {
        self.read_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// On Redis, catches up with the changes other instances made (one `GET` when there were
    /// none), so a read of the overrides (`getOverride`, `listOverrides`) answers what the fleet
    /// holds, not what this instance's last poll saw. If Redis cannot be read, the copy this
    /// instance decides by stands.
    pub async fn catch_up(&self) {
        if let Err(error) = self.refresh().await {
            tracing::debug!(%error, "the overrides could not be read from Redis; answering this instance's copy");
        }
    }

    /// Overrides kept in `path`: read from it if it exists (a missing file is no overrides;
    /// an unreadable one is an error naming it).
    pub fn load(path: &Path) -> Result<Self, String> {
        let (keeping, table) = Keeping::load(path)?;
        Ok(Self::kept(keeping, table))
    }

    /// The overrides kept in `path`, read with nothing written and kept nowhere (for
    /// `check-config`, which may run while a limiterd keeps them there).
    pub fn read_only(path: &Path) -> Result<Self, String> {
        Ok(Self::kept(Keeping::Memory, Keeping::read_only(path)?))
    }

    /// Where they are kept: a file, `redis`, or `None` (this process's memory only).
    pub fn kept_in(&self) -> Option<String> {
        self.keeping.kept_in()
    }

    fn table(&self) -> RwLockReadGuard<'_, (Arc<Table>, Option<u64>)> {
        // A poisoned table is still the table: every change completes before it is visible.
        self.table.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the copy with `table` read at `version` (from Redis), and what decisions find
    /// with `matching`, its index.
    fn install(&self, table: Table, matching: Matching, version: Option<u64>) {
        let mut held = self.table.write().unwrap_or_else(PoisonError::into_inner);
        self.matching.replace(matching);
        *held = (Arc::new(table), version);
    }

    /// Makes `change` in the copy (`saved`: the copy with it made, as a file now holds it;
    /// else it is made in place), and in what decisions find: by that one override, not
    /// rebuilt whole. `version`: the Redis records' version after the change; where the copy
    /// held the one just before, the copy is now Redis's at `version` (this change was the
    /// only one between), so the next poll reads one `GET` and not every override again.
    fn install_change(&self, change: &Change, saved: Option<Table>, version: Option<u64>) {
        let mut held = self.table.write().unwrap_or_else(PoisonError::into_inner);
        match saved {
            Some(saved) => held.0 = Arc::new(saved),
            // Not shared (only a save in flight holds it, and none is): changed in place.
            None => change.apply(Arc::make_mut(&mut held.0)),
        }
        if let (Some(after), Some(before)) = (version, held.1)
            && before.checked_add(1) == Some(after)
        {
            held.1 = Some(after);
        }
        let matching = self.matching.read().with_changes([change]);
        self.matching.replace(matching);
    }

    /// Makes `changes` (another instance's, read from Redis's log since the copy's version) in
    /// the copy and in what decisions find, one override at a time; the copy is then Redis's
    /// at `version`.
    fn install_changes(&self, changes: &[Change], version: u64) {
        let mut held = self.table.write().unwrap_or_else(PoisonError::into_inner);
        let table = Arc::make_mut(&mut held.0);
        changes.iter().for_each(|change| change.apply(table));
        let matching = self.matching.read().with_changes(changes);
        self.matching.replace(matching);
        held.1 = Some(version);
    }

    /// Sets (or changes) the override of `identifier` in `namespace`, which holds at most
    /// `max` (on Redis, counted on the fleet's overrides as read just before: two instances
    /// adding at once may each see room for one more); its id.
    pub async fn set(
        &self,
        namespace: &str,
        identifier: &str,
        (limit, duration_ms): (u64, u64),
        max: usize,
    ) -> Result<String, OverrideError> {
        let id = override_id(namespace, identifier);
        let entry = Override {
            id: id.clone(),
            identifier: identifier.to_owned(),
            limit,
            duration_ms,
        };
        let _writing = self.writing.lock().await;
        if let Err(error) = self.refresh_writing().await {
            tracing::debug!(%error, "the overrides could not be read from Redis; counting this instance's copy");
        }
        {
            let table = &self.table().0;
            let held = table.get(namespace);
            let exists = held.is_some_and(|n| n.contains_key(identifier));
            if !exists && held.map_or(0, BTreeMap::len) >= max {
                return Err(OverrideError::Full {
                    namespace: namespace.to_owned(),
                    max,
                });
            }
        }
        let version = self
            .keeping
            .put(namespace, &entry)
            .await
            .map_err(not_saved)?;
        self.change(namespace, identifier, Some(entry), version)
            .await?;
        Ok(id)
    }

    /// The override set for exactly `identifier` (a pattern is asked for by its text).
    pub fn get(&self, namespace: &str, identifier: &str) -> Result<Override, OverrideError> {
        self.table()
            .0
            .get(namespace)
            .and_then(|n| n.get(identifier))
            .cloned()
            .ok_or_else(|| not_found(namespace, identifier))
    }

    /// Deletes the override set for exactly `identifier`.
    pub async fn delete(&self, namespace: &str, identifier: &str) -> Result<(), OverrideError> {
        let _writing = self.writing.lock().await;
        let exists = self
            .table()
            .0
            .get(namespace)
            .is_some_and(|n| n.contains_key(identifier));
        let removal = self
            .keeping
            .remove(namespace, identifier)
            .await
            .map_err(not_saved)?;
        // On Redis, Redis decided: another instance may have set or deleted it since this
        // copy, which drops it either way.
        match removal {
            Removal::NotOnRedis if !exists => Err(not_found(namespace, identifier)),
            Removal::NotOnRedis => self.change(namespace, identifier, None, None).await,
            Removal::Removed { version } => {
                self.change(namespace, identifier, None, Some(version))
                    .await
            }
            Removal::Missing => {
                self.change(namespace, identifier, None, None).await?;
                Err(not_found(namespace, identifier))
            }
        }
    }

    /// Sets (`Some`) or deletes (`None`) one override in this process's copy, written first to
    /// the file when overrides are kept in one (nothing changes if that fails; Redis was
    /// written by the caller, `version` its records' version after), with `writing` held. The
    /// file is written off the async workers and without the copy's lock: decisions read the
    /// copy as it was until the write is done.
    async fn change(
        &self,
        namespace: &str,
        identifier: &str,
        entry: Option<Override>,
        version: Option<u64>,
    ) -> Result<(), OverrideError> {
        let change = Change {
            namespace: namespace.to_owned(),
            identifier: identifier.to_owned(),
            entry,
        };
        let current = Arc::clone(&self.table().0);
        let saved = self
            .keeping
            .save(current, change.clone())
            .await
            .map_err(not_saved)?;
        self.install_change(&change, saved, version);
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
        let Some(n) = table.0.get(namespace) else {
            return (Vec::new(), None);
        };
        // From the cursor on, found in the map: a page costs its own overrides, not those
        // before it.
        let from = cursor.map_or(Bound::Unbounded, Bound::Excluded);
        let mut page: Vec<Override> = n
            .range::<str, _>((from, Bound::Unbounded))
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
    #[inline]
    pub fn find(&self, namespace: &str, identifier: &str) -> Option<Override> {
        self.matching.read().find(namespace, identifier).cloned()
    }

    /// Every namespace's overrides, for the debug views.
    pub fn snapshot(&self) -> BTreeMap<String, Vec<Override>> {
        self.table()
            .0
            .iter()
            .map(|(ns, n)| (ns.clone(), n.values().cloned().collect()))
            .collect()
    }
}

/// A write that failed, as the API reports it: nothing changed.
fn not_saved(failed: NotSaved) -> OverrideError {
    OverrideError::Save {
        path: failed.place,
        reason: failed.reason,
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

#[cfg(test)]
mod tests;
