//! Calendar quotas of policies on Redis (`period = "1mo", calendar = "Europe/Berlin"` with a
//! Redis store): kept beside the policy's stack, whose script knows no calendar, one Redis
//! script call each ([`RedisQuota`]), with the same boundaries as
//! in process. In memory a calendar window is one of the stack's own limits instead.
//!
//! A policy that falls back (`on_failure = "fallback"`) keeps a counter per quota in this
//! process that stands in while Redis fails, with this node's share of the count (`count /
//! fleet_size`, so the fleet never counts more than `count` in a window; a share of 0
//! refuses), kept across reloads as the permits' tables are.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use limiter_calendar::{Calendar, CalendarCounter, KeyedCalendarWindow};
use limiter_core::{Decision, MonotonicClock};
use limiter_store::ShardedStore;

use super::{BackendError, Keying, OnFailure, RedisBackend, RedisQuota};

/// One calendar quota of a policy on Redis, and how it is keyed.
#[derive(Clone, Debug)]
pub struct PolicyQuota {
    quota: RedisQuota,
    keying: Keying,
    on_failure: OnFailure,
    /// A falling-back policy's stand-in while Redis fails.
    fallback: Option<Arc<LocalQuota>>,
    /// Its place among its keying's limits, as the layer holding them all in memory numbers
    /// them (for errors worded as in memory).
    limit_index: usize,
}

/// What a quota counted (or would have), and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaTaken {
    /// Admitted (the units counted) or denied (nothing counted); `reset_after` and a denial's
    /// `retry_after` are the time to the window's end.
    pub decision: Decision,
    /// Where it was counted, for a refund.
    pub place: CountedIn,
    /// The instant (ns since the Unix epoch) the decision's waits are measured from: it plus
    /// `reset_after` is the window's end exactly.
    pub at_unix_ns: u64,
    /// The Redis failure a falling-back policy's stand-in counted it for (`None`: Redis
    /// counted it, or nothing did), so the caller can say what sent the call there.
    pub fell_back: Option<Arc<str>>,
}

/// Where a quota counted a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountedIn {
    /// The fleet's counter on Redis, in the window of that number.
    Redis {
        /// The window's number.
        window: u64,
    },
    /// This node's stand-in while Redis failed, at that Unix time (ns).
    Fallback {
        /// When it was counted.
        at_unix_ns: u64,
    },
    /// Nowhere: Redis failed and the policy fails open (the whole window reported left).
    Nowhere,
}

/// This node's share of a quota while Redis fails: a calendar window counter per key, or none
/// when the share is 0 (the fleet is larger than the count: every call is refused).
#[derive(Debug)]
pub struct LocalQuota {
    counter: Option<KeyedCalendarWindow<String>>,
    calendar: Calendar,
    /// This node's share of the count: what the counter counts to.
    share: u64,
}

/// The stand-ins of falling-back policies' quotas by quota name, shared by the stacks a reload
/// builds: what a node counted while Redis failed survives a reload of the same quota.
pub(crate) type QuotaTables = Arc<Mutex<HashMap<String, Arc<LocalQuota>>>>;

impl LocalQuota {
    /// `count / fleet` per window of `calendar`, on Unix time (the counter's reading 0 is the
    /// epoch: each call passes the instant it is counted at).
    fn new(count: u64, fleet: u64, calendar: Calendar) -> Self {
        let share = count / fleet.max(1);
        let counter = CalendarCounter::new(share, calendar.clone(), 0)
            .ok()
            // The OS clock keeps the wall clock's rate: never refused.
            .and_then(|algorithm| {
                KeyedCalendarWindow::from_algorithm(
                    algorithm,
                    MonotonicClock::new(),
                    ShardedStore::new(),
                )
                .ok()
            });
        Self {
            counter,
            calendar,
            share,
        }
    }

    /// The table named `name` in `tables` if it counts the same share (`count / fleet`) by
    /// `calendar`, else a new one put there (a reload that changed the quota starts it afresh).
    pub(crate) fn shared(
        tables: &QuotaTables,
        name: &str,
        count: u64,
        fleet: u64,
        calendar: &Calendar,
    ) -> Arc<Self> {
        let mut tables = tables.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(table) = tables.get(name)
            && table.share == count / fleet.max(1)
            && table.calendar == *calendar
        {
            return Arc::clone(table);
        }
        let table = Arc::new(Self::new(count, fleet, calendar.clone()));
        tables.insert(name.to_owned(), Arc::clone(&table));
        table
    }

