//! Descriptor files in the YAML shape envoy's reference rate-limit service reads, so an
//! existing file can be pointed at limiterd: a `domain`, and nested `descriptors` with `key`,
//! optional `value` (`*` anywhere in it matches any run of characters: `/api/*`, `bar*b`,
//! `foo*bar*baz`; an empty value is the same as none), `rate_limit` (`unit`,
//! `requests_per_unit` (0 when missing), `unit_multiplier`, `name`, `unlimited`, `replaces`),
//! `shadow_mode`, `quota_mode`, `share_threshold`, `value_to_metric`, `detailed_metric` and
//! `metadata` (kept and shown, never decided on).
//!
//! One addition: `rate_limit.algorithm` picks `fixed_window` (the default, as the reference
//! server counts), `token_bucket` or `sliding_window`.
//!
//! ```yaml
//! domain: web
//! descriptors:
//!   - key: remote_address          # every address, counted apart
//!     rate_limit: { unit: second, requests_per_unit: 10, algorithm: token_bucket }
//!   - key: path
//!     value: /login
//!     rate_limit: { unit: minute, requests_per_unit: 5, name: login }
//!     descriptors:
//!       - key: user
//!         rate_limit: { unit: hour, requests_per_unit: 50 }
//!   - key: path
//!     value: /files/*              # every file counted together
//!     share_threshold: true
//!     rate_limit: { unit: minute, requests_per_unit: 100 }
//! ```
//!
//! Everything is checked when the file is loaded; an error names the file, the line and
//! column, the field (`descriptors[1].rate_limit.unit`) and the fix.
//!
//! The descriptor model is here; `load.rs` reads it from a file.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use limiter_core::Limit;
use limiter_input::Wildcard;
use limiter_stack::Kind;

use crate::yaml::Mark;

mod load;
mod rate_limit;

use load::composite_key;
pub use load::parse;

/// Nested descriptor levels beyond this are refused (the reference sets no bound; this one
/// keeps loading's recursion bounded).
pub const MAX_LEVELS: usize = 64;
/// The longest domain, key or value in a file, in bytes.
pub const MAX_TEXT: usize = 65_536;

/// A rate limit's unit, as envoy's protocol names them (a month is 30 days, a year 365).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// One second.
    Second,
    /// 60 seconds.
    Minute,
    /// 3,600 seconds.
    Hour,
    /// 86,400 seconds.
    Day,
    /// 7 days.
    Week,
    /// 30 days.
    Month,
    /// 365 days.
    Year,
}

impl Unit {
    const ALL: [Unit; 7] = [
        Unit::Second,
        Unit::Minute,
        Unit::Hour,
        Unit::Day,
        Unit::Week,
        Unit::Month,
        Unit::Year,
    ];

    /// The unit's length.
    pub fn duration(self) -> Duration {
        Duration::from_secs(match self {
            Unit::Second => 1,
            Unit::Minute => 60,
            Unit::Hour => 3_600,
            Unit::Day => 86_400,
            Unit::Week => 7 * 86_400,
            Unit::Month => 30 * 86_400,
            Unit::Year => 365 * 86_400,
        })
    }

    /// The protocol's name (`SECOND`).
    pub fn name(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    /// The unit named `text`, in any case (`second`, `SECOND`).
    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|u| u.name().eq_ignore_ascii_case(text))
    }

    /// The protocol's number for the unit (`RateLimitResponse.RateLimit.Unit`).
    pub fn number(self) -> i32 {
        match self {
            Unit::Second => 1,
            Unit::Minute => 2,
            Unit::Hour => 3,
            Unit::Day => 4,
            Unit::Month => 5,
            Unit::Year => 6,
            Unit::Week => 7,
        }
    }

    /// The unit numbered `number` in the protocol; `None` for `UNKNOWN` (0) or junk.
    pub fn from_number(number: i32) -> Option<Self> {
        Self::ALL.into_iter().find(|u| u.number() == number)
    }
}

