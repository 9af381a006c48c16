//! The architecture invariants a text search can check (ARCHITECTURE.md, "Invariants"):
//! which library files may use std's atomics, read wall time, spawn or sleep; that every
//! memory ordering carries a comment; that the files of limiter-redis, limiterd and the envoy
//! crate stay short; that limiterd's engine names no store crate and the envoy crate no
//! service; that nothing finds a limiter by downcast; that the shared errors are defined once;
//! and that no crate's modules import each other in a circle.
//! Run by `cargo xtask lint` and `cargo xtask ci` before clippy. A new use elsewhere fails with
//! the file, the line and the invariant; if the use is right, add the file here and say why
//! in ARCHITECTURE.md.

use std::path::{Path, PathBuf};

struct Rule {
    /// What a line must contain to be checked.
    patterns: &'static [&'static str],
    /// Where the rule applies (path prefixes); empty: every library file.
    scope: &'static [&'static str],
    /// Files (relative to the workspace root) allowed to contain it; a path ending in `/`
    /// allows a whole directory, a bare file name allows that name in any crate.
    allowed: &'static [&'static str],
    invariant: &'static str,
}

const RULES: &[Rule] = &[
    Rule {
        patterns: &["std::sync::atomic", "core::sync::atomic"],
        scope: &[],
        allowed: &[
            "sync.rs",
            "crates/limiter-core/src/wait.rs",
            "crates/limiter-redis/src/backend.rs",
            "crates/limiter-redis/src/connect/",
            "crates/limiter-redis/src/lease/",
            "crates/limiter-redis/src/permits.rs",
            "crates/limiter-redis/src/script/run.rs",
            "crates/limiter-redis/src/topology/",
            "crates/limiter-store/src/bounded.rs",
            "crates/limiter-stack/src/stack/builder.rs",
            "crates/limiterd/src/metrics/",
            "crates/limiterd/src/ops/live.rs",
            "crates/limiterd/src/shards.rs",
            "crates/limiterd/src/http/unkey/mod.rs",
            "crates/limiterd/src/store/permits.rs",
        ],
        invariant: "decision atomics come from the crate's sync.rs (so loom can swap them); std atomics only for statistics and ids",
    },
    Rule {
        patterns: &["Instant::now", "SystemTime::now"],
        scope: &[],
        allowed: &[
            "crates/limiter-core/src/clock.rs",
            "crates/limiterd/src/http/api.rs",
            "crates/limiterd/src/http/release.rs",
            "crates/limiterd/src/http/unkey/mod.rs",
            "crates/limiterd/src/grpc.rs",
            "crates/limiterd/src/metrics/",
        ],
        invariant: "every decision reads time through a Clock; wall time only for reporting",
    },
    Rule {
        scope: &[],
        patterns: &[
            "thread::spawn",
            "thread::Builder",
            "thread::sleep",
            "time::sleep",
            "tokio::spawn",
            ".spawn(",
        ],
        allowed: &[
            "crates/limiter-core/src/clock.rs",
            "crates/limiter/src/wait.rs",
            "crates/limiter-redis/src/task.rs",
            "crates/limiter-redis/src/lease/mod.rs",
            "crates/limiterd/src/",
        ],
        invariant: "library code spawns and sleeps only where a user asks it to (limiter-redis through its task::spawn)",
    },
    Rule {
        patterns: &["f64", "f32"],
        scope: &[
            "crates/limiter-core/",
            "crates/limiter-token-bucket/",
            "crates/limiter-sliding-window/",
            "crates/limiter-store/",
            "crates/limiter-stack/",
        ],
        allowed: &["crates/limiter-core/src/accuracy.rs"],
        invariant: "no float on a decision path (an accuracy is printed as a percentage, nothing more)",
    },
    Rule {
        patterns: &["TcpListener", "UdpSocket"],
        scope: &[],
        allowed: &["crates/limiterd/src/"],
        invariant: "limiterd is the only binary that listens",
    },
    Rule {
        patterns: &["limiter_redis::", "use limiter_redis", "limiter_redis;"],
        scope: &["crates/limiterd/src/"],
        allowed: &["crates/limiterd/src/store/mod.rs"],
        invariant: "limiterd takes its store crate's types through its store room's door (`store/mod.rs`) alone: what the service depends on of its store is one list",
    },
    Rule {
        patterns: &["crate::"],
        scope: &["crates/limiterd/src/store/"],
        allowed: &[],
        invariant: "limiterd's store room depends on no other module of the service (the configuration, the stacks and the engine build on it); inside it, `super::` names the door",
    },
    Rule {
        patterns: &["limiter_redis", "limiter-redis"],
        scope: &["crates/limiterd/src/engine/"],
        allowed: &[],
        invariant: "limiterd's engine decides through the seam (AsyncLimiter) and names no store crate; stores are built in limiterd's stacks module",
    },
    Rule {
        patterns: &["limiterd::", "limiterd ="],
        scope: &["crates/limiter-envoy/"],
        allowed: &[],
        invariant: "the envoy crate knows no service: it decides through its Decider trait, which limiterd implements",
    },
    Rule {
        patterns: &["as_any", "downcast"],
        scope: &[],
        allowed: &[],
        invariant: "nothing is read back by downcast: a capability is asked for by type (a batch in one Redis script takes its stacks typed, a refund takes the backend's own grant type), and a refused TLS certificate is explained from the check's own typed note",
    },
    Rule {
        patterns: &[
            "enum BuildError",
            "enum CallError",
            "enum RefundError",
            "struct BuildError",
            "struct CallError",
            "struct RefundError",
        ],
        scope: &[],
        allowed: &["crates/limiter-stack/src/error.rs"],
        invariant: "one error type per kind of failure shared by the backends: a stack that cannot be built, a call that can never be decided, a refused refund are limiter-stack's types, which every backend returns (a backend's own failure rides in RefundError's type parameter)",
    },
    Rule {
        patterns: &["enum Origin", "enum Source"],
        scope: &[],
        allowed: &["crates/limiter-stack/src/seam/mod.rs"],
        invariant: "one type says who decided a call, in every crate: limiter-stack's Origin (a Redis decision answers it, and a failure policy's answer is told by the Redis failure it carries)",
    },
    Rule {
        patterns: &["redis::"],
        scope: &[],
        allowed: &["crates/limiter-redis/src/"],
        invariant: "only limiter-redis opens connections to a store",
    },
];

