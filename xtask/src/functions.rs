//! The function-length invariant (ARCHITECTURE.md, "Invariants"): a library function, from its
//! `fn` to its closing brace, is at most 80 lines, outside tests (`#[cfg(test)]` modules, the
//! `tests/` directories and the unpublished testkit). The source is read as tokens, not as
//! text: comments, strings (raw ones included) and character literals are blanked first, so a
//! brace inside one never counts. Run by `cargo xtask lint` and `cargo xtask ci`.

use std::path::{Path, PathBuf};

/// The longest a library function may be, in lines.
const MAX_LINES: usize = 80;

/// Functions allowed past the limit, each with the reason it reads best whole. Keep it short.
const EXCEPTIONS: &[(&str, &str, &str)] = &[];

/// Every library function longer than `MAX_LINES`, named with its file and line.
pub(crate) fn check(root: &Path) -> Result<(), String> {
    let mut files = Vec::new();
    let crates = root.join("crates");
    let entries = std::fs::read_dir(&crates).map_err(|e| format!("{}: {e}", crates.display()))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name != "limiter-testkit" {
            collect(&entry.path().join("src"), &mut files);
        }
    }
    files.sort();
    let mut problems = Vec::new();
    let checked = files.len();
    for file in files {
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let relative = file
            .strip_prefix(root)
            .unwrap_or(&file)
            .to_string_lossy()
            .replace('\\', "/");
        for long in long_functions(&text) {
            let excepted = EXCEPTIONS
                .iter()
                .any(|(path, name, _)| *path == relative && *name == long.name);
            if !excepted {
                problems.push(format!(
                    "{relative}:{}: fn {} is {} lines, more than {MAX_LINES}; give its parts functions of their own",
                    long.line, long.name, long.lines
                ));
            }
        }
    }
    if problems.is_empty() {
        eprintln!("xtask: no library function over {MAX_LINES} lines in {checked} files");
        Ok(())
    } else {
        Err(format!(
            "function-length invariant:\n  {}",
            problems.join("\n  ")
        ))
    }
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name != "tests") {
                collect(&path, out);
            }
        } else if path.extension().is_some_and(|ext| ext == "rs")
            && path.file_name().is_some_and(|name| name != "tests.rs")
        {
            out.push(path);
        }
    }
}

/// A function over the limit.
#[derive(Debug, PartialEq)]
struct LongFunction {
    name: String,
    /// 1-based line of its `fn`.
    line: usize,
    lines: usize,
}

/// The functions of `source` longer than `MAX_LINES`, outside `#[cfg(test)]` modules.
fn long_functions(source: &str) -> Vec<LongFunction> {
    let code = blank_literals(source);
    let bytes = code.as_bytes();
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    let mut at = 0;
    while let Some(offset) = code[at..].find(['f', '#']) {
        let start = at + offset;
        at = start + 1;
        if code[start..].starts_with("#[cfg(test)]") {
            // Skip the test module (or item) that follows, whole.
            if let Some(end) = item_end(bytes, start + "#[cfg(test)]".len()) {
                at = end;
            }
            continue;
        }
        if !is_keyword(bytes, start, "fn") {
            continue;
        }
        let name: String = code[start + 2..]
            .trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue; // `fn(..)` pointer types
        }
        let Some(end) = item_end(bytes, start) else {
            continue;
        };
        let lines = line_of(end) - line_of(start) + 1;
        if lines > MAX_LINES {
            found.push(LongFunction {
                name,
                line: line_of(start),
                lines,
            });
        }
    }
    found
}

/// Whether `word` stands alone at `at` (not part of a longer identifier).
fn is_keyword(bytes: &[u8], at: usize, word: &str) -> bool {
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    bytes[at..].starts_with(word.as_bytes())
        && (at == 0 || !ident(bytes[at - 1]))
        && bytes.get(at + word.len()).is_none_or(|b| !ident(*b))
}