/// A configured limit at one node of the tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// `rate_limit.name` (empty if none): reported back, and what `replaces` names.
    pub name: String,
    /// Units per window; 0 refuses everything.
    pub requests_per_unit: u32,
    /// The unit, as reported back.
    pub unit: Unit,
    /// `rate_limit.unit_multiplier`: the window is this many units (1 unless set).
    pub unit_multiplier: u32,
    /// The algorithm.
    pub kind: Kind,
    /// Evaluated and reported, never enforced.
    pub shadow: bool,
    /// `quota_mode`: evaluated and counted; when over, the request is still admitted and the
    /// answer's dynamic metadata names the descriptor (`quotaModeViolations`).
    pub quota_mode: bool,
    /// The names of limits this one replaces when both match one request.
    pub replaces: Vec<String>,
    /// `domain.key_value.key`: the node's path, naming its counters and metrics.
    pub full_key: String,
    /// `file:line`, for errors found later (a limit Redis cannot decide exactly).
    pub location: String,
    /// The limit's number within its domain, from 0, in [`Domain::limits`] order.
    pub id: usize,
    /// `rate_limit.lease_slack` (and `lease_ttl`): on Redis, decided locally against leases
    /// within this slack (a limiterd addition, as `algorithm` is; ignored in memory).
    pub lease: Option<limiter_stack::Lease>,
}

impl RateLimit {
    /// The window: `unit` times `unit_multiplier`.
    pub fn window(&self) -> Duration {
        self.unit.duration() * self.unit_multiplier.max(1)
    }

    /// The limit the algorithm decides (`None` when `requests_per_unit` is 0).
    pub fn limit(&self) -> Option<Limit> {
        let limit = Limit::new(u64::from(self.requests_per_unit), self.window());
        limit.check().is_ok().then_some(limit)
    }
}

/// What a node says about the requests that end there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Counted against a limit.
    Limited(RateLimit),
    /// Never limited (`unlimited: true`); it may still replace other limits.
    Unlimited {
        /// `rate_limit.name` (empty if none).
        name: String,
        /// The names of limits this one replaces when both match one request.
        replaces: Vec<String>,
    },
}

impl Rule {
    /// The names of the limits this rule replaces.
    pub fn replaces(&self) -> &[String] {
        match self {
            Rule::Limited(limit) => &limit.replaces,
            Rule::Unlimited { replaces, .. } => replaces,
        }
    }
}

/// One level of the tree: the descriptors under one parent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Level {
    nodes: Vec<Descriptor>,
    /// Exact values, by key and then value: looked up by the request's strings, with no
    /// allocation.
    exact: HashMap<String, HashMap<String, usize>>,
    /// Values with a `*`: key, the value as a pattern, and the node, in the file's order.
    wildcard: Vec<(String, Wildcard, usize)>,
    any: HashMap<String, usize>,
}

/// A configured descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Descriptor {
    /// The entry's key.
    pub key: String,
    /// The entry's value (`None`: any value, each counted apart).
    pub value: Option<String>,
    /// The rule for requests whose last entry lands here.
    pub rule: Option<Rule>,
    /// The next entries.
    pub children: Level,
    /// `share_threshold`: every value this node's wildcard matches shares one counter.
    pub share_threshold: bool,
    /// `value_to_metric`: the metric names carry the request's value at this level.
    pub value_to_metric: bool,
    /// `detailed_metric`: the metric names carry the request's values at every level.
    pub detailed_metric: bool,
    /// `metadata`, as written (kept and shown; nothing is decided on it).
    pub metadata: Option<String>,
}

impl Descriptor {
    /// Whether the value holds a `*`.
    pub fn is_wildcard(&self) -> bool {
        self.value.as_deref().is_some_and(|v| v.contains('*'))
    }
}

impl Level {
    /// The node for one entry: an exact value first, then a wildcard (in the file's order),
    /// then the key alone.
    fn find(&self, key: &str, value: &str) -> Option<&Descriptor> {
        let index = self
            .exact
            .get(key)
            .and_then(|values| values.get(value))
            .or_else(|| {
                self.wildcard
                    .iter()
                    .find(|(k, wildcard, _)| k == key && wildcard.matches(value))
                    .map(|(_, _, i)| i)
            })
            .or_else(|| self.any.get(key))?;
        self.nodes.get(*index)
    }

