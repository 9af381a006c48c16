//! A YAML document as a small tree whose every node remembers its line and column, so that the
//! descriptor loader can say where a wrong value is. Built from `saphyr-parser`'s events.
//!
//! Only what a rate-limit file needs: one document of mappings, sequences and scalars. Aliases
//! are expanded (within a node budget, so a file of nested aliases cannot grow without bound),
//! tags are refused, and nesting is bounded.

use std::collections::HashMap;

use saphyr_parser::{Event, Parser, ScalarStyle, Span};

/// Nesting deeper than this is refused.
pub const MAX_DEPTH: usize = 160;
/// Nodes in a document, aliases expanded, beyond which it is refused.
pub const MAX_NODES: usize = 100_000;

/// Where a node starts: 1-based line and column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mark {
    /// The line, from 1.
    pub line: usize,
    /// The column, from 1.
    pub column: usize,
}

impl Mark {
    fn of(span: Span) -> Self {
        Self {
            line: span.start.line(),
            column: span.start.col() + 1,
        }
    }
}

/// A scalar, sequence or mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// Text; `plain` when it was not quoted (so `10`, `true` or `~` may be a number, a boolean
    /// or nothing).
    Scalar {
        /// The text.
        text: String,
        /// Unquoted.
        plain: bool,
    },
    /// `- a`
    Sequence(Vec<Node>),
    /// `key: value`, in the file's order.
    Mapping(Vec<(Node, Node)>),
}

/// A value and where it starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// The value.
    pub value: Value,
    /// Where it starts.
    pub mark: Mark,
}

impl Node {
    /// Whether this is an empty or `null` plain scalar (YAML's "nothing").
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true } if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// What kind of value this is, for messages.
    pub fn describe(&self) -> &'static str {
        match &self.value {
            _ if self.is_null() => "nothing",
            Value::Scalar { .. } => "a scalar",
            Value::Sequence(_) => "a list",
            Value::Mapping(_) => "a mapping",
        }
    }
}

/// A file that is not well-formed YAML, or not one this loader reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct YamlError {
    /// Where.
    pub mark: Mark,
    /// What.
    pub message: String,
}

/// Parses the one document in `text`; `Ok(None)` for a file with no document.
pub fn parse(text: &str) -> Result<Option<Node>, YamlError> {
    let mut builder = Builder {
        parser: Parser::new_from_str(text),
        anchors: HashMap::new(),
        nodes: 0,
        last: Mark::default(),
        lines: line_count(text),
    };
    builder.document()
}

/// Lines in `text` as YAML counts them: `\r\n`, `\r` and `\n` each end one.
pub fn line_count(text: &str) -> usize {
    text.replace("\r\n", "\n").matches(['\r', '\n']).count() + 1
}

struct Builder<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    anchors: HashMap<usize, Node>,
    nodes: usize,
    last: Mark,
    /// Lines in the text: the scanner may place an error or an empty node at the end of the
    /// input one line past the last.
    lines: usize,
}

impl<'a> Builder<'a> {
    fn next(&mut self) -> Result<(Event<'a>, Mark), YamlError> {
        match self.parser.next_event() {
            Some(Ok((event, span))) => {
                let mut mark = Mark::of(span);
                // An empty node at the end of the input (`?` with no key) may be placed a line
                // past the last.
                mark.line = mark.line.clamp(1, self.lines);
                self.last = mark;
                Ok((event, mark))
            }
            Some(Err(e)) => Err(YamlError {
                mark: Mark {
                    line: e.marker().line().clamp(1, self.lines),
                    column: e.marker().col() + 1,
                },
                message: format!("not valid YAML: {}", e.info()),
            }),
            None => Err(self.error(self.last, "the file ends early")),
        }
    }

    fn error(&self, mark: Mark, message: impl Into<String>) -> YamlError {
        YamlError {
            mark,
            message: message.into(),
        }
    }

    fn document(&mut self) -> Result<Option<Node>, YamlError> {
        let mut root = None;
        loop {
            let (event, mark) = self.next()?;
            match event {
                Event::StreamStart | Event::DocumentEnd | Event::Nothing => {}
                Event::StreamEnd => return Ok(root),
                Event::DocumentStart(_) if root.is_some() => {
                    return Err(self.error(
                        mark,
                        "a second YAML document (`---`): put one domain in each file",
                    ));
                }
                Event::DocumentStart(_) => {
                    let (event, mark) = self.next()?;
                    root = Some(self.node(event, mark, 0)?);
                }
                other => {
                    return Err(self.error(mark, format!("unexpected YAML event {other:?}")));
                }
            }
        }
    }

    fn untagged<T>(&self, tag: Option<&T>, mark: Mark) -> Result<(), YamlError> {
        match tag {
            Some(_) => Err(self.error(mark, "YAML tags (`!name`) are not read here: remove it")),
            None => Ok(()),
        }
    }

    fn count(&mut self, mark: Mark, nodes: usize) -> Result<(), YamlError> {
        self.nodes = self.nodes.saturating_add(nodes);
        if self.nodes > MAX_NODES {
            return Err(self.error(
                mark,
                format!("the document holds more than {MAX_NODES} values (aliases expanded)"),
            ));
        }
        Ok(())
    }

