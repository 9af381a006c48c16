//! The answer as the reference sends it: each descriptor's status and current limit, the
//! response headers, and the dynamic metadata.

use std::time::Duration;

use limiter_core::Decision;

use crate::decider::{Answer, Decider, RuleStats};

use super::*;

impl<L: Copy + PartialEq, S: RuleStats> Envoy<L, S> {
    /// A request with more than [`MAX_DESCRIPTORS`] descriptors: over, counting nothing.
    pub(super) fn too_many(&self, request: &Request) -> Response {
        let statuses: Vec<Status> = request
            .descriptors
            .iter()
            .map(|_| Status {
                code: Code::OverLimit,
                current_limit: None,
                limit_remaining: 0,
                duration_until_reset: None,
            })
            .collect();
        Response {
            overall: Code::OverLimit,
            headers: Vec::new(),
            dynamic_metadata: None,
            statuses,
        }
    }

    /// One descriptor's status, counting its reference-style statistics.
    pub(super) fn status<D: Decider<Limit = L, Stats = S>>(
        &self,
        index: usize,
        plan: &Plan<'_, L, S>,
        (decided, recorded): (Option<&Answer>, Option<Answer>),
        outcome: &mut Outcome,
        engine: &D,
    ) -> Status {
        let (shown, stats, status, hits) = match found(plan, decided, recorded) {
            Found::Final(status) => return status,
            Found::Limited {
                shown,
                stats,
                status,
                hits,
            } => (shown, stats, status, hits),
        };
        let over = status.code == Code::OverLimit;
        if stats.quota {
            outcome.quota_mode = true;
            if over {
                outcome.quota_violations.push(index);
            }
        } else if over && self.global(stats) {
            outcome.shadowed_globally = true;
        } else if over && !stats.shadow {
            outcome.over = true;
        }
        if stats.limit.is_some() {
            self.count_statistics(stats, shown, &status, hits, engine);
        }
        // Shadow and quota-mode limits are answered OK whatever they found.
        if over && (stats.shadow || stats.quota) {
            return Status {
                code: Code::Ok,
                ..status
            };
        }
        status
    }

    /// A configured limit's reference statistics for one descriptor: total hits, over or
    /// within the limit, shadowed, and near the limit (past `near_limit_ratio` of it).
    fn count_statistics<D: Decider<Limit = L, Stats = S>>(
        &self,
        stats: &Stats<'_, S>,
        shown: &CurrentLimit,
        status: &Status,
        hits: u64,
        engine: &D,
    ) {
        let count = |stat: &'static str, n: u64| {
            if let Some(counters) = stats.counters {
                counters.add(stat, n);
            }
            if let Some(key) = &stats.detailed_key {
                engine.stat(key, stat, n);
            }
        };
        count("total_hits", hits);
        if status.code == Code::OverLimit {
            count("over_limit", hits.max(1));
            if stats.shadow {
                count("shadow_mode", hits.max(1));
            }
            return;
        }
        count("within_limit", hits);
        let used =
            u64::from(shown.requests_per_unit).saturating_sub(u64::from(status.limit_remaining));
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let threshold =
            (f64::from(shown.requests_per_unit) * self.options.near_limit_ratio).floor() as u64;
        if hits > 0 && used > threshold {
            count("near_limit", hits.min(used - threshold));
        }
    }

    /// The rate-limit headers, from the status closest to its limit (least remaining, then
    /// latest reset), when enabled.
    pub(super) fn headers(&self, statuses: &[Status]) -> Vec<(String, String)> {
        let Some(names) = &self.options.headers else {
            return Vec::new();
        };
        let closest = statuses
            .iter()
            .filter(|s| s.current_limit.is_some())
            .min_by_key(|s| {
                (
                    s.limit_remaining,
                    std::cmp::Reverse(s.duration_until_reset.unwrap_or_default()),
                )
            });
        let Some(status) = closest else {
            return Vec::new();
        };
        let limit = status
            .current_limit
            .as_ref()
            .map_or(0, |l| l.requests_per_unit);
        let reset = status.duration_until_reset.unwrap_or_default();
        // Whole seconds, rounded up: a client that waits that long finds the window reset.
        let reset = reset.as_secs() + u64::from(reset.subsec_nanos() > 0);
        vec![
            (names.limit.clone(), limit.to_string()),
            (names.remaining.clone(), status.limit_remaining.to_string()),
            (names.reset.clone(), reset.to_string()),
        ]
    }

    /// The answer's dynamic metadata, if any.
    pub(super) fn metadata(
        &self,
        request: &Request,
        outcome: &Outcome,
    ) -> Option<serde_json::Map<String, serde_json::Value>> {
        use serde_json::{Value, json};
        let mut out = serde_json::Map::new();
        if self.options.dynamic_metadata {
            out.insert("domain".into(), json!(request.domain));
            let descriptors: Vec<Value> = request
                .descriptors
                .iter()
                .map(|d| {
                    let entries: Vec<Value> = d
                        .entries
                        .iter()
                        .map(|(k, v)| json!(format!("{k}={v}")))
                        .collect();
                    json!({ "entries": entries })
                })
                .collect();
            out.insert("descriptors".into(), Value::Array(descriptors));
            out.insert("hitsAddend".into(), json!(request.hits_addend.max(1)));
        }
        if outcome.quota_mode {
            out.insert("quotaModeEnabled".into(), json!(true));
            out.insert(
                "quotaModeViolations".into(),
                json!(outcome.quota_violations),
            );
        }
        (!out.is_empty()).then_some(out)
    }
}