/// What limiter-core may depend on (besides loom, for its models): it does no IO.
const CORE_DEPENDENCIES: &[&str] = &["thiserror", "crossbeam-utils", "quanta"];

/// What limiter-envoy may not depend on: it is a leaf of the core and the stack, knowing no
/// store and no service.
const ENVOY_FORBIDDEN: &[&str] = &["limiter-redis", "limiterd"];

/// limiter-core's `[dependencies]`, from its manifest.
fn core_dependencies(root: &Path) -> Result<Vec<String>, String> {
    dependencies(root, "crates/limiter-core/Cargo.toml")
}

/// The `[dependencies]` of the manifest at `relative` (none if it does not exist).
fn dependencies(root: &Path, relative: &str) -> Result<Vec<String>, String> {
    let manifest = root.join(relative);
    if !manifest.exists() {
        return Ok(Vec::new());
    }
    let text =
        std::fs::read_to_string(&manifest).map_err(|e| format!("{}: {e}", manifest.display()))?;
    let mut in_dependencies = false;
    let mut names = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
        } else if in_dependencies
            && let Some((name, _)) = line.split_once('=')
            && !line.starts_with('#')
        {
            // `name = ...` or `name.workspace = true`
            let name = name.trim();
            names.push(name.split('.').next().unwrap_or(name).to_owned());
        }
    }
    Ok(names)
}

/// The crates whose library files are kept short: at most [`MAX_LINES`] lines before their
/// tests (`#[cfg(test)]`), so each file keeps to one or two jobs.
const SHORT_FILES: &[&str] = &[
    "crates/limiter-redis/",
    "crates/limiterd/",
    "crates/limiter-envoy/",
];

/// The most lines a library file of [`SHORT_FILES`] holds before its tests.
const MAX_LINES: usize = 600;

/// How many lines above a memory ordering its comment may start.
const ORDERING_COMMENT_REACH: usize = 6;

/// Whether `code` names a memory ordering (not a `use`, not `cmp::Ordering`).
fn names_ordering(code: &str) -> bool {
    !code.starts_with("use ")
        && ["Relaxed", "Acquire", "Release", "AcqRel", "SeqCst"]
            .iter()
            .any(|o| code.contains(&format!("Ordering::{o}")))
}

