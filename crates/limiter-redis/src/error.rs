//! Errors: a limiter that cannot be built, a call that can never be decided, and what went
//! wrong with Redis (reported inside a decision, by the failure policy, never as a denial).

use core::time::Duration;

use limiter_core::LimitError;

/// A limiter or stack that cannot be built as described.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A limit of the named layer cannot be decided on Redis.
    #[error("layer `{layer}`: {source}")]
    Limit {
        /// The layer the limit was added to.
        layer: String,
        /// Why, and which limit would work.
        source: LimitError,
    },
    /// The stack has no layer. Fix: add at least one with `.layer(...)`.
    #[error("the Redis stack `{stack}` has no layers; add at least one with `.layer(...)`")]
    NoLayers {
        /// The stack's name.
        stack: String,
    },
    /// More layers than a stack holds.
    #[error(
        "the Redis stack `{stack}` has {count} layers, more than the {max} a stack holds; merge layers or split the stack"
    )]
    TooManyLayers {
        /// The stack's name.
        stack: String,
        /// Layers given.
        count: usize,
        /// The most a stack holds.
        max: usize,
    },
    /// A layer without limits.
    #[error("layer `{layer}` has no limits; add one with `.limit(kind, limit)`")]
    NoLimits {
        /// The layer.
        layer: String,
    },
    /// A layer with more limits than one layer holds.
    #[error(
        "layer `{layer}` has {count} limits, more than the {max} one layer holds; split it into two layers"
    )]
    TooManyLimits {
        /// The layer.
        layer: String,
        /// Limits given.
        count: usize,
        /// The most a layer holds.
        max: usize,
    },
    /// A layer's plans differ in how many limits they hold.
    #[error(
        "layer `{layer}`: plan `{plan}` has {count} limits where the layer's first plan has {expected}; give every plan as many"
    )]
    PlanShape {
        /// The layer.
        layer: String,
        /// The plan that differs.
        plan: String,
        /// Its limits.
        count: usize,
        /// The first plan's.
        expected: usize,
    },
    /// A layer open to plans added while a stack serves, which only an in-process stack takes.
    #[error(
        "layer `{layer}` is open to plans added while serving (`open_plans`), which only an in-process stack takes; on Redis give its plans when building (`plans`): a key keeps its consumption when its plan changes"
    )]
    OpenPlans {
        /// The layer.
        layer: String,
    },
    /// Two layers share a name, so they would share Redis keys.
    #[error("two layers are named `{layer}`; layer names name Redis keys, so give each its own")]
    DuplicateLayer {
        /// The repeated name.
        layer: String,
    },
    /// A name that cannot be part of a Redis key as this crate lays keys out.
    #[error("{what} `{name}` {reason}")]
    BadName {
        /// What was named: "stack", "prefix" or "layer".
        what: &'static str,
        /// The name given.
        name: String,
        /// What is wrong and how to fix it.
        reason: &'static str,
    },
    /// A lease that cannot be kept as asked ([`Lease`](crate::Lease)).
    #[error("the leased stack `{stack}`: {reason}")]
    Lease {
        /// The stack's name.
        stack: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A leased stack's keys would not all share one Redis Cluster slot, so no lease script
    /// could take from them together.
    #[error(
        "the Redis stack `{stack}` is leased on a Redis Cluster and tags keys by each layer's own \
         key, but it has {layers} layers, whose keys land in different slots; a lease is taken \
         by one script, which Redis runs only on keys of one slot. Tag by a request field every \
         layer shares (`hash_tag_from`) or by the stack (`tag_by_stack`), or lease a stack of \
         one layer"
    )]
    CrossSlot {
        /// The stack's name.
        stack: String,
        /// How many layers it has.
        layers: usize,
    },
    /// The fleet size the fallback shares each limit by is 0, or leaves a node no unit of
    /// some limit.
    #[error(
        "the Redis stack `{stack}` shares its limits between a fleet of {fleet} nodes while Redis is out, {reason}"
    )]
    FleetSize {
        /// The stack's name.
        stack: String,
        /// The fleet size given.
        fleet: u64,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// A calendar quota that cannot be kept as described.
    #[error("quota `{name}`: {reason}")]
    Quota {
        /// The quota's name.
        name: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
    /// Permits that cannot be kept as described.
    #[error("permits `{name}`: {reason}")]
    Permits {
        /// The permits' name.
        name: String,
        /// What is wrong and how to fix it.
        reason: String,
    },
}

/// A call that can never be decided: the workspace's one such error, the same for every
/// backend ([`limiter_stack::CallError`]). Being over the limit is not an error, and neither is
/// a Redis failure: those are decisions (see [`Source`](crate::Source)).
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

/// A refund Redis did not take: the grant's units are unchanged, except after
/// [`RefundError::Backend`], whose units the grant no longer holds.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefundError {
    /// The grant came from another stack or limiter.
    #[error("this grant came from another Redis stack; refund it on the stack that granted it")]
    WrongStack,
    /// More units than the grant still holds.
    #[error(
        "cannot give back {units} units: the grant took {taken} and holds {left} that may still come back"
    )]
    ExceedsGrant {
        /// Units asked to come back.
        units: u64,
        /// Units the grant still holds.
        left: u64,
        /// Units the grant took.
        taken: u64,
    },
    /// Redis failed (or refused) during the refund. Its units are no longer held by the
    /// grant, so a lost reply can never give them back twice; if Redis did not apply the
    /// refund they stay counted until they refill.
    #[error("the refund did not reach Redis ({0}); its units stay counted until they refill")]
    Backend(BackendError),
}