    /// Every node, depth first.
    fn walk<'a>(&'a self, out: &mut Vec<&'a Descriptor>) {
        for node in &self.nodes {
            out.push(node);
            node.children.walk(out);
        }
    }

    /// Every node, depth first, to change.
    fn walk_mut(&mut self, visit: &mut impl FnMut(&mut Descriptor)) {
        for node in &mut self.nodes {
            visit(node);
            node.children.walk_mut(visit);
        }
    }
}

/// A request descriptor's match: the node each entry landed on, the last holding the rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Match<'a> {
    /// The node each entry landed on, outermost first.
    pub path: Vec<&'a Descriptor>,
    /// The last node's rule.
    pub rule: &'a Rule,
}

impl Match<'_> {
    /// Whether the entry at `level` counts under its node's wildcard rather than its own
    /// value (`share_threshold` on a wildcard).
    pub fn shares(&self, level: usize) -> bool {
        self.path
            .get(level)
            .is_some_and(|node| node.share_threshold && node.is_wildcard())
    }

    /// The metric name for `entries` (`domain.key_value...`): the configured path, with the
    /// request's value where `value_to_metric` asks for it at a level, or `detailed_metric` at
    /// the last, and the wildcard where `share_threshold` counts values together.
    pub fn metric_key(&self, domain: &str, entries: &[(String, String)]) -> Option<String> {
        let detailed = self.path.last().is_some_and(|n| n.detailed_metric);
        let mut any = false;
        let mut out = domain.to_owned();
        for (level, (node, (key, value))) in self.path.iter().zip(entries).enumerate() {
            out.push('.');
            out.push_str(key);
            let shown = if self.shares(level) {
                node.value.as_deref()
            } else if node.value_to_metric || detailed {
                any = true;
                Some(value.as_str()).filter(|v| !v.is_empty())
            } else {
                node.value.as_deref()
            };
            if let Some(v) = shown {
                out.push('_');
                out.push_str(v);
            }
        }
        any.then_some(out)
    }
}

/// One domain's descriptor tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Domain {
    /// The domain.
    pub name: String,
    /// The file it came from.
    pub file: String,
    /// The top level.
    pub root: Level,
    /// What the file says that is ignored, as envoy's reference ignores it (a field the
    /// reference knows, written where it means nothing): each names the field and its place.
    pub warnings: Vec<RulesError>,
}

impl Domain {
    /// The rule for a request descriptor's entries, matched as envoy's reference server does:
    /// level by level, the most specific node for each entry; the rule applies only if the
    /// request's last entry lands on a node that has one.
    pub fn rule(&self, entries: &[(String, String)]) -> Option<&Rule> {
        self.matched(entries).map(|m| m.rule)
    }

    /// [`Domain::rule`], with the node each entry landed on.
    pub fn matched(&self, entries: &[(String, String)]) -> Option<Match<'_>> {
        let mut level = &self.root;
        let mut path = Vec::with_capacity(entries.len().min(MAX_LEVELS));
        for (i, (key, value)) in entries.iter().enumerate() {
            let node = level.find(key, value)?;
            path.push(node);
            if i + 1 == entries.len() {
                return node.rule.as_ref().map(|rule| Match { path, rule });
            }
            level = &node.children;
        }
        None
    }

    /// Every configured limit, depth first in the file's order.
    pub fn limits(&self) -> impl Iterator<Item = &RateLimit> {
        let mut nodes = Vec::new();
        self.root.walk(&mut nodes);
        nodes.into_iter().filter_map(|n| match &n.rule {
            Some(Rule::Limited(limit)) => Some(limit),
            _ => None,
        })
    }
}

