//! What envoy's service decides on: a [`Decider`] counts the limits the descriptor files
//! configure (added once, by [`Decider::add_limit`]) and the ones envoy sends with a request
//! (ad hoc), deciding a request's items all or nothing. The service that mounts this crate
//! implements it (limiterd, on its engine: in memory or on Redis), and owns the statistics.

use std::error::Error;
use std::fmt::Debug;
use std::future::Future;

use limiter_core::{Decision, Limit, LimitError};
pub use limiter_stack::Charge;
use limiter_stack::Kind;
use limiter_stack::Lease;

/// Which counter an item is decided on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target<L> {
    /// A limit of the descriptor files, as [`Decider::add_limit`] returned it.
    Limit(L),
    /// A limit envoy sent with the descriptor: `limit` per `duration_ms`, counted by `kind`,
    /// keyed by `namespace` and the identifier.
    AdHoc {
        /// The algorithm.
        kind: Kind,
        /// Units per duration (and the burst).
        limit: u64,
        /// The duration in milliseconds.
        duration_ms: u64,
        /// Keeps one domain and unit's counters apart from another's.
        namespace: String,
    },
}

/// One decision asked of the [`Decider`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Item<L> {
    /// Which counter.
    pub target: Target<L>,
    /// Whose state: the descriptor's entries as one key.
    pub identifier: String,
    /// Units; 0 only reports.
    pub cost: u64,
    /// Decided and reported, but a denial does not deny the request.
    pub shadow: bool,
    /// What the units do: taken (`Take`), recorded as the reference counts hits that go over
    /// (`Record`), or given back (`Refund`, `is_negative_hits`; decided alone).
    pub charge: Charge,
}

/// One item's answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The counter's decision (what it holds, when it is full again).
    pub decision: Decision,
}

/// A configured limit, as the decider is asked to count it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSpec {
    /// The algorithm.
    pub kind: Kind,
    /// The limit.
    pub limit: Limit,
    /// Leasing, on a store that leases (`lease_slack`).
    pub lease: Option<Lease>,
}

/// Why a configured limit was not added.
#[derive(Debug, thiserror::Error)]
pub enum AddLimitError {
    /// The decider's store cannot count the limit.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The decider refused it.
    #[error(transparent)]
    Refused(Box<dyn Error + Send + Sync>),
}

/// One configured descriptor path's statistics (`total_hits`, `within_limit`, `over_limit`,
/// `near_limit`, `shadow_mode`), counted where the decider keeps its metrics.
pub trait RuleStats: Clone + Debug + Send + Sync {
    /// Adds `n` to `stat` (another name counts nothing).
    fn add(&self, stat: &str, n: u64);
}

/// What envoy's service decides on (see the module docs).
pub trait Decider: Send + Sync {
    /// A configured limit's handle.
    type Limit: Copy + Debug + PartialEq + Send + Sync;
    /// A configured limit's statistics.
    type Stats: RuleStats;

    /// Counts `limit` from now on, as `name` in the metrics, its state under `stack_name`
    /// (stable across processes, so a fleet on one store shares each counter).
    fn add_limit(
        &mut self,
        name: &str,
        stack_name: &str,
        limit: &LimitSpec,
    ) -> Result<Self::Limit, AddLimitError>;

    /// Decides `items` all or nothing: whether every enforced item was admitted (each took
    /// its units), and each item's answer in order. A request no counter can decide is
    /// [`EnvoyError::Invalid`]; a store that cannot decide, [`EnvoyError::Unavailable`].
    fn decide(
        &self,
        items: &[Item<Self::Limit>],
    ) -> impl Future<Output = Result<(bool, Vec<Answer>), EnvoyError>> + Send;

    /// The statistics of the configured descriptor path `full_key`.
    fn rule_stats(&self, full_key: &str) -> Self::Stats;

    /// Adds `n` to the statistic `stat` of the descriptor key `key` (a per-value metric, or
    /// `""` for the service's own, such as `global_shadow_mode`).
    fn stat(&self, key: &str, stat: &'static str, n: u64);
}

/// A request that cannot be decided.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvoyError {
    /// The request is malformed (gRPC `INVALID_ARGUMENT`, HTTP 400); names the field.
    #[error("{0}")]
    Invalid(String),
    /// No domain or no descriptors: nothing to decide (gRPC `UNKNOWN`, as the reference
    /// answers; HTTP 400).
    #[error("{0}")]
    Empty(String),
    /// The store failed and the policy refuses, or is full (gRPC `UNAVAILABLE`, HTTP 503).
    #[error("{0}")]
    Unavailable(String),
}
