//! A descriptor's `rate_limit`: unit, count, algorithm, `unlimited`, `replaces`, and the
//! lease options for Redis, each checked where it is written.

use std::collections::HashMap;

use limiter_core::Limit;
use limiter_stack::Kind;

use crate::yaml::{Node, Value};

use super::load::{Loader, join};
use super::*;

impl Loader<'_> {
    pub(super) fn rule(
        &self,
        node: &Node,
        field: &str,
        (shadow, quota_mode): (bool, bool),
        full_key: &str,
    ) -> Result<Rule, RulesError> {
        let fields = self.mapping(
            node,
            field,
            &[
                "unit",
                "requests_per_unit",
                "unit_multiplier",
                "name",
                "unlimited",
                "replaces",
                "algorithm",
                "lease_slack",
                "lease_ttl",
            ],
        )?;
        let unlimited = match fields.get("unlimited") {
            Some(v) => self.boolean(v, &join(field, "unlimited"))?,
            None => false,
        };
        let name = match fields.get("name") {
            Some(n) if n.is_null() => String::new(),
            Some(n) => self.text_or_empty(n, &join(field, "name"))?,
            None => String::new(),
        };
        let replaces = self.replaces(&fields, field, &name)?;
        if unlimited {
            self.nothing_counted_beside_unlimited(&fields, field)?;
            return Ok(Rule::Unlimited { name, replaces });
        }
        let unit = self.unit(&fields, node, field)?;
        // Missing is 0, as the reference reads it: the limit refuses everything.
        let requests_per_unit = match fields.get("requests_per_unit") {
            Some(n) => self.count(n, &join(field, "requests_per_unit"))?,
            None => 0,
        };
        let unit_multiplier = self.unit_multiplier(&fields, field)?;
        let kind = self.algorithm(&fields, field)?;
        let lease = self.lease(&fields, field, requests_per_unit)?;
        let limit = RateLimit {
            name,
            requests_per_unit,
            unit,
            unit_multiplier,
            kind,
            shadow,
            quota_mode,
            replaces,
            full_key: full_key.to_owned(),
            location: format!("{}:{}", self.file, node.mark.line),
            id: self.limits.get(),
            lease,
        };
        self.limits.set(limit.id + 1);
        self.check_countable(&limit, node, field)?;
        Ok(Rule::Limited(limit))
    }

    /// As in the reference: a unit says the limit counts something, which an unlimited one
    /// does not; a count or `replaces` beside `unlimited: true` is harmless.
    fn nothing_counted_beside_unlimited(
        &self,
        fields: &HashMap<&str, &Node>,
        field: &str,
    ) -> Result<(), RulesError> {
        for other in [
            "unit",
            "algorithm",
            "unit_multiplier",
            "lease_slack",
            "lease_ttl",
        ] {
            if let Some(v) = fields.get(other) {
                return Err(self.error(
                    v,
                    &join(field, other),
                    "an unlimited rate limit has no window: remove this field or `unlimited: true`",
                ));
            }
        }
        Ok(())
    }

    /// `unit`, required on a limit that counts.
    fn unit(
        &self,
        fields: &HashMap<&str, &Node>,
        node: &Node,
        field: &str,
    ) -> Result<Unit, RulesError> {
        let Some(u) = fields.get("unit") else {
            return Err(self.error(
                node,
                &join(field, "unit"),
                "missing: say per what the requests count (second, minute, hour, day, week, month or year), or set `unlimited: true`",
            ));
        };
        let text = self.text(u, &join(field, "unit"))?;
        Unit::parse(&text).ok_or_else(|| {
            self.error(
                u,
                &join(field, "unit"),
                format!(
                    "`{text}` is not a unit: use second, minute, hour, day, week, month or year"
                ),
            )
        })
    }

    /// `unit_multiplier`: 1 when missing, never 0.
    fn unit_multiplier(
        &self,
        fields: &HashMap<&str, &Node>,
        field: &str,
    ) -> Result<u32, RulesError> {
        let Some(n) = fields.get("unit_multiplier") else {
            return Ok(1);
        };
        match self.count(n, &join(field, "unit_multiplier"))? {
            0 => Err(self.error(
                n,
                &join(field, "unit_multiplier"),
                "is 0: a window of no time counts nothing; write 1 or more (1 is the unit itself)",
            )),
            m => Ok(m),
        }
    }

    /// `algorithm`: the fixed window when missing, as the reference counts.
    fn algorithm(&self, fields: &HashMap<&str, &Node>, field: &str) -> Result<Kind, RulesError> {
        let Some(a) = fields.get("algorithm") else {
            return Ok(Kind::FixedWindow);
        };
        let text = self.text(a, &join(field, "algorithm"))?;
        text.parse::<Kind>().map_err(|e| {
            self.error(
                a,
                &join(field, "algorithm"),
                format!("{e} (fixed_window is the default)"),
            )
        })
    }

    /// A limit that counts must be one its algorithm can count: a window within the range and
    /// a count the algorithm accepts over it.
    fn check_countable(
        &self,
        limit: &RateLimit,
        node: &Node,
        field: &str,
    ) -> Result<(), RulesError> {
        let unit = limit.unit.name().to_lowercase();
        if limit.requests_per_unit > 0 && limit.limit().is_none() {
            let error = Limit::new(u64::from(limit.requests_per_unit), limit.window())
                .check()
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            return Err(self.error(
                node,
                &join(field, "unit_multiplier"),
                format!(
                    "{} {unit}s: {error}; use a smaller unit_multiplier",
                    limit.unit_multiplier
                ),
            ));
        }
        if let Some(l) = limit.limit() {
            limit.kind.check(l).map_err(|e| {
                self.error(
                    node,
                    field,
                    format!("{} per {unit}: {e}", limit.requests_per_unit),
                )
            })?;
        }
        Ok(())
    }

    /// `lease_slack` (`"N%"` of the limit, or a whole number of units) and `lease_ttl` (a
    /// period), refused where no lease could use them on a limit of `requests_per_unit`.
    pub(super) fn lease(
        &self,
        fields: &HashMap<&str, &Node>,
        field: &str,
        requests_per_unit: u32,
    ) -> Result<Option<limiter_stack::Lease>, RulesError> {
        use limiter_stack::{LEASE_TTL_RANGE, Lease, Slack};
        let Some(slack) = fields.get("lease_slack") else {
            if let Some(ttl) = fields.get("lease_ttl") {
                return Err(self.error(
                    ttl,
                    &join(field, "lease_ttl"),
                    "needs `lease_slack`: add `lease_slack: \"1%\"` (or remove `lease_ttl`)",
                ));
            }
            return Ok(None);
        };
        let path = join(field, "lease_slack");
        let text = self.text(slack, &path)?;
        let value = match text.parse::<u64>() {
            Ok(units) => Slack::units(units),
            Err(_) => limiter_core::text::parse_percent(&text)
                .map(Slack::PartsPerMillion)
                .ok_or_else(|| {
                    self.error(
                        slack,
                        &path,
                        format!(
                            "`{text}` is no slack: write a share of the limit such as \"1%\", or a whole number of units such as 10"
                        ),
                    )
                })?,
        };
        if let Some(reason) = value.refusal(u64::from(requests_per_unit)) {
            return Err(self.error(slack, &path, reason));
        }
        let mut lease = Lease::new(value);
        if let Some(ttl) = fields.get("lease_ttl") {
            let path = join(field, "lease_ttl");
            let text = self.text(ttl, &path)?;
            let (least, most) = LEASE_TTL_RANGE;
            let period =
                limiter_core::text::parse_period(&text).filter(|p| *p >= least && *p <= most);
            let Some(period) = period else {
                return Err(self.error(
                    ttl,
                    &path,
                    format!("`{text}` is no time to live: write one from {least:?} to {most:?}, such as \"1s\""),
                ));
            };
            lease = lease.ttl(period);
        }
        Ok(Some(lease))
    }

    /// `replaces`: the names of the limits this one replaces.
    pub(super) fn replaces(
        &self,
        fields: &HashMap<&str, &Node>,
        field: &str,
        name: &str,
    ) -> Result<Vec<String>, RulesError> {
        let mut replaces = Vec::new();
        let Some(list) = fields.get("replaces") else {
            return Ok(replaces);
        };
        if list.is_null() {
            return Ok(replaces);
        }
        let path = join(field, "replaces");
        let Value::Sequence(items) = &list.value else {
            return Err(self.error(
                list,
                &path,
                format!(
                    "is {}, not a list: write `- name: OTHER` items",
                    list.describe()
                ),
            ));
        };
        for (i, item) in items.iter().enumerate() {
            let item_path = format!("{path}[{i}]");
            let entry = self.mapping(item, &item_path, &["name"])?;
            let Some(replaced) = entry.get("name") else {
                return Err(self.error(
                    item,
                    &join(&item_path, "name"),
                    "missing: name the limit this one replaces",
                ));
            };
            let replaced_name = self.text(replaced, &join(&item_path, "name"))?;
            if replaced_name == name {
                return Err(self.error(
                    replaced,
                    &join(&item_path, "name"),
                    "a limit cannot replace itself: name another limit",
                ));
            }
            replaces.push(replaced_name);
        }
        Ok(replaces)
    }
}
