//! The overrides file: the whole table as JSON (read at start; what an operator reads and may
//! write; written by the first change when there is none), and a journal beside it
//! (`FILE.journal`): a first line naming the file it follows (a fingerprint of its bytes),
//! then each change since, one line of JSON each, appended and synced. Once the journal holds
//! more changes than the table has overrides (and at least [`COMPACT_AFTER`]), the next
//! change writes the table whole instead (a synced temporary file renamed over the old one)
//! and the journal starts again, so a change costs a line, and the whole table is written once
//! per as many changes as it holds.
//!
//! Written whole at every change, a table of 10,000 overrides took about 6 ms a change (copy,
//! serialize, write, sync) and setting them all 36 s; an appended line is a fraction of a
//! millisecond whatever the table holds.
//!
//! Reading: the table, then every change of the journal in order, if the journal follows this
//! very file. One that follows another (the file was replaced since: provisioned anew by an
//! operator, or written whole by limiterd just before a crash, the journal's changes in it) is
//! moved aside (`FILE.journal.stale`) with a warning, and the file read as it is. A last line
//! cut short (a crash in the middle of a write) is dropped, and cut from the file, with a
//! warning; any other line that is not what it should be is an error naming the file and the
//! line. An append that fails is cut back off, so no later line follows a broken one.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use serde::{Deserialize, Serialize};

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
    /// The fingerprint of the table's file as it is (`None`: there is none yet, and a change
    /// writes it whole, so the file an operator looks for is there from the first change).
    follows: Option<String>,
    /// How many changes the journal holds (0: the next change starts it again).
    journaled: usize,
}

/// A journal's first line: the fingerprint of the file its changes follow.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    follows: String,
}

impl OverridesFile {
    /// The file at `path` and the table it holds with its journal applied (a missing file is
    /// no overrides; an unreadable one, or a journal line that is not a change, is an error
    /// naming it; a journal that follows another file is set aside).
    pub(super) fn load(path: &Path) -> Result<(Self, Table), String> {
        let (table, follows, journaled) = read(path, Reading::Mending)?;
        let file = Self {
            path: path.to_owned(),
            journal: journal_of(path),
            state: Mutex::new(Written { follows, journaled }),
        };
        Ok((file, table))
    }

    /// The table the file at `path` and its journal hold, read as [`load`](Self::load) reads
    /// it, with nothing written: a check may run while limiterd writes them (a line being
    /// appended is not cut off, a journal not set aside).
    pub(super) fn read_only(path: &Path) -> Result<Table, String> {
        read(path, Reading::Only).map(|(table, _, _)| table)
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
        // A file or journal removed under limiterd (by hand) is written whole again, so no
        // change is left in a journal that follows no file, or lost with one removed.
        let intact = self.path.exists() && (written.journaled == 0 || self.journal.exists());
        if let Some(follows) = &written.follows
            && intact
            && written.journaled < COMPACT_AFTER.max(overrides)
        {
            if written.journaled == 0 {
                start(&self.journal, follows, change)?;
            } else {
                append(&self.journal, change)?;
            }
            written.journaled += 1;
            return Ok(None);
        }
        let mut table = current.clone();
        change.apply(&mut table);
        written.follows = Some(write_atomically(&self.path, &table)?);
        // The journal follows the file before: the next change starts it again, and read at
        // start it is set aside. Removed now, so no one takes it for changes not yet written.
        written.journaled = 0;
        if let Err(e) = std::fs::remove_file(&self.journal)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(
                journal = %self.journal.display(),
                error = %e,
                "the overrides journal could not be removed after the table was written whole; it follows the file before, so it is not read"
            );
        }
        Ok(Some(table))
    }
}

/// Whether reading the files may mend them (the limiterd that keeps them) or only reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reading {
    /// A last line cut short is cut off, and a journal that follows another file moved aside.
    Mending,
    /// Nothing is written.
    Only,
}