/// The offset of the `}` that closes the first body after `from`, or `None` when a `;` ends
/// the item first (a declaration without a body).
fn item_end(bytes: &[u8], from: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut parens = 0usize;
    for (i, &b) in bytes.iter().enumerate().skip(from) {
        match b {
            b'(' | b'[' => parens += 1,
            b')' | b']' => parens = parens.saturating_sub(1),
            b';' if depth == 0 && parens == 0 => return None,
            b'{' => depth += 1,
            b'}' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// `source` with every comment, string and character literal replaced by spaces (newlines
/// kept, so offsets and lines stay where they were).
fn blank_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < chars.len() {
        let rest = &chars[i..];
        let skip = if rest.starts_with(&['/', '/']) {
            rest.iter().position(|c| *c == '\n').unwrap_or(rest.len())
        } else if rest.starts_with(&['/', '*']) {
            block_comment_len(rest)
        } else if let Some(len) = raw_string_len(rest) {
            len
        } else if rest[0] == '"' || (rest[0] == 'b' && rest.get(1) == Some(&'"')) {
            quoted_len(rest, '"')
        } else if rest[0] == '\'' {
            char_literal_len(rest)
        } else {
            0
        };
        if skip == 0 {
            out.push(rest[0]);
            i += 1;
        } else {
            out.extend(rest[..skip.min(rest.len())].iter().map(|c| blank(*c)));
            i += skip;
        }
    }
    out
}

fn block_comment_len(rest: &[char]) -> usize {
    let mut depth = 0;
    let mut i = 0;
    while i + 1 < rest.len() {
        if rest[i] == '/' && rest[i + 1] == '*' {
            depth += 1;
            i += 2;
        } else if rest[i] == '*' && rest[i + 1] == '/' {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    rest.len()
}

/// `r"..."`, `r#"..."#`, `br"..."` and the like.
fn raw_string_len(rest: &[char]) -> Option<usize> {
    let prefix = if rest.starts_with(&['b', 'r']) {
        2
    } else if rest[0] == 'r' {
        1
    } else {
        0
    };
    if prefix == 0 {
        return None;
    }
    let hashes = rest[prefix..].iter().take_while(|c| **c == '#').count();
    if rest.get(prefix + hashes) != Some(&'"') {
        return None;
    }
    let body = prefix + hashes + 1;
    let close: Vec<char> = std::iter::once('"')
        .chain(std::iter::repeat_n('#', hashes))
        .collect();
    let end = (body..rest.len()).find(|&i| rest[i..].starts_with(&close))?;
    Some(end + close.len())
}

/// A `"`-delimited literal (with escapes), starting at `rest[0]` or after a `b`.
fn quoted_len(rest: &[char], quote: char) -> usize {
    let open = rest.iter().position(|c| *c == quote).unwrap_or(0);
    let mut i = open + 1;
    while i < rest.len() {
        match rest[i] {
            '\\' => i += 2,
            c if c == quote => return i + 1,
            _ => i += 1,
        }
    }
    rest.len()
}

/// A character literal (`'a'`, `'\n'`, `'\u{1F600}'`), or 0 for a lifetime or label (`'a`).
fn char_literal_len(rest: &[char]) -> usize {
    match rest.get(1) {
        Some('\\') => quoted_len(rest, '\''),
        Some(_) if rest.get(2) == Some(&'\'') => 3,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn function(name: &str, body_lines: usize, body: &str) -> String {
        let mut text = format!("fn {name}() {{\n");
        for _ in 0..body_lines {
            text.push_str(body);
            text.push('\n');
        }
        text.push_str("}\n");
        text
    }

    #[test]
    fn a_function_over_the_limit_is_named_with_its_line() {
        let source = format!(
            "{}{}",
            function("short", 10, "    x();"),
            function("long", 85, "    x();")
        );
        assert_eq!(
            long_functions(&source),
            vec![LongFunction {
                name: "long".into(),
                line: 13,
                lines: 87
            }]
        );
    }

    #[test]
    fn braces_in_strings_comments_and_chars_do_not_count() {
        let body = "    let s = \"}\"; let c = '}'; let r = r#\"}\"#; // }\n    /* } */ let l: &'static str = s;";
        let source = function("tricky", 50, body);
        assert_eq!(long_functions(&source)[0].lines, 102);
    }

    #[test]
    fn test_modules_and_declarations_are_skipped() {
        let source = format!(
            "trait T {{ fn declared(&self); }}\n#[cfg(test)]\nmod tests {{\n{}}}\n",
            function("in_tests", 90, "    x();")
        );
        assert!(long_functions(&source).is_empty());
    }
}
