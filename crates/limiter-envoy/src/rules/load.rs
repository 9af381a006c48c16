//! Reading a descriptor file into the model: every field checked where it is, each error
//! naming the file, line and column, the field and the fix; fields the reference ignores
//! where they mean nothing are warnings.

use std::collections::HashMap;

use crate::yaml::{self, Node, Value};

use super::*;

/// The fields envoy's reference server accepts anywhere in a descriptor file (it checks every
/// key against one list, whatever the level): one written where it means nothing (`unit` beside
/// `key`) is ignored there, with a warning, as the reference ignores it.
const REFERENCE_FIELDS: &[&str] = &[
    "domain",
    "key",
    "value",
    "descriptors",
    "rate_limit",
    "unit",
    "requests_per_unit",
    "unlimited",
    "shadow_mode",
    "quota_mode",
    "name",
    "replaces",
    "detailed_metric",
    "value_to_metric",
    "share_threshold",
    "metadata",
];

/// A descriptor's name in the reference's tree: its key, and `_value` when it has a value. Two
/// descriptors of one level with the same composite key (`a_b` with value `c`, `a` with value
/// `b_c`) are one to the reference, which refuses the file.
pub(super) fn composite_key(key: &str, value: Option<&str>) -> String {
    match value {
        Some(value) => format!("{key}_{value}"),
        None => key.to_owned(),
    }
}

/// Parses one file.
pub fn parse(file: &str, text: &str) -> Result<Domain, RulesError> {
    let loader = Loader {
        file,
        limits: std::cell::Cell::new(0),
        warnings: std::cell::RefCell::new(Vec::new()),
    };
    let root = yaml::parse(text)
        .map_err(|e| RulesError {
            file: file.to_owned(),
            mark: Some(e.mark),
            field: String::new(),
            message: e.message,
        })?
        .ok_or_else(|| RulesError {
            file: file.to_owned(),
            mark: None,
            field: String::new(),
            message: "the file is empty: write `domain: NAME` and a `descriptors:` list".into(),
        })?;
    let fields = loader.mapping(&root, "", &["domain", "descriptors"])?;
    let domain = match fields.get("domain") {
        Some(node) => loader.text(node, "domain")?,
        None => {
            return Err(loader.error(
                &root,
                "domain",
                "missing: every file needs `domain: NAME`, the domain envoy sends",
            ));
        }
    };
    if domain.is_empty() {
        return Err(loader.error(&root, "domain", "is empty: name the domain envoy sends"));
    }
    let root_level = match fields.get("descriptors") {
        Some(node) => loader.level(node, "descriptors", &domain, 1)?,
        None => Level::default(),
    };
    Ok(Domain {
        name: domain,
        file: file.to_owned(),
        root: root_level,
        warnings: loader.warnings.take(),
    })
}

pub(super) struct Loader<'a> {
    pub(super) file: &'a str,
    pub(super) limits: std::cell::Cell<usize>,
    pub(super) warnings: std::cell::RefCell<Vec<RulesError>>,
}

