//! The architecture invariants a text search can check (ARCHITECTURE.md, "Architecture
//! invariants"): which library files may use std's atomics, read wall time, spawn or sleep;
//! and that no crate's modules import each other in a circle.
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
            "crates/limiter-redis/src/lease/",
            "crates/limiter-store/src/bounded.rs",
            "crates/limiter-stack/src/stack/mod.rs",
            "crates/limiterd/src/metrics.rs",
            "crates/limiterd/src/live.rs",
        ],
        invariant: "decision atomics come from the crate's sync.rs (so loom can swap them); std atomics only for statistics and ids",
    },
    Rule {
        patterns: &["Instant::now", "SystemTime::now"],
        allowed: &[
            "crates/limiter-core/src/clock.rs",
            "crates/limiterd/src/api.rs",
            "crates/limiterd/src/grpc.rs",
            "crates/limiterd/src/metrics.rs",
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
            "crates/limiter-redis/src/lease/",
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
    let crates = std::fs::read_dir(root.join("crates")).map_err(|e| format!("crates/: {e}"))?;
    let mut dirs: Vec<PathBuf> = crates.flatten().map(|e| e.path().join("src")).collect();
    dirs.sort();
    for src in dirs {
        if let Some(cycle) = import_cycle(&src) {
            let name = src
                .parent()
                .and_then(Path::file_name)
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            violations.push(format!(
                "{name}: modules import each other ({}): imports point one way, from the adapters down to the core",
                cycle.join(" -> ")
            ));
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

/// A cycle among the top-level modules of the crate whose sources are in `src`, through the
/// `crate::module` paths its code (not its comments) names, if there is one.
fn import_cycle(src: &Path) -> Option<Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let relative = file
            .strip_prefix(src)
            .ok()?
            .to_string_lossy()
            .replace('\\', "/");
        let module = relative
            .split('/')
            .next()?
            .trim_end_matches(".rs")
            .to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(file).ok()?;
        let edges = graph.entry(module.clone()).or_default();
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for (at, _) in line.match_indices("crate::") {
                let name: String = line[at + 7..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    edges.insert(name);
                }
            }
        }
    }
    // Depth-first search with the path kept, so a back edge names the whole cycle.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, &graph, &mut Vec::new(), &mut done) {
            return Some(cycle);
        }
    }
    None
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
        assert!(allowed(&RULES[2], "crates/limiterd/src/grpc.rs"));
        assert!(!allowed(&RULES[2], "crates/limiter-redis/src/backend.rs"));
    }

    #[test]
    fn an_import_cycle_is_named() {
        let root = std::env::temp_dir().join(format!("xtask-cycle-{}", std::process::id()));
        let src = root.join("src");
        std::fs::create_dir_all(src.join("envoy")).unwrap();
        std::fs::write(src.join("lib.rs"), "mod api; mod envoy; mod engine;\n").unwrap();
        std::fs::write(
            src.join("engine.rs"),
            "//! uses crate::api in a comment only\n",
        )
        .unwrap();
        std::fs::write(src.join("api.rs"), "use crate::envoy::Grpc;\n").unwrap();
        std::fs::write(src.join("envoy/grpc.rs"), "use crate::api::State;\n").unwrap();
        let cycle = import_cycle(&src);
        std::fs::write(src.join("envoy/grpc.rs"), "use crate::engine::Engine;\n").unwrap();
        let fixed = import_cycle(&src);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(
            cycle,
            Some(vec!["api".into(), "envoy".into(), "api".into()])
        );
        assert_eq!(fixed, None);
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