    fn node(&mut self, event: Event<'a>, mark: Mark, depth: usize) -> Result<Node, YamlError> {
        if depth > MAX_DEPTH {
            return Err(self.error(mark, format!("nested deeper than {MAX_DEPTH} levels")));
        }
        self.count(mark, 1)?;
        let (node, anchor) = match event {
            Event::Scalar(text, style, anchor, tag) => {
                self.untagged(tag.as_ref(), mark)?;
                let value = Value::Scalar {
                    text: text.into_owned(),
                    plain: style == ScalarStyle::Plain,
                };
                (Node { value, mark }, anchor)
            }
            Event::SequenceStart(anchor, tag) => {
                self.untagged(tag.as_ref(), mark)?;
                let mut items = Vec::new();
                loop {
                    let (event, item_mark) = self.next()?;
                    if let Event::SequenceEnd = event {
                        break;
                    }
                    items.push(self.node(event, item_mark, depth + 1)?);
                }
                let value = Value::Sequence(items);
                (Node { value, mark }, anchor)
            }
            Event::MappingStart(anchor, tag) => {
                self.untagged(tag.as_ref(), mark)?;
                let mut entries = Vec::new();
                loop {
                    let (event, key_mark) = self.next()?;
                    if let Event::MappingEnd = event {
                        break;
                    }
                    let key = self.node(event, key_mark, depth + 1)?;
                    let (event, value_mark) = self.next()?;
                    let value = self.node(event, value_mark, depth + 1)?;
                    entries.push((key, value));
                }
                let value = Value::Mapping(entries);
                (Node { value, mark }, anchor)
            }
            Event::Alias(id) => {
                let Some(target) = self.anchors.get(&id).cloned() else {
                    return Err(self.error(mark, "an alias (`*name`) to no anchor"));
                };
                let size = size(&target);
                self.count(mark, size)?;
                return Ok(Node {
                    value: target.value,
                    mark,
                });
            }
            other => return Err(self.error(mark, format!("unexpected YAML event {other:?}"))),
        };
        if anchor != 0 {
            self.anchors.insert(anchor, node.clone());
        }
        Ok(node)
    }
}

fn size(node: &Node) -> usize {
    1 + match &node.value {
        Value::Scalar { .. } => 0,
        Value::Sequence(items) => items.iter().map(size).sum(),
        Value::Mapping(entries) => entries.iter().map(|(k, v)| size(k) + size(v)).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(node: &Node) -> (&str, Mark) {
        match &node.value {
            Value::Scalar { text, .. } => (text, node.mark),
            other => panic!("not a scalar: {other:?}"),
        }
    }

    #[test]
    fn nodes_carry_their_lines_and_columns() {
        let root = parse("domain: web\ndescriptors:\n  - key: ip\n    value: \"10\"\n")
            .expect("valid")
            .expect("a document");
        let Value::Mapping(entries) = &root.value else {
            panic!("a mapping")
        };
        assert_eq!(scalar(&entries[0].1), ("web", Mark { line: 1, column: 9 }));
        let Value::Sequence(items) = &entries[1].1.value else {
            panic!("a list")
        };
        let Value::Mapping(descriptor) = &items[0].value else {
            panic!("a mapping")
        };
        assert_eq!(
            scalar(&descriptor[0].1),
            (
                "ip",
                Mark {
                    line: 3,
                    column: 10
                }
            )
        );
        assert_eq!(
            descriptor[1].1.value,
            Value::Scalar {
                text: "10".into(),
                plain: false
            }
        );
        assert_eq!(
            descriptor[1].1.mark,
            Mark {
                line: 4,
                column: 12
            }
        );
    }

    #[test]
    fn aliases_expand_within_a_budget_and_junk_is_located() {
        let root = parse("a: &x {k: v}\nb: *x\n").expect("valid").expect("doc");
        let Value::Mapping(entries) = &root.value else {
            panic!()
        };
        assert_eq!(entries[0].1.value, entries[1].1.value);
        assert_eq!(entries[1].1.mark.line, 2);

        // Each level doubles: 2^30 nodes if expanded naively.
        let mut bomb = String::from("a0: &a0 [x, x]\n");
        for i in 1..30 {
            bomb.push_str(&format!("a{i}: &a{i} [*a{}, *a{}]\n", i - 1, i - 1));
        }
        let err = parse(&bomb).expect_err("too large");
        assert!(err.message.contains("more than"), "{err:?}");

        let err = parse("a: [1, 2\nb: 3\n").expect_err("unclosed");
        assert!(err.message.starts_with("not valid YAML"), "{err:?}");
        assert!(err.mark.line >= 1);

        let err = parse("a: 1\n---\nb: 2\n").expect_err("two documents");
        assert_eq!(err.mark.line, 2, "{err:?}");

        let deep = "[".repeat(MAX_DEPTH + 2) + &"]".repeat(MAX_DEPTH + 2);
        assert!(parse(&deep).expect_err("deep").message.contains("nested"));
        assert_eq!(parse("# nothing\n").expect("valid"), None);
        for tagged in ["a: !x 1\n", "a: !x [1]\n", "a: !x {b: 1}\n"] {
            let err = parse(tagged).expect_err(tagged);
            assert!(err.message.contains("tags"), "{err:?}");
            assert_eq!(err.mark.line, 1);
        }
    }
}
