//! How a leased stack is checked on Redis (the lease's specification, [`Lease`] and
//! [`Slack`], is limiter-stack's) and what the leases did ([`LeaseStats`]).

use crate::error::BuildError;
use crate::spec::RedisLimit;

pub use limiter_stack::{DEFAULT_LEASE_TTL, LEASE_TTL_RANGE, Lease, Slack};

/// The slack of `limit`, in units.
pub(super) fn slack_of(slack: Slack, limit: &RedisLimit) -> u64 {
    slack.of_burst(limit.burst())
}

/// Refuses a slack no lease can use on `limit` (see [`Slack::refusal`]).
pub(super) fn check_slack(
    slack: Slack,
    stack: &str,
    layer: &str,
    limit: &RedisLimit,
) -> Result<(), BuildError> {
    match slack.refusal(limit.burst()) {
        Some(reason) => Err(BuildError::Lease {
            stack: stack.to_owned(),
            reason: format!("layer `{layer}`, limit {}: {reason}", limit.limit()),
        }),
        None => Ok(()),
    }
}

/// Refuses a lease whose time to live is outside [`LEASE_TTL_RANGE`].
pub(super) fn check_lease(lease: &Lease, stack: &str) -> Result<(), BuildError> {
    let (least, most) = LEASE_TTL_RANGE;
    let ttl = lease.time_to_live();
    if ttl < least || ttl > most {
        return Err(BuildError::Lease {
            stack: stack.to_owned(),
            reason: format!(
                "a lease time to live of {ttl:?} is outside {least:?} to {most:?}; choose one in that range (1s suits most)"
            ),
        });
    }
    Ok(())
}

/// Counts of what a leased stack did, since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeaseStats {
    /// Script calls that took (or tried to take) a lease.
    pub renewals: u64,
    /// Units Redis leased to this node.
    pub leased: u64,
    /// Units this node refunded.
    pub refunded: u64,
    /// Keys with an entry here now.
    pub keys: usize,
}