/// The table the file at `path` and its journal hold, the file's fingerprint (`None`: there
/// is no file) and how many changes the journal holds.
fn read(path: &Path, reading: Reading) -> Result<(Table, Option<String>, usize), String> {
    let (mut table, follows) = match std::fs::read(path) {
        // Strictly, as a request body: an object wherever one belongs.
        Ok(bytes) => (
            limiter_input::from_slice(&bytes)
                .map_err(|e| format!("{}: not an overrides file ({e})", path.display()))?,
            Some(fingerprint(&bytes)),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Table::new(), None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let journaled = replay(&journal_of(path), follows.as_deref(), &mut table, reading)?;
    Ok((table, follows, journaled))
}

/// Writes `table` to `path` atomically (a synced temporary file renamed over it): the file's
/// fingerprint.
fn write_atomically(path: &Path, table: &Table) -> Result<String, NotSaved> {
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
    std::fs::rename(&temporary, path).map_err(failed)?;
    Ok(fingerprint(&bytes))
}

/// The fingerprint of a table's file: 16 bytes of its SHA-256, in hex.
fn fingerprint(bytes: &[u8]) -> String {
    use sha2::Digest;
    let digest = sha2::Sha256::digest(bytes);
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// `FILE.journal`, beside `path`.
fn journal_of(path: &Path) -> PathBuf {
    let mut journal = path.to_owned().into_os_string();
    journal.push(".journal");
    PathBuf::from(journal)
}

/// A line of the journal: `value` as JSON, then a newline.
fn line(
    value: &impl Serialize,
    failed: impl Fn(std::io::Error) -> NotSaved,
) -> Result<Vec<u8>, NotSaved> {
    let mut line = serde_json::to_vec(value).map_err(|e| failed(e.into()))?;
    line.push(b'\n');
    Ok(line)
}

/// Starts `journal` again: its header (the file it `follows`), then `change`, synced.
fn start(journal: &Path, follows: &str, change: &Change) -> Result<(), NotSaved> {
    let failed = |e: std::io::Error| NotSaved::at(&journal.display().to_string(), e);
    let header = Header {
        follows: follows.to_owned(),
    };
    let mut lines = line(&header, failed)?;
    lines.extend(line(change, failed)?);
    let mut file = File::create(journal).map_err(failed)?;
    file.write_all(&lines).map_err(failed)?;
    file.sync_data().map_err(failed)
}

/// Appends `change` to `journal` as one line and syncs it; on failure cuts the file back to
/// where it was.
fn append(journal: &Path, change: &Change) -> Result<(), NotSaved> {
    let failed = |e: std::io::Error| NotSaved::at(&journal.display().to_string(), e);
    let line = line(change, failed)?;
    let mut file = OpenOptions::new()
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

/// Applies every change in `journal` to `table` (a missing journal holds none, and one that
/// follows another file than the one read, fingerprint `follows`, none: set aside when
/// `reading` mends); how many.
fn replay(
    journal: &Path,
    follows: Option<&str>,
    table: &mut Table,
    reading: Reading,
) -> Result<usize, String> {
    let bytes = match std::fs::read(journal) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(format!("{}: {e}", journal.display())),
    };
    let mut applied = 0;
    let mut at = 0;
    for (number, line) in (1..).zip(bytes.split_inclusive(|b| *b == b'\n')) {
        if !line.ends_with(b"\n") {
            // The last line, cut short: a crash in the middle of a write, never saved (or,
            // read only, a line being written now).
            if reading == Reading::Mending {
                cut_short(journal, at as u64, number);
            }
            break;
        }
        let broken = |e: &dyn std::fmt::Display| {
            format!(
                "{}: line {number} is not an overrides journal's ({e}); limiterd writes this file: restore it, or remove it to drop the changes since the overrides file was last written",
                journal.display()
            )
        };
        if number == 1 {
            let header: Header = limiter_input::from_slice(line).map_err(|e| broken(&e))?;
            if Some(header.follows.as_str()) != follows {
                if reading == Reading::Mending {
                    set_aside(journal);
                }
                return Ok(0);
            }
        } else {
            let change: Change = limiter_input::from_slice(line).map_err(|e| broken(&e))?;
            change.apply(table);
            applied += 1;
        }
        at += line.len();
    }
    Ok(applied)
}

/// Moves aside a journal written after another version of the overrides file (the file was
/// replaced since: by an operator, or by limiterd folding it in before a crash), with a
/// warning: its changes do not apply to this file.
fn set_aside(journal: &Path) {
    let mut aside = journal.to_owned().into_os_string();
    aside.push(".stale");
    let aside = PathBuf::from(aside);
    tracing::warn!(
        journal = %journal.display(),
        aside = %aside.display(),
        "the overrides journal follows another version of the overrides file (replaced since it was written): its changes are not applied, and it is kept aside"
    );
    if let Err(e) = std::fs::rename(journal, &aside) {
        tracing::warn!(journal = %journal.display(), error = %e, "the stale overrides journal could not be moved aside; the next change starts it again");
    }
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