pub(super) fn counted_status(shown: &CurrentLimit, decision: &Decision) -> Status {
    let remaining = u32::try_from(decision.remaining()).unwrap_or(u32::MAX);
    if decision.is_allowed() {
        Status {
            code: Code::Ok,
            current_limit: Some(shown.clone()),
            limit_remaining: remaining,
            duration_until_reset: Some(Duration::from_nanos(decision.reset_after_nanos())),
        }
    } else {
        Status {
            code: Code::OverLimit,
            current_limit: Some(shown.clone()),
            limit_remaining: 0,
            duration_until_reset: Some(Duration::from_nanos(decision.retry_after_nanos())),
        }
    }
}

/// What a descriptor's plan and answers come to before its statistics.
enum Found<'p, 'a, S> {
    /// No configured limit counted it: the status is final.
    Final(Status),
    /// A limit answered: its status (before shadow and quota mode) and the hits it counted.
    Limited {
        shown: &'p CurrentLimit,
        stats: &'p Stats<'a, S>,
        status: Status,
        hits: u64,
    },
}

/// The status a plan's answers give, before statistics and modes.
fn found<'p, 'a, L, S>(
    plan: &'p Plan<'a, L, S>,
    decided: Option<&Answer>,
    recorded: Option<Answer>,
) -> Found<'p, 'a, S> {
    let ok = |current_limit, limit_remaining, duration_until_reset| {
        Found::Final(Status {
            code: Code::Ok,
            current_limit,
            limit_remaining,
            duration_until_reset,
        })
    };
    let over = |shown: &CurrentLimit, duration_until_reset| Status {
        code: Code::OverLimit,
        current_limit: Some(shown.clone()),
        limit_remaining: 0,
        duration_until_reset,
    };
    match (plan, decided) {
        (Plan::GivenBack { shown, answer }, _) => ok(
            Some(shown.clone()),
            answer.map_or(0, |a| {
                u32::try_from(a.decision.remaining()).unwrap_or(u32::MAX)
            }),
            answer.map(|a| Duration::from_nanos(a.decision.reset_after_nanos())),
        ),
        (Plan::Free, _) => ok(None, 0, None),
        (Plan::Unlimited, _) => ok(None, u32::MAX, None),
        (Plan::Refused { shown, stats, item }, _) => {
            // Hits above the limit were recorded (the counter is over until it resets); a
            // limit of 0 counts nothing.
            let status = match &recorded {
                Some(answer) => Status {
                    code: Code::OverLimit,
                    ..counted_status(shown, &answer.decision)
                },
                None => over(shown, Some(shown.unit.duration())),
            };
            let hits = item
                .as_ref()
                .filter(|_| recorded.is_some())
                .map_or(0, |i| i.cost);
            Found::Limited {
                shown,
                stats,
                status,
                hits,
            }
        }
        // A check (0 hits) is over only while its counter is over its limit (a debt):
        // exactly at the limit it is OK with nothing left, as in the reference.
        (Plan::Counted { shown, stats, item }, Some(answer)) => Found::Limited {
            shown,
            stats,
            status: counted_status(shown, &answer.decision),
            hits: item.cost,
        },
        // The engine answers every item; were one missing, say over.
        (Plan::Counted { shown, stats, .. }, None) => Found::Limited {
            shown,
            stats,
            status: over(shown, None),
            hits: 0,
        },
    }
}
