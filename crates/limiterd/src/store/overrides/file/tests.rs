//! Tests of `file.rs`: what is read back is what was written, through appends, the table
//! written whole, a crash between the two, and a journal cut short or broken.

use std::path::PathBuf;

use super::super::Override;
use super::*;

/// A scratch directory of its own, and the overrides file's path in it.
fn scratch(name: &str) -> (PathBuf, PathBuf) {
    let dir = std::env::temp_dir().join(format!("limiterd-journal-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let path = dir.join("overrides.json");
    (dir, path)
}

/// Setting `identifier` in `api` to `limit` (`None`: deleting it).
fn change(identifier: &str, limit: Option<u64>) -> Change {
    Change {
        namespace: "api".to_owned(),
        identifier: identifier.to_owned(),
        entry: limit.map(|limit| Override {
            id: format!("ovr_{identifier}"),
            identifier: identifier.to_owned(),
            limit,
            duration_ms: 1_000,
        }),
    }
}

/// Writes `change` through `file` to `table` as limiterd does: the table whole when handed
/// back, else the change made in the caller's copy. Whether the table was written whole.
fn write(file: &OverridesFile, table: &mut Table, change: &Change) -> bool {
    match file.write(table, change).expect("written") {
        Some(whole) => {
            *table = whole;
            true
        }
        None => {
            change.apply(table);
            false
        }
    }
}

fn lines(path: &Path) -> usize {
    std::fs::read(path).map_or(0, |b| b.iter().filter(|c| **c == b'\n').count())
}

/// The first change writes the table (there was none); the next ones are appended, one line
/// each, leaving the table's file as it was; once the journal holds `COMPACT_AFTER`, the next
/// writes the table whole and removes it. Read back at every step, the file and its journal
/// hold what the caller's copy holds.
#[test]
fn changes_are_appended_then_folded_into_the_table() {
    let (dir, path) = scratch("fold");
    let (file, mut table) = OverridesFile::load(&path).expect("no file is no overrides");
    assert!(write(&file, &mut table, &change("first", Some(1))));
    let first = std::fs::read(&path).expect("the table's file");
    for i in 0..COMPACT_AFTER {
        // Deletes among the sets, so a replay that ignored them would differ.
        let limit = (i % 3 != 2).then_some(i as u64 + 1);
        let whole = write(
            &file,
            &mut table,
            &change(&format!("user_{}", i % 50), limit),
        );
        assert!(!whole, "change {i} is appended");
        if i % 256 == 0 {
            assert_eq!(OverridesFile::load(&path).expect("read").1, table);
        }
    }
    assert_eq!(
        lines(&file.journal),
        1 + COMPACT_AFTER,
        "a header, then the changes"
    );
    assert_eq!(std::fs::read(&path).expect("table"), first, "untouched");
    assert_eq!(OverridesFile::load(&path).expect("read").1, table);

    assert!(write(&file, &mut table, &change("last", Some(7))));
    assert!(!file.journal.exists(), "folded into the table");
    assert_eq!(OverridesFile::load(&path).expect("read").1, table);
    // The next change starts the journal again.
    assert!(!write(&file, &mut table, &change("last", None)));
    assert_eq!(lines(&file.journal), 2);
    assert_eq!(OverridesFile::load(&path).expect("read").1, table);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A journal beside a file it does not follow is set aside, and the file read as it is: a
/// crash came after the table was written whole and before the journal was removed (its
/// changes in the table), or an operator provisioned the file anew (the journal's changes were
/// to the one before). The next change starts a journal that follows the file read.
#[test]
fn a_journal_that_follows_another_file_is_set_aside() {
    let (dir, path) = scratch("replaced");
    let (file, mut table) = OverridesFile::load(&path).expect("empty");
    write(&file, &mut table, &change("a", Some(1)));
    for c in [
        change("b", Some(2)),
        change("a", None),
        change("b", Some(3)),
    ] {
        write(&file, &mut table, &c);
    }
    let journal = std::fs::read(&file.journal).expect("journal");
    // Written whole (as limiterd folds the journal in), the journal left behind.
    write_atomically(&path, &table).expect("the table whole");
    std::fs::write(&file.journal, &journal).expect("left behind");
    // Read only, it is not applied, and left where it is.
    assert_eq!(OverridesFile::read_only(&path).expect("read"), table);
    assert!(file.journal.exists());
    assert_eq!(OverridesFile::load(&path).expect("read").1, table);
    let aside = dir.join("overrides.json.journal.stale");
    assert_eq!(std::fs::read(&aside).expect("set aside"), journal);
    assert!(!file.journal.exists());

    // Provisioned anew: `a` back, no `b`; the journal of before (which deletes `a` and sets
    // `b`) does not apply to it.
    let provisioned =
        r#"{"api": {"a": {"id": "ovr_a", "identifier": "a", "limit": 9, "duration_ms": 1000}}}"#;
    std::fs::write(&path, provisioned).expect("provisioned");
    std::fs::write(&file.journal, &journal).expect("the journal of before");
    let limits = |t: &Table| {
        t.values()
            .flatten()
            .map(|(k, o)| (k.clone(), o.limit))
            .collect::<Vec<_>>()
    };
    let (file, mut read) = OverridesFile::load(&path).expect("read");
    assert_eq!(limits(&read), [("a".to_owned(), 9)]);
    // The next changes follow the file read, and read back over it.
    assert!(!write(&file, &mut read, &change("c", Some(4))));
    assert!(!write(&file, &mut read, &change("a", None)));
    let (_, again) = OverridesFile::load(&path).expect("read");
    assert_eq!(limits(&again), [("c".to_owned(), 4)]);
    let on_disk = std::fs::read(&path).expect("file");
    assert_eq!(on_disk, provisioned.as_bytes(), "untouched");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A last line cut short (a crash mid-append) is dropped and cut from the file, so the next
/// append reads back; a broken line before the last is refused by its number.
#[test]
fn a_line_cut_short_is_dropped_and_a_broken_one_refused() {
    let (dir, path) = scratch("torn");
    let (file, mut table) = OverridesFile::load(&path).expect("empty");
    write(&file, &mut table, &change("a", Some(1)));
    write(&file, &mut table, &change("b", Some(2)));
    let whole = std::fs::read(&file.journal).expect("journal");
    let mut torn = whole.clone();
    torn.extend_from_slice(br#"{"namespace":"api","identifier":"c","ent"#);
    std::fs::write(&file.journal, &torn).expect("torn");
    // Read only (a check while limiterd writes): the line is not taken, nor cut off.
    assert_eq!(OverridesFile::read_only(&path).expect("read"), table);
    assert_eq!(std::fs::read(&file.journal).expect("untouched"), torn);
    let (file, mut read) = OverridesFile::load(&path).expect("a torn tail is dropped");
    assert_eq!(read, table);
    assert_eq!(std::fs::read(&file.journal).expect("cut"), whole);
    write(&file, &mut read, &change("c", Some(3)));
    assert_eq!(OverridesFile::load(&path).expect("read").1, read);

    // A whole line that is not a change, with lines after it: not a crash, refused. So is a
    // first line that names no file.
    let header_end = whole.iter().position(|b| *b == b'\n').expect("a header") + 1;
    let mut broken = whole[..header_end].to_vec();
    broken.extend_from_slice(b"{\"namespace\":\"api\"}\n");
    broken.extend_from_slice(&whole[header_end..]);
    std::fs::write(&file.journal, &broken).expect("broken");
    let refused = OverridesFile::load(&path).expect_err("broken");
    let wanted = "overrides.json.journal: line 2 is not an overrides journal's (missing field";
    assert!(refused.contains(wanted), "{refused}");
    std::fs::write(&file.journal, &whole[header_end..]).expect("no header");
    let refused = OverridesFile::load(&path).expect_err("no header");
    let wanted = "line 1 is not an overrides journal's";
    assert!(refused.contains(wanted), "{refused}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The file or its journal removed by hand while limiterd runs: the next change writes the
/// table whole, so what was only in the journal (or followed the removed file) is kept.
#[test]
fn a_file_or_journal_removed_under_it_is_written_whole_again() {
    let (dir, path) = scratch("removed");
    let (file, mut table) = OverridesFile::load(&path).expect("empty");
    write(&file, &mut table, &change("a", Some(1)));
    assert!(
        !write(&file, &mut table, &change("b", Some(2))),
        "journaled"
    );
    std::fs::remove_file(&file.journal).expect("removed");
    assert!(write(&file, &mut table, &change("c", Some(3))), "whole");
    assert_eq!(OverridesFile::load(&path).expect("read").1, table);
    assert!(
        !write(&file, &mut table, &change("d", Some(4))),
        "journaled"
    );
    std::fs::remove_file(&path).expect("removed");
    assert!(write(&file, &mut table, &change("e", Some(5))), "whole");
    assert_eq!(OverridesFile::load(&path).expect("read").1, table);
    assert_eq!(table["api"].len(), 5);
    let _ = std::fs::remove_dir_all(&dir);
}
