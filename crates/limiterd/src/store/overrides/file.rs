//! The overrides file: the whole table as JSON (read at start; what an operator reads; written
//! by the first change when there is none), and a journal beside it (`FILE.journal`) to which
//! each change is appended as one line of JSON and synced. Once the journal holds more changes than the table has overrides (and at least
//! [`COMPACT_AFTER`]), the next change writes the table whole instead (a synced temporary
//! file renamed over the old one) and removes the journal, so a change costs a line, and the
//! whole table is written once per as many changes as it holds.
//!
//! Written whole at every change, a table of 10,000 overrides took about 6 ms a change (copy,
//! serialize, write, sync) and setting them all 36 s; an appended line is a fraction of a
//! millisecond whatever the table holds.
//!
//! Reading: the table, then every line of the journal applied in order. A change applies the
//! same whether or not the table already holds it, so a crash between the table's rename and
//! the journal's removal reads the same overrides. A last line cut short (a crash in the
//! middle of an append) is dropped, and cut from the file, with a warning; any other line that
//! is not a change is an error naming the file and the line. An append that fails is cut back
//! off, so no later line follows a broken one.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use super::{Change, NotSaved, Table};

/// The fewest changes the journal holds before the table is written whole again.
pub(super) const COMPACT_AFTER: usize = 1_024;

/// An overrides file and its journal.
#[derive(Debug)]
pub struct OverridesFile {
    path: PathBuf,
    journal: PathBuf,
    /// Changes are made one at a time: the lock is for the blocking thread each is written
    /// from.
    state: Mutex<Written>,
}

/// What the files hold.
#[derive(Debug)]
struct Written {
    /// Whether the table's file exists (until it does, a change writes it whole, so the file
    /// an operator looks for is there from the first change).
    table: bool,
    /// How many changes the journal holds.
    journaled: usize,
}

impl OverridesFile {
    /// The file at `path` and the table it holds with its journal applied (a missing file is
    /// no overrides; an unreadable one, or a journal line that is not a change, is an error
    /// naming it).
    pub(super) fn load(path: &Path) -> Result<(Self, Table), String> {
        let (mut table, exists) = match std::fs::read(path) {
            // Strictly, as a request body: an object wherever one belongs.
            Ok(bytes) => (
                limiter_input::from_slice(&bytes)
                    .map_err(|e| format!("{}: not an overrides file ({e})", path.display()))?,
                true,
            ),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Table::new(), false),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let journal = journal_of(path);
        let journaled = replay(&journal, &mut table)?;
        let file = Self {
            path: path.to_owned(),
            journal,
            state: Mutex::new(Written {
                table: exists,
                journaled,
            }),
        };
        Ok((file, table))
    }

    /// The table's file.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `change`, made to `current` (the table before it): appended to the journal
    /// (`None`: the caller makes it in its copy), or, once the journal is due to be folded in,
    /// the table with the change made, written whole (`Some`: the table now). Blocking: run it
    /// off the async workers. Nothing is written if it fails.
    pub(super) fn write(
        &self,
        current: &Table,
        change: &Change,
    ) -> Result<Option<Table>, NotSaved> {
        let mut written = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let overrides: usize = current.values().map(BTreeMap::len).sum();
        if written.table && written.journaled < COMPACT_AFTER.max(overrides) {
            append(&self.journal, change)?;
            written.journaled += 1;
            return Ok(None);
        }
        let mut table = current.clone();
        change.apply(&mut table);
        write_atomically(&self.path, &table)?;
        written.table = true;
        // The table holds every change now: a journal left behind (its removal failed) would
        // be read again over it, to the same overrides, and is removed with the next one.
        match std::fs::remove_file(&self.journal) {
            Ok(()) => written.journaled = 0,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => written.journaled = 0,
            Err(e) => tracing::warn!(
                journal = %self.journal.display(),
                error = %e,
                "the overrides journal could not be removed after the table was written; it is read again at start, to the same overrides"
            ),
        }
        Ok(Some(table))
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
        let mut file = File::create(&temporary).map_err(failed)?;
        file.write_all(&bytes).map_err(failed)?;
        file.sync_all().map_err(failed)?;
    }
    std::fs::rename(&temporary, path).map_err(failed)
}

/// `FILE.journal`, beside `path`.
fn journal_of(path: &Path) -> PathBuf {
    let mut journal = path.to_owned().into_os_string();
    journal.push(".journal");
    PathBuf::from(journal)
}

/// Appends `change` to `journal` as one line and syncs it; on failure cuts the file back to
/// where it was.
fn append(journal: &Path, change: &Change) -> Result<(), NotSaved> {
    let failed = |e: std::io::Error| NotSaved::at(&journal.display().to_string(), e);
    let mut line = serde_json::to_vec(change).map_err(|e| failed(e.into()))?;
    line.push(b'\n');
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(journal)
        .map_err(failed)?;
    let before = file.metadata().map_err(failed)?.len();
    let written = file.write_all(&line).and_then(|()| file.sync_data());
    if let Err(e) = written {
        let _ = file.set_len(before);
        return Err(failed(e));
    }
    Ok(())
}

/// Applies every change in `journal` to `table` (a missing journal holds none); how many.
fn replay(journal: &Path, table: &mut Table) -> Result<usize, String> {
    let bytes = match std::fs::read(journal) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(format!("{}: {e}", journal.display())),
    };
    let mut applied = 0;
    let mut at = 0;
    for (number, line) in (1..).zip(bytes.split_inclusive(|b| *b == b'\n')) {
        let change = limiter_input::from_slice::<Change>(line);
        match change {
            Ok(change) if line.ends_with(b"\n") => change.apply(table),
            Err(e) if line.ends_with(b"\n") => {
                return Err(format!(
                    "{}: line {number} is not an overrides change ({e}); limiterd writes this file: restore it, or remove it to drop the changes since the overrides file was last written",
                    journal.display()
                ));
            }
            // The last line, cut short: a crash in the middle of an append, never saved.
            _ => {
                cut_short(journal, at as u64, number);
                break;
            }
        }
        applied += 1;
        at += line.len();
    }
    Ok(applied)
}

/// Cuts `journal` back to its first `len` bytes (line `number` and after were cut short),
/// with a warning, so the next append does not follow a broken line.
fn cut_short(journal: &Path, len: u64, number: usize) {
    tracing::warn!(
        journal = %journal.display(),
        line = number,
        "the overrides journal's last line was cut short (a crash while a change was written; it was never saved): dropped"
    );
    let cut = OpenOptions::new()
        .write(true)
        .open(journal)
        .and_then(|file: File| file.set_len(len).and_then(|()| file.sync_data()));
    if let Err(e) = cut {
        tracing::warn!(journal = %journal.display(), error = %e, "the overrides journal could not be cut back");
    }
}

#[cfg(test)]
mod tests;
