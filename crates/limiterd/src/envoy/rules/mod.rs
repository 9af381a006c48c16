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
use limiter_redis::Kind;

use crate::envoy::yaml::Mark;

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
    pub lease: Option<limiter_redis::Lease>,
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
    exact: HashMap<(String, String), usize>,
    /// Values with a `*`: key, the value split at each `*`, and the node, in the file's order.
    wildcard: Vec<(String, Vec<String>, usize)>,
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

/// Whether `value` matches a wildcard split at its `*`s: the first part starts it, the last
/// ends it, and the middle ones appear in order between (each `*` matches any run, even none).
fn wildcard_matches(parts: &[String], value: &str) -> bool {
    let (Some(first), Some(last)) = (parts.first(), parts.last()) else {
        return false;
    };
    if parts.len() == 1 {
        return value == first;
    }
    if value.len() < first.len() + last.len()
        || !value.starts_with(first.as_str())
        || !value.ends_with(last.as_str())
    {
        return false;
    }
    // Leftmost matches of the middle parts are enough: taking each as early as possible
    // leaves the most room for the rest.
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part.as_str()) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

impl Level {
    /// The node for one entry: an exact value first, then a wildcard (in the file's order),
    /// then the key alone.
    fn find(&self, key: &str, value: &str) -> Option<&Descriptor> {
        let index = self
            .exact
            .get(&(key.to_owned(), value.to_owned()))
            .or_else(|| {
                self.wildcard
                    .iter()
                    .find(|(k, parts, _)| k == key && wildcard_matches(parts, value))
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
            Some(v) if v.contains('*') => self.wildcard.push((
                node.key.clone(),
                v.split('*').map(str::to_owned).collect(),
                index,
            )),
            Some(v) => {
                self.exact.insert((node.key.clone(), v.clone()), index);
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
mod tests {
    use super::*;

    const WEB: &str = "\
domain: web
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: token_bucket
  - key: path
    value: /login
    rate_limit: { unit: minute, requests_per_unit: 5, name: login }
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 50 }
  - key: path
    value: /api/*
    rate_limit: { unit: second, requests_per_unit: 100 }
  - key: path
    rate_limit: { unit: second, requests_per_unit: 1000 }
  - key: internal
    rate_limit: { unlimited: true }
";

    fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn limit_of<'a>(domain: &'a Domain, pairs: &[(&str, &str)]) -> Option<&'a RateLimit> {
        match domain.rule(&entries(pairs)) {
            Some(Rule::Limited(l)) => Some(l),
            _ => None,
        }
    }

    #[test]
    fn the_most_specific_node_wins_and_only_at_the_last_entry() {
        let web = parse("web.yaml", WEB).expect("valid");
        let by_ip = limit_of(&web, &[("remote_address", "10.0.0.1")]).expect("matched");
        assert_eq!(
            (by_ip.requests_per_unit, by_ip.kind),
            (10, Kind::TokenBucket)
        );
        assert_eq!(by_ip.full_key, "web.remote_address");

        let login = limit_of(&web, &[("path", "/login")]).expect("exact value");
        assert_eq!((login.requests_per_unit, login.name.as_str()), (5, "login"));
        assert_eq!(login.unit, Unit::Minute);
        assert_eq!(
            login.kind,
            Kind::FixedWindow,
            "the reference server's default"
        );

        let api = limit_of(&web, &[("path", "/api/users")]).expect("prefix");
        assert_eq!(api.requests_per_unit, 100);
        let other = limit_of(&web, &[("path", "/home")]).expect("key only");
        assert_eq!(other.requests_per_unit, 1000);

        let user = limit_of(&web, &[("path", "/login"), ("user", "alice")]).expect("nested");
        assert_eq!(user.requests_per_unit, 50);
        assert_eq!(user.full_key, "web.path_/login.user");
        // A request deeper than the tree, or a nested key under the wrong parent: no limit.
        assert_eq!(
            web.rule(&entries(&[("remote_address", "1"), ("user", "a")])),
            None
        );
        assert_eq!(
            web.rule(&entries(&[("path", "/home"), ("user", "a")])),
            None
        );
        assert_eq!(web.rule(&entries(&[("nothing", "x")])), None);
        assert_eq!(
            web.rule(&entries(&[("internal", "yes")])),
            Some(&Rule::Unlimited {
                name: String::new(),
                replaces: Vec::new()
            })
        );
        assert_eq!(web.limits().count(), 5);
    }

    fn error(text: &str) -> RulesError {
        parse("f.yaml", text).expect_err(text)
    }

    #[test]
    fn every_mistake_names_the_file_line_field_and_fix() {
        let cases: &[(&str, &str, usize, &str)] = &[
            (
                "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
                "descriptors[0].rate_limit.unit",
                4,
                "`fortnight` is not a unit",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n    rate_limt: { unit: second }\n",
                "descriptors[0].rate_limt",
                4,
                "unknown field",
            ),
            (
                "domain: web\ndescriptors:\n  - value: x\n",
                "descriptors[0].key",
                3,
                "missing",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: year, requests_per_unit: 1, unit_multiplier: 4294967295 }\n",
                "descriptors[0].rate_limit.unit_multiplier",
                4,
                "use a smaller unit_multiplier",
            ),
            (
                "domain: web\ndescriptors:\n  - key: \"\"\n",
                "descriptors[0].key",
                3,
                "is empty",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: -3 }\n",
                "descriptors[0].rate_limit.requests_per_unit",
                4,
                "not a whole number",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 99999999999 }\n",
                "descriptors[0].rate_limit.requests_per_unit",
                4,
                "more than 4294967295",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n  - key: b\n  - key: a\n",
                "descriptors[2]",
                5,
                "already configured at line 3",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unlimited: true, unit: second }\n",
                "descriptors[0].rate_limit.unit",
                4,
                "unlimited",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, name: x, replaces: [{ name: x }] }\n",
                "descriptors[0].rate_limit.replaces[0].name",
                4,
                "cannot replace itself",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, algorithm: leaky }\n",
                "descriptors[0].rate_limit.algorithm",
                4,
                "not an algorithm",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n",
                "descriptors[0].shadow_mode",
                4,
                "true or false",
            ),
            ("descriptors: []\n", "domain", 1, "missing"),
            (
                "domain: web\ndescriptors: {key: a}\n",
                "descriptors",
                2,
                "not a list",
            ),
            (
                "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, unit_multiplier: 0 }\n",
                "descriptors[0].rate_limit.unit_multiplier",
                4,
                "is 0",
            ),
        ];
        for (text, field, line, message) in cases {
            let e = error(text);
            assert_eq!(e.field, *field, "{e}");
            assert_eq!(e.mark.map(|m| m.line), Some(*line), "{e}");
            assert!(e.message.contains(message), "{e}");
            assert!(e.to_string().starts_with(&format!("f.yaml:{line}:")), "{e}");
        }
        let e = error("domain: web\ndescriptors:\n  - key: a\n    value: [1, 2]\n");
        assert_eq!(
            e.mark,
            Some(Mark {
                line: 4,
                column: 12
            }),
            "{e}"
        );
        assert!(error("").message.contains("empty"));
        assert!(error("domain: [web\n").message.contains("not valid YAML"));
    }

    #[test]
    fn a_domain_lives_in_one_file_and_units_round_trip() {
        let err = Domains::load([("a.yaml", "domain: web\n"), ("b.yaml", "domain: web\n")])
            .expect_err("duplicate");
        assert_eq!(err.file, "b.yaml");
        assert!(err.message.contains("already defined in a.yaml"), "{err}");
        for unit in Unit::ALL {
            assert_eq!(Unit::from_number(unit.number()), Some(unit));
            assert_eq!(Unit::parse(&unit.name().to_lowercase()), Some(unit));
        }
        assert_eq!(Unit::from_number(0), None);
        // The protocol's numbering: MONTH is 5, YEAR 6, WEEK 7.
        assert_eq!(
            (
                Unit::Month.number(),
                Unit::Year.number(),
                Unit::Week.number()
            ),
            (5, 6, 7)
        );
    }

    #[test]
    fn loads_and_refuses_as_the_reference_does_at_every_level() {
        // A field the reference knows, where it means nothing: loaded, ignored, with a warning
        // naming it (the reference checks every key against one list, whatever the level).
        let text = "domain: web\nkey: stray\ndescriptors:\n  - key: a\n    unit: second\n    rate_limit: { unit: minute, requests_per_unit: 2, shadow_mode: true }\n    descriptors:\n      - key: b\n        requests_per_unit: 9\n        rate_limit:\n          unit: hour\n          requests_per_unit: 3\n          replaces: [{ name: x, value: y }]\n";
        let domain = parse("web.yaml", text).expect("the reference loads it");
        let a = limit_of(&domain, &[("a", "1")]).expect("a's limit");
        assert_eq!(
            (a.requests_per_unit, a.unit, a.shadow),
            (2, Unit::Minute, false)
        );
        let b = limit_of(&domain, &[("a", "1"), ("b", "2")]).expect("b's limit");
        assert_eq!((b.requests_per_unit, b.unit), (3, Unit::Hour));
        let warned: Vec<String> = domain.warnings.iter().map(ToString::to_string).collect();
        for (field, line) in [
            ("key", 2),
            ("descriptors[0].unit", 5),
            ("descriptors[0].rate_limit.shadow_mode", 6),
            ("descriptors[0].descriptors[0].requests_per_unit", 9),
            (
                "descriptors[0].descriptors[0].rate_limit.replaces[0].value",
                13,
            ),
        ] {
            assert!(
                warned
                    .iter()
                    .any(|w| w.contains(&format!("web.yaml:{line}:"))
                        && w.contains(&format!(": {field}: means nothing here and is ignored"))),
                "{field} at line {line}: {warned:#?}"
            );
        }
        assert_eq!(warned.len(), 5, "{warned:#?}");
        // A field nobody knows is still refused.
        let err = parse(
            "web.yaml",
            "domain: web\ndescriptors:\n  - key: a\n    units: second\n",
        )
        .expect_err("refused");
        assert!(err.to_string().contains("unknown field"), "{err}");

        // What the reference refuses: share_threshold on a value with no wildcard, and two
        // descriptors whose key and value join to one composite key (`a_b` + `c`, `a` + `b_c`).
        let err = parse(
            "web.yaml",
            "domain: web\ndescriptors:\n  - key: files\n    value: report.pdf\n    share_threshold: true\n    rate_limit: { unit: day, requests_per_unit: 1 }\n",
        )
        .expect_err("refused")
        .to_string();
        assert!(err.starts_with("web.yaml:5:"), "{err}");
        assert!(
            err.contains("share_threshold: applies only to a wildcard value"),
            "{err}"
        );
        // On a wildcard, or switched off, it loads.
        for ok in [
            "value: report*\n    share_threshold: true",
            "value: report.pdf\n    share_threshold: false",
        ] {
            let text = format!(
                "domain: web\ndescriptors:\n  - key: files\n    {ok}\n    rate_limit: {{ unit: day, requests_per_unit: 1 }}\n"
            );
            assert!(parse("web.yaml", &text).is_ok(), "{ok}");
        }
        for (first, second) in [
            ("key: a_b\n    value: c", "key: a\n    value: b_c"),
            ("key: a_b", "key: a\n    value: b"),
        ] {
            let text = format!("domain: web\ndescriptors:\n  - {first}\n  - {second}\n");
            let err = parse("web.yaml", &text).expect_err("refused").to_string();
            assert!(err.contains("joins to the composite key"), "{err}");
            assert!(err.contains("rename one"), "{err}");
        }
        // Across files merged into one domain, too.
        let first = "domain: web\ndescriptors:\n  - key: a_b\n    value: c\n";
        let second = "domain: web\ndescriptors:\n  - key: a\n    value: b_c\n";
        assert!(Domains::load_merging([("1.yaml", first), ("2.yaml", second)], true).is_err());
    }

    #[test]
    fn loads_what_the_reference_loads() {
        let deep = {
            let mut text = String::from("domain: deep\ndescriptors:\n");
            for level in 0..20 {
                let pad = "  ".repeat(level * 2);
                text.push_str(&format!("{pad}  - key: k{level}\n"));
                if level == 19 {
                    text.push_str(&format!(
                        "{pad}    rate_limit: {{ unit: second, requests_per_unit: 1 }}\n"
                    ));
                } else {
                    text.push_str(&format!("{pad}    descriptors:\n"));
                }
            }
            text
        };
        let deep = parse("deep.yaml", &deep).expect("20 levels load");
        let path: Vec<(String, String)> =
            (0..20).map(|l| (format!("k{l}"), "v".to_owned())).collect();
        assert!(matches!(deep.rule(&path), Some(Rule::Limited(_))));

        let text = format!(
            "domain: web
descriptors:
  - key: a
    value: \"\"
    metadata: {{ service_with_quota: {{ name: s }} }}
    share_threshold: false
    value_to_metric: true
    quota_mode: true
    rate_limit: {{ unit: hour }}
  - key: b
    rate_limit:
  - key: c
    rate_limit: {{ unlimited: true, requests_per_unit: 5, name: c, replaces: [{{ name: x }}] }}
  - key: d
    value: {long}
    rate_limit: {{ unit: minute, requests_per_unit: 20, unit_multiplier: 5 }}
",
            long = "v".repeat(300)
        );
        let web = parse("web.yaml", &text).expect("loads");
        let a = limit_of(&web, &[("a", "anything")]).expect("an empty value is the key alone");
        assert_eq!((a.requests_per_unit, a.quota_mode), (0, true));
        assert_eq!(web.rule(&entries(&[("b", "x")])), None, "no rate limit");
        assert_eq!(
            web.rule(&entries(&[("c", "x")])).map(Rule::replaces),
            Some(&["x".to_owned()][..])
        );
        let d = limit_of(&web, &[("d", &"v".repeat(300))]).expect("a long value");
        assert_eq!(d.window(), Duration::from_secs(300));
        let described = web.matched(&entries(&[("a", "z")])).expect("matched");
        assert_eq!(
            described.path[0].metadata.as_deref(),
            Some("{service_with_quota: {name: s}}")
        );
        assert_eq!(
            described
                .metric_key("web", &entries(&[("a", "z")]))
                .as_deref(),
            Some("web.a_z")
        );
    }

    #[test]
    fn wildcards_match_anywhere_in_the_value() {
        let parts = |p: &str| p.split('*').map(str::to_owned).collect::<Vec<_>>();
        for (pattern, value, matches) in [
            ("foo*", "foo", true),
            ("foo*", "foobar", true),
            ("foo*", "fo", false),
            ("bar*b", "barb", true),
            ("bar*b", "bar-x-b", true),
            ("bar*b", "bar-x-c", false),
            ("bar*b", "bab", false),
            ("foo*bar*baz", "foobarbaz", true),
            ("foo*bar*baz", "foo1bar2baz", true),
            ("foo*bar*baz", "foo1baz", false),
            ("foo*bar*baz", "foobazbar", false),
            ("*", "", true),
            ("*x*", "axb", true),
            ("*x*", "ab", false),
            ("a*a", "a", false),
            ("/api/*/action", "/api/v1/action", true),
            ("/api/*/action", "/api/action", false),
        ] {
            assert_eq!(
                wildcard_matches(&parts(pattern), value),
                matches,
                "{pattern} against {value}"
            );
        }
    }

    #[test]
    fn domains_merge_across_files_only_when_asked() {
        let one = "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
        let two = "domain: web\ndescriptors:\n  - key: b\n    rate_limit: { unit: second, requests_per_unit: 2 }\n";
        assert!(Domains::load([("1.yaml", one), ("2.yaml", two)]).is_err());
        let merged =
            Domains::load_merging([("1.yaml", one), ("2.yaml", two)], true).expect("merged");
        let web = merged.get("web").expect("web");
        let ids: Vec<usize> = web.limits().map(|l| l.id).collect();
        assert_eq!(ids, [0, 1]);
        assert!(web.rule(&entries(&[("b", "x")])).is_some());
        let err = Domains::load_merging([("1.yaml", one), ("3.yaml", one)], true)
            .expect_err("the same descriptor twice");
        assert!(
            err.message.contains("already configured in 1.yaml"),
            "{err}"
        );
    }
}