impl Domain {
    /// Adds `other`'s top-level descriptors (same domain, another file) after this one's,
    /// numbering its limits after this one's.
    fn merge(&mut self, other: Domain) -> Result<(), RulesError> {
        self.warnings.extend(other.warnings);
        for node in other.root.nodes {
            let composite = composite_key(&node.key, node.value.as_deref());
            if self
                .root
                .nodes
                .iter()
                .any(|n| composite_key(&n.key, n.value.as_deref()) == composite)
            {
                return Err(RulesError {
                    file: other.file.clone(),
                    mark: None,
                    field: "descriptors".into(),
                    message: format!(
                        "key `{}`{} of domain `{}` is already configured in {}: merge the two",
                        node.key,
                        node.value
                            .as_deref()
                            .map(|v| format!(" with value `{v}`"))
                            .unwrap_or_default(),
                        self.name,
                        self.file
                    ),
                });
            }
            self.root.insert(node);
        }
        let mut next = 0;
        self.root.walk_mut(&mut |node| {
            if let Some(Rule::Limited(limit)) = &mut node.rule {
                limit.id = next;
                next += 1;
            }
        });
        Ok(())
    }
}

impl Level {
    /// Adds `node` at the end, indexing its value.
    fn insert(&mut self, node: Descriptor) {
        let index = self.nodes.len();
        match &node.value {
            None => {
                self.any.insert(node.key.clone(), index);
            }
            Some(v) if v.contains('*') => {
                self.wildcard
                    .push((node.key.clone(), Wildcard::new(v), index))
            }
            Some(v) => {
                let values = self.exact.entry(node.key.clone()).or_default();
                values.insert(v.clone(), index);
            }
        }
        self.nodes.push(node);
    }
}

/// Every loaded domain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Domains {
    domains: BTreeMap<String, Domain>,
}

impl Domains {
    /// Loads `files` (name and text); a domain may appear in only one file.
    pub fn load<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Result<Self, RulesError> {
        Self::load_merging(files, false)
    }

    /// Loads `files`; with `merge`, a domain named in several files gathers their descriptors
    /// (as the reference's `MERGE_DOMAIN_CONFIG` does: a descriptor repeated across them is
    /// refused as within one file), else a domain may appear in only one file.
    pub fn load_merging<'a>(
        files: impl IntoIterator<Item = (&'a str, &'a str)>,
        merge: bool,
    ) -> Result<Self, RulesError> {
        let mut domains: BTreeMap<String, Domain> = BTreeMap::new();
        for (file, text) in files {
            let domain = parse(file, text)?;
            let Some(first) = domains.get_mut(&domain.name) else {
                domains.insert(domain.name.clone(), domain);
                continue;
            };
            if !merge {
                return Err(RulesError {
                    file: file.to_owned(),
                    mark: None,
                    field: "domain".into(),
                    message: format!(
                        "domain `{}` is already defined in {}: put each domain in one file, or \
                         set `merge_domains = true` in `[envoy]` to gather them",
                        domain.name, first.file
                    ),
                });
            }
            first.merge(domain)?;
        }
        Ok(Self { domains })
    }

    /// A domain by name.
    pub fn get(&self, name: &str) -> Option<&Domain> {
        self.domains.get(name)
    }

    /// Every domain, by name.
    pub fn iter(&self) -> impl Iterator<Item = &Domain> {
        self.domains.values()
    }

    /// Whether no file was loaded.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// What the files say that is ignored (see [`Domain::warnings`]), file by file.
    pub fn warnings(&self) -> impl Iterator<Item = &RulesError> {
        self.domains.values().flat_map(|d| d.warnings.iter())
    }
}

/// A descriptor file that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RulesError {
    /// The file.
    pub file: String,
    /// Where in it, when the error has a place.
    pub mark: Option<Mark>,
    /// The field (`descriptors[0].rate_limit.unit`), when one is at fault.
    pub field: String,
    /// What is wrong and how to fix it.
    pub message: String,
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(mark) = self.mark {
            write!(f, ":{}:{}", mark.line, mark.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for RulesError {}

#[cfg(test)]
mod tests;
