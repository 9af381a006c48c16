//! Tests of `overrides.rs`.

use super::*;
use crate::engine::decided_at_once as now;

const MAX: usize = 10;

/// An override set for a pattern applies to the identifiers it matches (`*` any run of
/// characters) and to no other.
#[test]
fn patterns_match_any_run_of_characters() {
    for (pattern, text, want) in [
        ("user_*", "user_1", true),
        ("user_*", "user_", true),
        ("user_*", "admin_1", false),
        ("*@acme.com", "ada@acme.com", true),
        ("*@acme.com", "ada@acme.co", false),
        ("a*b*c", "axxbyyc", true),
        ("a*b*c", "acb", false),
        ("ab*ba", "aba", false),
        ("exact", "exact", true),
    ] {
        let o = Overrides::in_memory();
        now(o.set("api", pattern, (1, 1_000), MAX)).unwrap();
        assert_eq!(o.find("api", text).is_some(), want, "{pattern} ~ {text}");
    }
}

#[test]
fn exact_beats_patterns_and_the_most_specific_pattern_wins() {
    let o = Overrides::in_memory();
    now(o.set("api", "*", (1, 1_000), MAX)).unwrap();
    now(o.set("api", "user_*", (2, 1_000), MAX)).unwrap();
    now(o.set("api", "*_vip", (3, 1_000), MAX)).unwrap();
    now(o.set("api", "user_ada", (4, 1_000), MAX)).unwrap();
    let limit = |id: &str| o.find("api", id).map(|o| o.limit);
    assert_eq!(limit("user_ada"), Some(4), "exact");
    assert_eq!(limit("user_bob"), Some(2), "5 literal characters beat 0");
    // `user_*` and `*_vip` both have 4 or 5 literals: `user_` (5) beats `_vip` (4).
    assert_eq!(limit("user_vip"), Some(2));
    assert_eq!(limit("cy_vip"), Some(3));
    assert_eq!(limit("cy"), Some(1));
    assert_eq!(o.find("web", "user_ada"), None, "per namespace");
    // Ties go to the smaller pattern text, whatever order they were set in.
    let t = Overrides::in_memory();
    now(t.set("n", "b*", (1, 1_000), MAX)).unwrap();
    now(t.set("n", "*b", (2, 1_000), MAX)).unwrap();
    assert_eq!(
        t.find("n", "bb").map(|o| o.identifier),
        Some("*b".to_owned())
    );
}