    /// Counts `cost` units for `key` at `at_unix_ns` (`record`: whatever the window holds): a
    /// cost above the share (or a share of 0) is refused until the window ends, as Redis
    /// refuses a cost above the count.
    fn take(&self, key: &str, cost: u64, at_unix_ns: u64, record: bool) -> QuotaTaken {
        let place = CountedIn::Fallback { at_unix_ns };
        let decided = self.counter.as_ref().map(|counter| {
            if record {
                counter.record_key_at(key, cost, at_unix_ns)
            } else {
                counter.check_key_at(key, cost, at_unix_ns)
            }
        });
        let decision = match decided {
            Some(Ok(decision)) => decision,
            Some(Err(_)) | None => self.refused(at_unix_ns),
        };
        QuotaTaken {
            decision,
            place,
            at_unix_ns,
            // Set by the caller, which knows the failure.
            fell_back: None,
        }
    }

    fn refused(&self, at_unix_ns: u64) -> Decision {
        let wait = self
            .calendar
            .window(at_unix_ns)
            .map_or(1, |w| w.end_unix_ns.saturating_sub(at_unix_ns).max(1));
        Decision::deny(self.share, 0, wait, wait)
    }

    fn refund(&self, key: &str, units: u64, granted_at: u64, now: u64) {
        if let Some(counter) = &self.counter {
            let _ = counter.refund_key_at(key, units, granted_at, now);
        }
    }
}

/// A quota's store failed: why, and whether the policy refuses then.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuotaFailure {
    /// What failed.
    pub message: String,
    /// Whether the policy refuses while its store fails (`on_failure = "closed"`).
    pub closed: bool,
}

impl PolicyQuota {
    /// The calendar quotas `quotas` (each its count, keying and calendar, in the policy's
    /// order) of a policy failing as `on_failure`, kept beside its stack on `backend` under
    /// `name`. A falling-back policy's quotas have a stand-in each from `tables`, counting
    /// `count / fleet`.
    pub(crate) fn of(
        quotas: impl IntoIterator<Item = (u64, Keying, Calendar, usize)>,
        on_failure: OnFailure,
        backend: &RedisBackend,
        name: &str,
        (tables, fleet): (&QuotaTables, u64),
    ) -> Result<Vec<Self>, limiter_stack::BuildError> {
        quotas
            .into_iter()
            .enumerate()
            .map(|(i, (count, keying, calendar, limit_index))| {
                let quota_name = format!("{name}:{i}");
                let fallback = (on_failure == OnFailure::Fallback)
                    .then(|| LocalQuota::shared(tables, &quota_name, count, fleet, &calendar));
                let quota = backend
                    .quota(&quota_name, count, calendar)?
                    .with_prefix(super::KEY_PREFIX)?;
                Ok(Self {
                    quota,
                    keying,
                    on_failure,
                    fallback,
                    limit_index,
                })
            })
            .collect()
    }

    /// Why `cost` units can never be taken in one window, worded as the same limit in a stack
    /// in memory words it; `None` within the count.
    pub fn unreachable(&self, cost: u64) -> Option<limiter_stack::CallError> {
        let burst = self.quota.count();
        (cost > burst).then(|| limiter_stack::CallError::Decision {
            layer: self.keying.layer_name().to_owned(),
            limit_index: self.limit_index,
            source: limiter_core::DecisionError::CostExceedsBurst { cost, burst },
        })
    }

    /// What the quota answers while its store fails and its policy fails open: nothing
    /// counted, the whole window left (as a stack failing open reports its limits).
    pub fn failed_open(&self, at_unix_ns: u64) -> QuotaTaken {
        let count = self.quota.count();
        QuotaTaken {
            decision: limiter_core::Decision::allow(count, count, 0),
            place: CountedIn::Nowhere,
            at_unix_ns,
            fell_back: None,
        }
    }

