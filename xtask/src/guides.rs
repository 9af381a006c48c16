//! The documentation's invariants (ARCHITECTURE.md, "Invariants"): README.md stays a ten-minute
//! read (at most 300 lines); every guide in `docs/` with Rust examples is compiled as doctests
//! by the facade crate; and every relative link in README.md, ARCHITECTURE.md, CHANGELOG.md and
//! `docs/` names a file that exists and, with `#anchor`, a heading in it.
//! Run by `cargo xtask lint` and `cargo xtask ci` beside the code invariants.

use std::path::{Path, PathBuf};

/// README.md's longest: what it is, the two commands, one example each, the map of `docs/`.
const README_MAX_LINES: usize = 300;

/// Where the guides' Rust examples become doctests.
const DOCTEST_HOST: &str = "crates/limiter/src/lib.rs";

/// Every documentation invariant, each failure naming the file and what to change.
pub(crate) fn check(root: &Path) -> Result<(), String> {
    let mut problems = Vec::new();
    let readme = read(&root.join("README.md"))?;
    let lines = readme.lines().count();
    if lines > README_MAX_LINES {
        problems.push(format!(
            "README.md: {lines} lines, more than {README_MAX_LINES}; move the detail into a guide in docs/"
        ));
    }
    let host = read(&root.join(DOCTEST_HOST))?;
    let mut pages = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("CHANGELOG.md"),
    ];
    pages.extend(guides(root)?);
    for page in &pages {
        let text = read(page)?;
        let name = relative(root, page);
        if text.contains("```rust") && !host.contains(&format!("include_str!(\"../../../{name}\")"))
        {
            problems.push(format!(
                "{name} has Rust examples that no doctest compiles; include it in {DOCTEST_HOST}'s guides"
            ));
        }
        for target in relative_links(&text) {
            if let Err(why) = link_resolves(page, &target) {
                problems.push(format!("{name}: link `{target}`: {why}"));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "documentation invariants:\n  {}",
            problems.join("\n  ")
        ))
    }
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

/// The markdown files in `docs/`, sorted.
fn guides(root: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = root.join("docs");
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    found.sort();
    Ok(found)
}

/// The targets of `[text](target)` links outside code blocks that are not web addresses.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    for line in prose_lines(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            if !target.contains("://") && !target.starts_with("mailto:") && !target.is_empty() {
                links.push(target.to_owned());
            }
            rest = &after[end..];
        }
    }
    links
}

/// `Ok` when `target` (a path relative to `page`, an `#anchor`, or both) exists.
fn link_resolves(page: &Path, target: &str) -> Result<(), String> {
    let (file, anchor) = match target.split_once('#') {
        Some((file, anchor)) => (file, Some(anchor)),
        None => (target, None),
    };
    let file = if file.is_empty() {
        page.to_path_buf()
    } else {
        page.parent().unwrap_or(Path::new(".")).join(file)
    };
    if !file.exists() {
        return Err(format!("{} does not exist", file.display()));
    }
    let Some(anchor) = anchor else { return Ok(()) };
    let text = read(&file)?;
    if headings(&text)
        .iter()
        .any(|heading| slug(heading) == anchor)
    {
        Ok(())
    } else {
        Err(format!(
            "no heading of {} has the anchor `#{anchor}`",
            file.display()
        ))
    }
}

/// The markdown headings outside code blocks, without their `#`s.
fn headings(text: &str) -> Vec<String> {
    prose_lines(text)
        .filter(|line| line.starts_with('#'))
        .map(|line| line.trim_start_matches('#').trim().to_owned())
        .collect()
}

/// The lines of `text` outside fenced code blocks (fences excluded).
fn prose_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut in_code = false;
    text.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            return false;
        }
        !in_code
    })
}

/// A heading's anchor as GitHub writes it: lower case, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slugs_are_githubs() {
        assert_eq!(slug("Connecting to your Redis"), "connecting-to-your-redis");
        assert_eq!(
            slug("Behind HTTP: tower, axum, tonic"),
            "behind-http-tower-axum-tonic"
        );
        assert_eq!(slug("On Redis, for a fleet"), "on-redis-for-a-fleet");
    }

    #[test]
    fn links_in_code_blocks_and_web_addresses_are_not_checked() {
        let text = "see [a](b.md#c) and [d](https://x.org)\n```\n[e](f.md)\n```\n[g](#h)";
        assert_eq!(relative_links(text), vec!["b.md#c", "#h"]);
    }
}