#[test]
fn ids_are_stable_pages_follow_cursors_and_namespaces_are_bounded() {
    let o = Overrides::in_memory();
    let id = now(o.set("api", "a", (1, 1_000), 3)).unwrap();
    assert_eq!(
        now(o.set("api", "a", (9, 2_000), 3)).unwrap(),
        id,
        "setting again keeps the id"
    );
    assert_eq!(o.get("api", "a").unwrap().limit, 9);
    assert_ne!(now(o.set("api", "b", (1, 1_000), 3)).unwrap(), id);
    now(o.set("api", "c", (1, 1_000), 3)).unwrap();
    assert!(matches!(
        now(o.set("api", "d", (1, 1_000), 3)),
        Err(OverrideError::Full { max: 3, .. })
    ));
    assert!(
        now(o.set("api", "c", (2, 1_000), 3)).is_ok(),
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
    now(o.delete("api", "b")).unwrap();
    assert!(matches!(
        now(o.delete("api", "b")),
        Err(OverrideError::NotFound { .. })
    ));
    assert!(matches!(
        o.get("api", "b"),
        Err(OverrideError::NotFound { .. })
    ));
}

/// Pages go on from their cursor, even one whose override was deleted since; together they
/// list every override once, in order.
#[test]
fn pages_go_on_from_a_cursor_deleted_since() {
    let o = Overrides::in_memory();
    for identifier in ["a", "b", "c", "d", "e"] {
        now(o.set("api", identifier, (1, 1_000), MAX)).unwrap();
    }
    let names = |page: &[Override]| {
        page.iter()
            .map(|o| o.identifier.clone())
            .collect::<Vec<_>>()
    };
    let (first, cursor) = o.list("api", None, 2);
    assert_eq!(
        (names(&first), cursor.as_deref()),
        (vec!["a".into(), "b".into()], Some("b"))
    );
    now(o.delete("api", "b")).unwrap();
    let (second, cursor) = o.list("api", cursor.as_deref(), 2);
    assert_eq!(
        (names(&second), cursor.as_deref()),
        (vec!["c".into(), "d".into()], Some("d"))
    );
    let (last, cursor) = o.list("api", cursor.as_deref(), 2);
    assert_eq!((names(&last), cursor), (vec!["e".to_owned()], None));
    assert_eq!(o.list("api", Some("zzz"), 2), (Vec::new(), None));
}

#[test]
fn a_file_keeps_them_across_a_restart() {
    let dir = std::env::temp_dir().join(format!("limiterd-overrides-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("overrides.json");
    let _ = std::fs::remove_file(&path);
    let o = Overrides::load(&path).unwrap();
    // The file is written off the async workers: a runtime runs it.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let id = runtime
        .block_on(o.set("api", "user_*", (5, 60_000), MAX))
        .unwrap();
    runtime
        .block_on(o.set("api", "gone", (1, 1_000), MAX))
        .unwrap();
    runtime.block_on(o.delete("api", "gone")).unwrap();
    drop(o);
    let again = Overrides::load(&path).unwrap();
    assert_eq!(
        again.find("api", "user_7").map(|o| (o.id, o.limit)),
        Some((id, 5))
    );
    assert!(again.get("api", "gone").is_err());
    std::fs::write(&path, "not json").unwrap();
    assert!(
        Overrides::load(&path)
            .unwrap_err()
            .contains("overrides.json")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A change being written to the overrides file (here, one whose journal is a FIFO nobody
/// reads yet, so the write waits) never holds up the copy decisions read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_never_waits_on_an_override_being_saved() {
    let dir = std::env::temp_dir().join(format!("limiterd-saving-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("overrides.json");
    let _ = std::fs::remove_file(&path);
    let o = std::sync::Arc::new(Overrides::load(&path).unwrap());
    o.set("api", "ada", (5, 1_000), MAX).await.unwrap();
    let fifo = dir.join("overrides.json.journal");
    let _ = std::fs::remove_file(&fifo);
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    // Should a read fail below, this reads the FIFO on the way out, so the write ends and
    // the runtime can stop (it waits for the blocked write).
    struct Unblock(Option<std::path::PathBuf>);
    impl Drop for Unblock {
        fn drop(&mut self) {
            if let Some(fifo) = self.0.take() {
                let _ = std::fs::read(fifo);
            }
        }
    }
    let mut unblock = Unblock(Some(fifo.clone()));
    let setting = tokio::spawn({
        let o = std::sync::Arc::clone(&o);
        async move { o.set("api", "bob", (7, 1_000), MAX).await }
    });
    // Meanwhile every read answers at once, from the copy before the change.
    for _ in 0..200 {
        let reading = tokio::task::spawn_blocking({
            let o = std::sync::Arc::clone(&o);
            move || (o.find("api", "ada").map(|x| x.limit), o.find("api", "bob"))
        });
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), reading)
            .await
            .expect("a read waited on the write")
            .unwrap();
        assert_eq!(read, (Some(5), None));
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    assert!(
        !setting.is_finished(),
        "the write waits for a reader of the FIFO"
    );
    unblock.0 = None;
    let reader = std::thread::spawn(move || std::fs::read(fifo));
    // A pipe cannot be synced: the save fails, and nothing changed.
    assert!(setting.await.unwrap().is_err());
    let _ = reader.join();
    assert!(o.find("api", "bob").is_none());
    let _ = std::fs::remove_dir_all(&dir);
}