impl Loader<'_> {
    pub(super) fn error(&self, node: &Node, field: &str, message: impl Into<String>) -> RulesError {
        RulesError {
            file: self.file.to_owned(),
            mark: Some(node.mark),
            field: field.to_owned(),
            message: message.into(),
        }
    }

    /// A mapping's entries by key, refusing repeated keys and keys outside `allowed`, except a
    /// field of the reference's ([`REFERENCE_FIELDS`]) written where it means nothing, which is
    /// left out with a warning, as the reference ignores it.
    pub(super) fn mapping<'n>(
        &self,
        node: &'n Node,
        field: &str,
        allowed: &[&str],
    ) -> Result<HashMap<&'n str, &'n Node>, RulesError> {
        let Value::Mapping(entries) = &node.value else {
            return Err(self.error(
                node,
                field,
                format!(
                    "is {}, not a mapping: write its fields ({}) as `name: value` lines",
                    node.describe(),
                    allowed.join(", ")
                ),
            ));
        };
        let mut out = HashMap::new();
        for (key, value) in entries {
            let Value::Scalar { text, .. } = &key.value else {
                return Err(self.error(key, field, "a key must be plain text"));
            };
            let path = join(field, text);
            if !allowed.contains(&text.as_str()) {
                if REFERENCE_FIELDS.contains(&text.as_str()) {
                    self.warnings.borrow_mut().push(self.error(
                        key,
                        &path,
                        format!(
                            "means nothing here and is ignored, as envoy's reference ignores \
                             it (the fields here are {}); remove it or move it where it belongs",
                            allowed.join(", ")
                        ),
                    ));
                    continue;
                }
                return Err(self.error(
                    key,
                    &path,
                    format!("unknown field: the fields here are {}", allowed.join(", ")),
                ));
            }
            if out.insert(text.as_str(), value).is_some() {
                return Err(self.error(key, &path, "appears twice: keep one"));
            }
        }
        Ok(out)
    }

    pub(super) fn text(&self, node: &Node, field: &str) -> Result<String, RulesError> {
        match &node.value {
            _ if node.is_null() => Err(self.error(node, field, "is empty: give it a value")),
            Value::Scalar { text, .. } if text.len() > MAX_TEXT => Err(self.error(
                node,
                field,
                format!("is longer than {MAX_TEXT} bytes: shorten it"),
            )),
            Value::Scalar { text, .. } => Ok(text.clone()),
            _ => Err(self.error(
                node,
                field,
                format!("is {}, not text: write a single value", node.describe()),
            )),
        }
    }

    /// Text that may be empty (`value: ""`, `name: ""`).
    pub(super) fn text_or_empty(&self, node: &Node, field: &str) -> Result<String, RulesError> {
        match &node.value {
            Value::Scalar { text, plain: false } if text.is_empty() => Ok(String::new()),
            _ => self.text(node, field),
        }
    }

    pub(super) fn boolean(&self, node: &Node, field: &str) -> Result<bool, RulesError> {
        if let Value::Scalar { text, plain: true } = &node.value {
            match text.as_str() {
                "true" | "True" | "TRUE" | "yes" | "Yes" | "YES" | "on" | "On" | "ON" => {
                    return Ok(true);
                }
                "false" | "False" | "FALSE" | "no" | "No" | "NO" | "off" | "Off" | "OFF" => {
                    return Ok(false);
                }
                _ => {}
            }
        }
        Err(self.error(node, field, "is not a boolean: write true or false"))
    }

    pub(super) fn count(&self, node: &Node, field: &str) -> Result<u32, RulesError> {
        if let Value::Scalar { text, plain: true } = &node.value
            && !text.is_empty()
            && text.bytes().all(|b| b.is_ascii_digit())
        {
            return text.parse::<u32>().map_err(|_| {
                self.error(
                    node,
                    field,
                    format!("{text} is more than {} (the protocol's limit)", u32::MAX),
                )
            });
        }
        Err(self.error(
            node,
            field,
            "is not a whole number: write how many requests each unit allows, such as 100",
        ))
    }

    fn level(
        &self,
        node: &Node,
        field: &str,
        parent_key: &str,
        depth: usize,
    ) -> Result<Level, RulesError> {
        if node.is_null() {
            return Ok(Level::default());
        }
        let Value::Sequence(items) = &node.value else {
            return Err(self.error(
                node,
                field,
                format!(
                    "is {}, not a list: write each descriptor as a `- key: ...` item",
                    node.describe()
                ),
            ));
        };
        if depth > MAX_LEVELS {
            return Err(self.error(
                node,
                field,
                format!("descriptors nest deeper than {MAX_LEVELS} levels"),
            ));
        }
        let mut level = Level::default();
        // By composite key (`key_value`), as the reference names descriptors: two that join
        // to the same one are one descriptor there, and the file is refused.
        let mut seen: HashMap<String, (usize, String, Option<String>)> = HashMap::new();
        for (i, item) in items.iter().enumerate() {
            let path = format!("{field}[{i}]");
            let descriptor = self.descriptor(item, &path, parent_key, depth)?;
            let composite = composite_key(&descriptor.key, descriptor.value.as_deref());
            if let Some((line, key, value)) = seen.get(&composite) {
                let what = match &descriptor.value {
                    Some(v) => format!("key `{}` with value `{v}`", descriptor.key),
                    None => format!("key `{}` without a value", descriptor.key),
                };
                let message = if (key, value) == (&descriptor.key, &descriptor.value) {
                    format!(
                        "{what} is already configured at line {line} of this level: merge the two"
                    )
                } else {
                    format!(
                        "{what} joins to the composite key `{composite}`, as the descriptor at \
                         line {line} of this level does: envoy's reference cannot tell them \
                         apart and refuses the file; rename one"
                    )
                };
                return Err(self.error(item, &path, message));
            }
            seen.insert(
                composite,
                (
                    item.mark.line,
                    descriptor.key.clone(),
                    descriptor.value.clone(),
                ),
            );
            level.insert(descriptor);
        }
        Ok(level)
    }

    fn descriptor(
        &self,
        node: &Node,
        field: &str,
        parent_key: &str,
        depth: usize,
    ) -> Result<Descriptor, RulesError> {
        let fields = self.mapping(
            node,
            field,
            &[
                "key",
                "value",
                "rate_limit",
                "descriptors",
                "shadow_mode",
                "quota_mode",
                "share_threshold",
                "value_to_metric",
                "detailed_metric",
                "metadata",
            ],
        )?;
        let key = self.descriptor_key(&fields, node, field)?;
        // An empty value is no value, as in the reference: the key alone.
        let value = match fields.get("value") {
            Some(v) if !v.is_null() => Some(self.text_or_empty(v, &join(field, "value"))?),
            _ => None,
        }
        .filter(|v| !v.is_empty());
        let flag = |name: &str| match fields.get(name) {
            Some(v) => self.boolean(v, &join(field, name)),
            None => Ok(false),
        };
        let shadow = flag("shadow_mode")?;
        let quota_mode = flag("quota_mode")?;
        let share_threshold = flag("share_threshold")?;
        if share_threshold {
            self.check_share_threshold(&fields, node, field, &key, value.as_deref())?;
        }
        let value_to_metric = flag("value_to_metric")?;
        let detailed_metric = flag("detailed_metric")?;
        let metadata = fields.get("metadata").map(|m| flatten(m));
        let full_key = match &value {
            Some(v) => format!("{parent_key}.{key}_{v}"),
            None => format!("{parent_key}.{key}"),
        };
        let rule = match fields.get("rate_limit") {
            // `rate_limit:` with nothing after it is no rate limit, as in the reference.
            Some(r) if r.is_null() => None,
            Some(r) => Some(self.rule(
                r,
                &join(field, "rate_limit"),
                (shadow, quota_mode),
                &full_key,
            )?),
            None => None,
        };
        let children = match fields.get("descriptors") {
            Some(d) => self.level(d, &join(field, "descriptors"), &full_key, depth + 1)?,
            None => Level::default(),
        };
        Ok(Descriptor {
            key,
            value,
            rule,
            children,
            share_threshold,
            value_to_metric,
            detailed_metric,
            metadata,
        })
    }

    /// `key`, required and not empty.
    fn descriptor_key(
        &self,
        fields: &HashMap<&str, &Node>,
        node: &Node,
        field: &str,
    ) -> Result<String, RulesError> {
        let Some(k) = fields.get("key") else {
            return Err(self.error(
                node,
                &join(field, "key"),
                "missing: every descriptor needs the `key` envoy sends",
            ));
        };
        let key = self.text(k, &join(field, "key"))?;
        if key.is_empty() {
            return Err(self.error(
                k,
                &join(field, "key"),
                "is empty: every descriptor needs the `key` envoy sends",
            ));
        }
        Ok(key)
    }

    /// `share_threshold` applies only to a wildcard (a `*` in the key or the value), as
    /// envoy's reference requires.
    fn check_share_threshold(
        &self,
        fields: &HashMap<&str, &Node>,
        node: &Node,
        field: &str,
        key: &str,
        value: Option<&str>,
    ) -> Result<(), RulesError> {
        if key.contains('*') || value.is_some_and(|v| v.contains('*')) {
            return Ok(());
        }
        let at = fields.get("share_threshold").copied().unwrap_or(node);
        Err(self.error(
            at,
            &join(field, "share_threshold"),
            format!(
                "applies only to a wildcard value (one with a `*`), and `{}` has none: give \
                 the value a `*`, or remove share_threshold (as envoy's reference requires)",
                composite_key(key, value)
            ),
        ))
    }
}

/// A YAML value as one line of text (`{name: service_1}`), for showing `metadata`.
pub(super) fn flatten(node: &Node) -> String {
    match &node.value {
        Value::Scalar { text, .. } => text.clone(),
        Value::Sequence(items) => {
            let items: Vec<String> = items.iter().map(flatten).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Mapping(entries) => {
            let entries: Vec<String> = entries
                .iter()
                .map(|(k, v)| format!("{}: {}", flatten(k), flatten(v)))
                .collect();
            format!("{{{}}}", entries.join(", "))
        }
    }
}

pub(super) fn join(field: &str, name: &str) -> String {
    if field.is_empty() {
        name.to_owned()
    } else {
        format!("{field}.{name}")
    }
}
