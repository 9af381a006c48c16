//! Calendar quotas of policies on Redis (`period = "1mo", calendar = "Europe/Berlin"` with a
//! Redis store): kept beside the policy's stack, whose script knows no calendar, one Redis
//! script call each ([`RedisQuota`]), with the same boundaries as
//! in process. In memory a calendar window is one of the stack's own limits instead.

use crate::backend::{BackendError, OnFailure, QuotaAnswer, RedisBackend, RedisQuota};
use crate::config::{Keying, Policy};

/// One calendar quota of a policy on Redis, and how it is keyed.
#[derive(Clone, Debug)]
pub struct PolicyQuota {
    quota: RedisQuota,
    keying: Keying,
    on_failure: OnFailure,
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
    /// Every calendar quota of `policy` kept beside its stack, on `backend` under `name`.
    pub(crate) fn of(
        policy: &Policy,
        backend: &RedisBackend,
        name: &str,
    ) -> Result<Vec<Self>, limiter_stack::BuildError> {
        let beside = policy
            .limits
            .iter()
            .filter(|l| l.limit.is_quota_beside_stack())
            .filter_map(|l| Some((l, l.limit.calendar()?)));
        beside
            .enumerate()
            .map(|(i, (l, spec))| {
                let calendar = spec
                    .calendar()
                    .map_err(|e| limiter_stack::BuildError::Quota {
                        name: name.to_owned(),
                        reason: e.to_string(),
                    })?;
                let quota = backend
                    .quota(&format!("{name}:{i}"), l.limit.limit().count(), calendar)?
                    .with_prefix(crate::backend::KEY_PREFIX)?;
                Ok(Self {
                    quota,
                    keying: l.keying,
                    on_failure: policy.on_failure,
                })
            })
            .collect()
    }

    fn key<'a>(&self, identifier: &'a str) -> &'a str {
        match self.keying {
            Keying::Identifier => identifier,
            Keying::Global => "",
        }
    }

    /// Counts `cost` units for `identifier` at `at_unix_ns` (this process's clock: Redis's
    /// decides the window).
    pub async fn take(
        &self,
        identifier: &str,
        cost: u64,
        at_unix_ns: u64,
    ) -> Result<QuotaAnswer, QuotaFailure> {
        self.quota
            .take(self.key(identifier), cost, at_unix_ns)
            .await
            .map_err(|e| self.failed(&e))
    }

    /// Gives back `units` counted by `answer` (best effort: a failure leaves them counted).
    pub async fn refund(&self, identifier: &str, units: u64, answer: &QuotaAnswer) {
        let _ = self
            .quota
            .refund(self.key(identifier), units, answer.window)
            .await;
    }

    fn failed(&self, error: &BackendError) -> QuotaFailure {
        QuotaFailure {
            message: error.to_string(),
            closed: self.on_failure == OnFailure::Closed,
        }
    }
}
