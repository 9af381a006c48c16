//! The architecture invariants a text search can check (ARCHITECTURE.md, "Architecture
//! invariants"): which library files may use std's atomics, read wall time, spawn or sleep.
//! Run by `cargo xtask lint` and `cargo xtask ci` before clippy. A new use elsewhere fails with
//! the file, the line and the invariant; if the use is right, add the file here and say why
//! in ARCHITECTURE.md.

use std::path::{Path, PathBuf};

struct Rule {
    /// What a line must contain to be checked.
    patterns: &'static [&'static str],
    /// Files (relative to the workspace root) allowed to contain it; a path ending in `/`
    /// allows a whole directory, a bare file name allows that name in any crate.
    allowed: &'static [&'static str],
    invariant: &'static str,
}

const RULES: &[Rule] = &[
    Rule {
        patterns: &["std::sync::atomic", "core::sync::atomic"],
        allowed: &[
            "sync.rs",
            "crates/limiter-core/src/wait.rs",
            "crates/limiter-redis/src/backend.rs",
            "crates/limiter-store/src/bounded.rs",
            "crates/limiter-stack/src/stack/mod.rs",
            "crates/limiterd/src/metrics.rs",
        ],
        invariant: "decision atomics come from the crate's sync.rs (so loom can swap them); std atomics only for statistics and ids",
    },
    Rule {
        patterns: &["Instant::now", "SystemTime::now"],
        allowed: &[
            "crates/limiter-core/src/clock.rs",
            "crates/limiterd/src/api.rs",
            "crates/limiterd/src/envoy/grpc.rs",
        ],
        invariant: "every decision reads time through a Clock; wall time only for reporting",
    },
    Rule {
        patterns: &[
            "thread::spawn",
            "thread::Builder",
            "thread::sleep",
            "time::sleep",
            "tokio::spawn",
        ],
        allowed: &[
            "crates/limiter-core/src/clock.rs",
            "crates/limiter/src/wait.rs",
            "crates/limiterd/src/",
        ],
        invariant: "library code spawns and sleeps only where a user asks it to",
    },
];

/// Checks every library source file under `crates/*/src` (the testkit is test support, not
/// library code) and returns every violation.
pub(crate) fn check(root: &Path) -> Result<(), String> {
    let mut files = Vec::new();
    let crates = std::fs::read_dir(root.join("crates")).map_err(|e| format!("crates/: {e}"))?;
    for entry in crates.flatten() {
        if entry.file_name() == "limiter-testkit" {
            continue;
        }
        collect_rs(&entry.path().join("src"), &mut files);
    }
    files.sort();
    let mut violations = Vec::new();
    for file in &files {
        let relative = file
            .strip_prefix(root)
            .unwrap_or(file)
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(file).map_err(|e| format!("{relative}: {e}"))?;
        for (number, line) in text.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            for rule in RULES {
                if rule.patterns.iter().any(|p| code.contains(p)) && !allowed(rule, &relative) {
                    violations.push(format!(
                        "{relative}:{}: `{}`: {}",
                        number + 1,
                        code.trim(),
                        rule.invariant
                    ));
                }
            }
        }
    }
    if violations.is_empty() {
        eprintln!("xtask: invariants hold in {} files", files.len());
        Ok(())
    } else {
        Err(format!(
            "architecture invariants broken:\n  {}",
            violations.join("\n  ")
        ))
    }
}

fn allowed(rule: &Rule, relative: &str) -> bool {
    rule.allowed.iter().any(|allowed| {
        if allowed.ends_with('/') {
            relative.starts_with(allowed)
        } else if allowed.contains('/') {
            relative == *allowed
        } else {
            relative.rsplit('/').next() == Some(*allowed)
        }
    })
}

fn collect_rs(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_rs(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_lists_match_files_directories_and_names() {
        let rule = &RULES[0];
        assert!(allowed(rule, "crates/limiter-core/src/sync.rs"));
        assert!(allowed(rule, "crates/limiter-store/src/bounded.rs"));
        assert!(!allowed(rule, "crates/limiter-store/src/sharded.rs"));
        assert!(allowed(&RULES[2], "crates/limiterd/src/envoy/grpc.rs"));
        assert!(!allowed(&RULES[2], "crates/limiter-redis/src/backend.rs"));
    }

    #[test]
    fn the_workspace_keeps_them() {
        check(&crate::run::root()).unwrap();
    }

    #[test]
    fn a_use_outside_its_files_is_reported_with_its_line() {
        let root = std::env::temp_dir().join(format!("xtask-invariants-{}", std::process::id()));
        let src = root.join("crates/limiter-store/src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(
            src.join("sharded.rs"),
            "//! doc\n// std::thread::spawn in a comment is fine\nfn f() { std::thread::spawn(|| ()); }\n",
        )
        .unwrap();
        let err = check(&root).unwrap_err();
        std::fs::remove_dir_all(&root).unwrap();
        assert!(
            err.contains("crates/limiter-store/src/sharded.rs:3:")
                && err.contains("spawns and sleeps"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 2, "{err}");
    }
}
