//! Errors: what went wrong with Redis (reported inside a decision, by the failure policy,
//! never as a denial), beside the workspace's shared build, call and refund errors.

use core::time::Duration;

/// A limiter or stack that cannot be built as described: the workspace's one such error, the
/// same for every backend ([`limiter_stack::BuildError`]).
pub use limiter_stack::BuildError;

/// A call that can never be decided: the workspace's one such error, the same for every
/// backend ([`limiter_stack::CallError`]). Being over the limit is not an error, and neither is
/// a Redis failure: those are decisions (see
/// [`RedisDecision::origin`](crate::RedisDecision::origin)).
pub use limiter_stack::CallError;

/// What went wrong talking to Redis. It reaches callers inside a decision made by the failure
/// policy, so a broken backend is never reported as "over the limit".
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// Redis did not answer within the call's timeout.
    #[error("Redis did not answer within {after:?}; it is down, overloaded or unreachable")]
    Timeout {
        /// The timeout.
        after: Duration,
    },
    /// The circuit breaker is open after repeated failures; no call is sent until it probes.
    #[error(
        "the Redis circuit breaker is open after repeated failures; it probes again in {retry_in:?}"
    )]
    CircuitOpen {
        /// Until the next probe.
        retry_in: Duration,
    },
    /// The connection failed or Redis answered with an error.
    #[error("Redis failed: {0}")]
    Redis(String),
    /// The script refused the call, naming the key (a key holding something that is not a
    /// limiter state, for example).
    #[error("the Redis script refused the call: {0}")]
    Script(String),
    /// Redis answered something the script never sends.
    #[error("Redis sent a reply the limiter cannot read: {0}")]
    BadReply(String),
    /// The backend could not be set up (a URL, TLS settings or a secret that cannot be
    /// used). The message says what to fix and never holds a password.
    #[error("cannot connect to Redis: {0}")]
    Connect(String),
    /// Redis refused the login: a wrong user name or password, or none where one is needed.
    #[error("Redis authentication failed: {0}")]
    Authentication(String),
    /// The TLS session could not be opened: an untrusted CA, a certificate not valid for the
    /// name checked, a refused client certificate, or a port that does not speak TLS.
    #[error("TLS to Redis failed: {0}")]
    Tls(String),
    /// The call's writes were made, but fewer replicas than asked acknowledged them in time
    /// ([`BackendBuilder::wait_for_replicas`](crate::BackendBuilder::wait_for_replicas)), so a
    /// failover could lose them: the failure policy answers.
    #[error(
        "{acked} of the {wanted} replicas asked for acknowledged the write within {within:?}; a failover could lose it"
    )]
    NotReplicated {
        /// Replicas that acknowledged.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
        /// How long the call waited for them.
        within: Duration,
    },
}

impl BackendError {
    /// Whether the error says Redis is unhealthy (counted by the circuit breaker), rather than
    /// something wrong with one call's keys.
    pub fn is_outage(&self) -> bool {
        matches!(
            self,
            BackendError::Timeout { .. }
                | BackendError::Redis(_)
                | BackendError::Connect(_)
                | BackendError::CircuitOpen { .. }
                | BackendError::Authentication(_)
                | BackendError::Tls(_)
                | BackendError::NotReplicated { .. }
        )
    }
}

/// A refund Redis did not take: the workspace's one refund error
/// ([`limiter_stack::RefundError`]) with Redis's failures in its
/// [`Backend`](limiter_stack::RefundError::Backend) variant. The grant's units are unchanged,
/// except after `Backend`, whose units the grant no longer holds.
pub type RefundError = limiter_stack::RefundError<BackendError>;