    fn key<'a>(&self, identifier: &'a str) -> &'a str {
        match self.keying {
            Keying::Identifier => identifier,
            Keying::Global => "",
        }
    }

    /// Counts `cost` units for `identifier` at `at_unix_ns` (this process's clock: Redis's
    /// decides the window); while Redis fails, a falling-back policy's stand-in counts them.
    pub async fn take(
        &self,
        identifier: &str,
        cost: u64,
        at_unix_ns: u64,
    ) -> Result<QuotaTaken, QuotaFailure> {
        self.count(identifier, cost, at_unix_ns, false).await
    }

    /// Records `cost` units already used by `identifier` at `at_unix_ns`, whatever the window
    /// holds (as a record counts on every limit); while Redis fails, a falling-back policy's
    /// stand-in records them.
    pub async fn record(
        &self,
        identifier: &str,
        cost: u64,
        at_unix_ns: u64,
    ) -> Result<QuotaTaken, QuotaFailure> {
        self.count(identifier, cost, at_unix_ns, true).await
    }

    async fn count(
        &self,
        identifier: &str,
        cost: u64,
        at_unix_ns: u64,
        record: bool,
    ) -> Result<QuotaTaken, QuotaFailure> {
        let key = self.key(identifier);
        let counted = if record {
            self.quota.record(key, cost, at_unix_ns).await
        } else {
            self.quota.take(key, cost, at_unix_ns).await
        };
        match counted {
            Ok(answer) => Ok(QuotaTaken {
                decision: answer.decision,
                place: CountedIn::Redis {
                    window: answer.window,
                },
                at_unix_ns,
                fell_back: None,
            }),
            Err(error) => match &self.fallback {
                Some(local) => Ok(QuotaTaken {
                    fell_back: Some(Arc::from(error.to_string())),
                    ..local.take(key, cost, at_unix_ns, record)
                }),
                None => Err(self.failed(&error)),
            },
        }
    }

    /// Gives back `units` counted by `taken` at `now_unix_ns`, where they were counted (best
    /// effort: a failure leaves them counted).
    pub async fn refund(&self, identifier: &str, units: u64, taken: &QuotaTaken, now_unix_ns: u64) {
        let key = self.key(identifier);
        match (taken.place, &self.fallback) {
            (CountedIn::Redis { window }, _) => {
                let _ = self.quota.refund(key, units, window).await;
            }
            (CountedIn::Fallback { at_unix_ns }, Some(local)) => {
                local.refund(key, units, at_unix_ns, now_unix_ns);
            }
            (CountedIn::Fallback { .. }, None) | (CountedIn::Nowhere, _) => {}
        }
    }

    fn failed(&self, error: &BackendError) -> QuotaFailure {
        QuotaFailure {
            message: error.to_string(),
            closed: self.on_failure == OnFailure::Closed,
        }
    }
}

#[cfg(test)]
mod tests {
    use limiter_calendar::CalendarUnit;

    use super::*;

    /// 2026-11-27 12:00 UTC, in Unix ns.
    const NOON: u64 = 1_795_262_400_000_000_000;
    const HOUR: u64 = 3_600_000_000_000;

    fn day() -> Calendar {
        Calendar::new(CalendarUnit::Day, "UTC").expect("UTC")
    }

    #[test]
    fn a_stand_in_counts_the_nodes_share_and_refunds_only_its_window() {
        let local = LocalQuota::new(7, 3, day());
        let taken = |cost, at| local.take("ann", cost, at, false).decision;
        assert!(taken(2, NOON).is_allowed(), "7 / 3 = 2 a day here");
        let over = taken(1, NOON);
        assert!(over.is_denied());
        assert_eq!(over.retry_after().as_secs(), 12 * 3600, "until midnight");
        assert!(taken(3, NOON).is_denied(), "a cost above the share");
        local.refund("ann", 1, NOON, NOON + HOUR);
        assert!(taken(1, NOON + HOUR).is_allowed(), "refunded in its window");
        // Yesterday's units do not come back into today's window.
        let tomorrow = NOON + 24 * HOUR;
        assert!(taken(2, tomorrow).is_allowed());
        local.refund("ann", 2, NOON, tomorrow);
        assert!(taken(1, tomorrow).is_denied());
        // A record is written whatever the share holds: bob's day is then in debt.
        let recorded = local.take("bob", 5, NOON, true).decision;
        assert!(recorded.is_denied(), "5 recorded against a share of 2");
        assert!(local.take("bob", 0, NOON, false).decision.is_denied());
    }

    #[test]
    fn a_share_of_nothing_refuses_until_the_window_ends() {
        let local = LocalQuota::new(2, 3, day());
        let refused = local.take("ann", 1, NOON, false).decision;
        assert!(refused.is_denied());
        assert_eq!(refused.limit(), 0);
        assert_eq!(refused.retry_after().as_secs(), 12 * 3600);
    }

    #[test]
    fn a_reload_keeps_a_stand_in_unless_its_quota_changed() {
        let tables = QuotaTables::default();
        let first = LocalQuota::shared(&tables, "p:0", 10, 2, &day());
        assert!(first.take("ann", 5, NOON, false).decision.is_allowed());
        let same = LocalQuota::shared(&tables, "p:0", 10, 2, &day());
        assert!(Arc::ptr_eq(&first, &same), "what was counted survives");
        assert!(same.take("ann", 1, NOON, false).decision.is_denied());
        let changed = LocalQuota::shared(&tables, "p:0", 10, 5, &day());
        assert!(
            !Arc::ptr_eq(&first, &changed),
            "a new fleet size is a new share"
        );
        assert!(changed.take("ann", 2, NOON, false).decision.is_allowed());
    }
}
