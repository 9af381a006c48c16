//! What the engine is asked ([`Item`]: a policy or an ad-hoc limit, an identifier, a cost
//! and how to charge it) and what it answers ([`Answer`], who decided it), and its errors.

use limiter_stack::{Charge, Origin};

use super::*;

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A policy of the engine.
    Policy(PolicyId),
    /// `limit` per `duration_ms`, keyed by namespace and identifier.
    AdHoc {
        /// The algorithm.
        kind: Kind,
        /// Units per duration (and the burst).
        limit: u64,
        /// The duration in milliseconds.
        duration_ms: u64,
        /// Keeps one caller's identifiers apart from another's.
        namespace: String,
    },
}

/// One decision asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item {
    /// Which limits.
    pub target: Target,
    /// Whose state: shared, so the decision's key is this very allocation (a policy's stack
    /// keys by it), not a copy made per decision.
    pub identifier: Arc<str>,
    /// Units; 0 only reports.
    pub cost: u64,
    /// Evaluated and reported but never enforced: a denial of this item does not deny the
    /// batch (envoy's `shadow_mode`).
    pub shadow: bool,
    /// What the item does to its limits: takes `cost` units, records them (usage that already
    /// happened: counted whatever the limits hold, never denying, written even when its batch
    /// is denied), or gives them back (envoy's `is_negative_hits`).
    pub charge: Charge,
}

impl Item {
    /// Whether the item never denies its batch: a shadow check, a record, a unit refund.
    pub(super) fn never_denies(&self) -> bool {
        self.shadow || self.charge != Charge::Take
    }
}

/// The name the API reports for who answered: the seam's [`Origin`] (`memory`, `redis`,
/// `deny_cache`, `fallback`, `lease`), or `fail_open` (`None`: the store failed and the policy
/// admitted without counting).
pub fn source_name(origin: Option<Origin>) -> &'static str {
    match origin {
        Some(Origin::InProcess) => "memory",
        Some(Origin::DenyCache) => "deny_cache",
        Some(Origin::Fallback) => "fallback",
        Some(Origin::Lease) => "lease",
        // The seam's one remote store here is Redis.
        Some(_) => "redis",
        None => "fail_open",
    }
}

/// The answer for one item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The decision (least remaining, longest waits across the stack's limits).
    pub decision: Decision,
    /// Who answered (the one "who decided" type of the workspace); `None` when the store
    /// failed and the policy admitted without counting ([`source_name`] names it for the API).
    pub origin: Option<Origin>,
    /// When it was decided, in nanoseconds since the Unix epoch (by Redis's clock for Redis's
    /// answers and a lease's, by this process's otherwise): the instant its waits count from,
    /// so `at_unix_ns + reset_after` is when the limits are full again.
    pub at_unix_ns: u64,
}

impl Answer {
    /// When the limits are full again, in whole milliseconds since the Unix epoch (rounded
    /// up): the same instant for every answer about one window.
    pub fn reset_at_ms(&self) -> u64 {
        self.at_unix_ns
            .saturating_add(self.decision.reset_after_nanos())
            .div_ceil(1_000_000)
    }
}

/// How far ahead of this server's clock a request's `time` may be (a client's clock running
/// fast): such a time is decided at the server's own reading, and one further ahead is refused.
pub const MAX_TIME_AHEAD_MS: u64 = 5_000;

/// Why a request could not be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// The request is one no limit can ever decide: a cost above the burst (`field` is
    /// `cost`), or an ad-hoc limit no algorithm can count (`limit`).
    #[error("{message}")]
    Invalid {
        /// The request field at fault.
        field: &'static str,
        /// What was wrong and how to fix it.
        message: String,
        /// Which of the items asked together it is the field of (its position), where one
        /// is at fault; an API that takes several names the field by it (`requests[1].cost`).
        item: Option<usize>,
    },
    /// Too many distinct ad-hoc limits.
    #[error(
        "this process already serves {MAX_AD_HOC_SHAPES} distinct ad-hoc limits: configure a \
         policy for this one"
    )]
    TooManyShapes,
    /// The backend failed and the policy refuses.
    #[error("the store is unavailable ({0}); try again later")]
    Unavailable(String),
    /// A bounded store holds its `max_keys` and none is full again yet: a new identifier
    /// must wait (held ones go on).
    #[error("{0}")]
    Full(String),
}

impl DecideError {
    /// The error of a request field (see [`Invalid`](Self::Invalid)), no item named.
    pub(crate) fn invalid(field: &'static str, message: String) -> Self {
        Self::Invalid {
            field,
            message,
            item: None,
        }
    }

    /// This error, named as the item at `index` of those asked together caused it (an
    /// invalid field is then that item's; one already named keeps its item).
    pub(crate) fn in_item(self, index: usize) -> Self {
        match self {
            Self::Invalid {
                field,
                message,
                item: None,
            } => Self::Invalid {
                field,
                message,
                item: Some(index),
            },
            other => other,
        }
    }
}