/// Whether a comment in `context` (the lines up to and including `code`) explains the
/// ordering `code` names: it names that ordering (saying why it is enough) or what it pairs
/// with. Any comment is not enough: it must be about the ordering.
fn ordering_explained(code: &str, context: &[&str]) -> bool {
    let comments: Vec<&str> = context
        .iter()
        .filter_map(|line| line.split_once("//").map(|(_, comment)| comment))
        .collect();
    let named = ["Relaxed", "Acquire", "Release", "AcqRel", "SeqCst"]
        .into_iter()
        .filter(|o| code.contains(&format!("Ordering::{o}")));
    comments.iter().any(|c| c.contains("pairs with"))
        || named
            .into_iter()
            .any(|o| comments.iter().any(|c| c.contains(o)))
}

/// Whether `code` holds `pattern` not as the tail of a longer name (`redis::` is not in
/// `limiter_redis::`).
fn contains_word(code: &str, pattern: &str) -> bool {
    code.match_indices(pattern).any(|(at, _)| {
        !pattern.starts_with(|c: char| c.is_alphanumeric())
            || !code[..at]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

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
        let lines: Vec<&str> = text.lines().collect();
        let before_tests = lines
            .iter()
            .position(|l| l.trim() == "#[cfg(test)]")
            .unwrap_or(lines.len());
        if SHORT_FILES.iter().any(|c| relative.starts_with(c)) && before_tests > MAX_LINES {
            violations.push(format!(
                "{relative}: {before_tests} lines before its tests: at most {MAX_LINES}, one or two jobs per file (split it by job)"
            ));
        }
        for (number, line) in lines.iter().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            if number < before_tests && names_ordering(code) {
                let from = number.saturating_sub(ORDERING_COMMENT_REACH);
                if !ordering_explained(code, &lines[from..=number]) {
                    violations.push(format!(
                        "{relative}:{}: `{}`: every memory ordering carries a comment (within {ORDERING_COMMENT_REACH} lines above) that names it and says why (`Relaxed: a statistic`, `Acquire: pairs with ...`), or what it pairs with",
                        number + 1,
                        code.trim()
                    ));
                }
            }
            for rule in RULES {
                let in_scope =
                    rule.scope.is_empty() || rule.scope.iter().any(|c| relative.starts_with(c));
                if in_scope
                    && rule.patterns.iter().any(|p| contains_word(code, p))
                    && !allowed(rule, &relative)
                {
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
    for name in core_dependencies(root)? {
        if !CORE_DEPENDENCIES.contains(&name.as_str()) {
            violations.push(format!(
                "crates/limiter-core/Cargo.toml: depends on `{name}`: limiter-core does no IO and depends on {} only",
                CORE_DEPENDENCIES.join(", ")
            ));
        }
    }
    for name in dependencies(root, "crates/limiter-envoy/Cargo.toml")? {
        if ENVOY_FORBIDDEN.contains(&name.as_str()) {
            violations.push(format!(
                "crates/limiter-envoy/Cargo.toml: depends on `{name}`: limiter-envoy is a leaf of limiter-core and limiter-stack, knowing no store and no service"
            ));
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

/// The top-level names a path names after its root: `name` in `name::...`, or each name of a
/// group, `{a, b::c, d}` (nested groups belong to the names before them).
fn named_modules(rest: &str) -> Vec<String> {
    let ident = |text: &str| -> String {
        text.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let Some(group) = rest.strip_prefix('{') else {
        let name = ident(rest);
        return if name.is_empty() {
            Vec::new()
        } else {
            vec![name]
        };
    };
    let mut names = Vec::new();
    let mut depth = 0_usize;
    let mut expect_name = true;
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => expect_name = true,
            c if expect_name && depth == 0 && (c.is_alphanumeric() || c == '_') => {
                names.push(ident(&group[at..]));
                expect_name = false;
            }
            _ => {}
        }
    }
    names
}

/// What the crate root (`lib.rs`) re-exports, by name: the module each `pub use` takes it
/// from.
fn reexports(src: &Path) -> std::collections::BTreeMap<String, String> {
    let mut map = std::collections::BTreeMap::new();
    let Ok(text) = std::fs::read_to_string(src.join("lib.rs")) else {
        return map;
    };
    for statement in text.split(';') {
        let Some(path) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        let module = module.trim();
        if matches!(module, "crate" | "self" | "super") || module.contains(char::is_whitespace) {
            continue;
        }
        for name in rest
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .filter(|n| !n.is_empty() && *n != "self")
        {
            map.insert(name.to_owned(), module.to_owned());
        }
    }
    map
}

/// A cycle among the top-level modules of the crate whose sources are in `src`, through the
/// paths its code (not its comments) names from the crate root (`crate::module`, grouped
/// `crate::{a, b}`, and `super::` in a top-level module's own file), if there is one.
fn import_cycle(src: &Path) -> Option<Vec<String>> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut files = Vec::new();
    collect_rs(src, &mut files);
    let reexported = reexports(src);
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
        // In a top-level module's own file, `super::` is the crate.
        let top = !relative.contains('/')
            || relative.ends_with("/mod.rs") && relative.matches('/').count() == 1;
        let code: String = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        let edges = graph.entry(module.clone()).or_default();
        let mut roots = vec!["crate::"];
        if top {
            roots.push("super::");
        }
        for root in roots {
            for (at, _) in code.match_indices(root) {
                // `super::super::` or `self::super::` are not the crate.
                if root == "super::" && code[..at].ends_with("::") {
                    continue;
                }
                for name in named_modules(&code[at + root.len()..]) {
                    // A name the crate root re-exports is its module's.
                    let name = reexported.get(&name).cloned().unwrap_or(name);
                    if name != module && name != "super" && name != "self" {
                        edges.insert(name);
                    }
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
    fn orderings_names_and_long_files_are_found() {
        assert!(names_ordering("x.load(Ordering::Relaxed);"));
        let line = "x.load(Ordering::Relaxed);";
        assert!(ordering_explained(
            line,
            &["// Relaxed: a statistic.", line]
        ));
        assert!(ordering_explained(
            line,
            &["// pairs with the store in `f`", line]
        ));
        assert!(!ordering_explained(line, &["// the value we want", line]));
        assert!(!ordering_explained(
            "x.load(Ordering::Acquire);",
            &["// Relaxed: elsewhere", "x.load(Ordering::Acquire);"]
        ));
        assert!(names_ordering(
            ".fetch_update(StdOrdering::AcqRel, StdOrdering::Acquire, f)"
        ));
        assert!(!names_ordering(
            "use std::sync::atomic::{AtomicU64, Ordering};"
        ));
        assert!(!names_ordering("core::cmp::Ordering::Less => 1,"));
        assert!(contains_word("use redis::Value;", "redis::"));
        assert!(contains_word("(redis::cmd(\"GET\"))", "redis::"));
        assert!(!contains_word("use limiter_redis::Kind;", "redis::"));
        assert!(contains_word("x.spawn(f)", ".spawn("));
        assert_eq!(named_modules("lease::{Lease, Slack};"), ["lease"]);
        assert_eq!(
            named_modules("{backend::Sent, seam::{A, B}, error};"),
            ["backend", "seam", "error"]
        );

        let root = std::env::temp_dir().join(format!("xtask-rules-{}", std::process::id()));
        let src = root.join("crates/limiter-redis/src");
        std::fs::create_dir_all(&src).unwrap();
        let core = root.join("crates/limiter-core");
        std::fs::create_dir_all(core.join("src")).unwrap();
        std::fs::write(
            core.join("Cargo.toml"),
            "[dependencies]\nthiserror.workspace = true\ntokio = \"1\"\n[dev-dependencies]\nproptest = \"1\"\n",
        )
        .unwrap();
        let long: String = (0..650).map(|i| format!("// line {i}\n")).collect();
        std::fs::write(src.join("long.rs"), long).unwrap();
        std::fs::write(
            src.join("lib.rs"),
            "fn f(a: &AtomicU64) {\n    a.load(Ordering::Relaxed);\n}\n",
        )
        .unwrap();
        let error = check(&root).unwrap_err();
        std::fs::remove_dir_all(&root).unwrap();
        assert!(
            error.contains("long.rs: 650 lines before its tests"),
            "{error}"
        );
        assert!(
            error.contains("lib.rs:2: `a.load(Ordering::Relaxed);`: every memory ordering"),
            "{error}"
        );
        assert!(error.contains("depends on `tokio`"), "{error}");
        assert!(
            !error.contains("`thiserror`") && !error.contains("proptest"),
            "{error}"
        );
    }

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
