//! The same limits across a fleet: the token bucket, the sliding window and the fixed window,
//! and whole stacks of them, decided on Redis by one Lua script per call.
//!
//! - **One round trip, all or nothing.** A call's keys (every limit of every layer) go to one
//!   script call: `FCALL` of a Redis Function library loaded once (loaded again when a server
//!   lacks it), or `EVALSHA` on servers without functions; the script decides them all at one
//!   instant and writes only if every limit admits. [`RedisStack::check_many`] decides many independent calls in
//!   one round trip; a [`RedisBatch`] (or [`RedisStack::check_all`]) decides many calls, of
//!   any stacks on one backend, all or nothing: a denied call never consumes, and if any is
//!   denied none does. [`RedisStack::acquire`] returns a [`RedisGrant`] whose units
//!   [`RedisStack::refund`] gives back, never more than were taken.
//! - **The same arithmetic as in process.** The script reimplements each algorithm's pure
//!   transition, on a state that maps one to one to the Rust algorithm's `u64` word
//!   ([`RedisLimit::twin_state`]), with time in microseconds since the Unix epoch
//!   (Redis `TIME`, so nodes with skewed clocks agree). [`RedisLimit::in_micros`] gives the limit
//!   the Rust algorithm must be built on to make exactly the script's decisions; the
//!   differential tests check that they do. Limits Redis cannot decide exactly are refused
//!   when built, with the largest count that would work.
//! - **Keys expire** when their state would be full again, so idle keys cost nothing. Every key
//!   of a call carries one hash tag, so a stack works on Redis Cluster; a stack whose keys
//!   could not share a slot is refused when built ([`BuildError::CrossSlot`]).
//! - **Failure is explicit.** Each call has a timeout (25 ms by default); a circuit breaker stops
//!   a dead Redis from costing a timeout per call and probes for recovery; the policy
//!   ([`OnFailure`]) fails open, fails closed, or falls back to an in-memory stack with the same
//!   limits. The decision's [`origin`](RedisDecision::origin) says who decided (`None`: the
//!   policy answered, and [`backend_error`](RedisDecision::backend_error) says why), so an
//!   outage is never reported as "over the limit".
//! - **A deny cache** answers keys Redis has just denied, locally, until their `retry_after`
//!   passes, for calls of at least the denied cost only, so it never refuses what Redis would
//!   admit; a refund forgets the keys it touched.
//!
//! ```no_run
//! use limiter_core::Limit;
//! use limiter_redis::{Kind, OnFailure, RedisBackend, RedisLayer, RedisLimiter, RedisStack};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
//!
//! // 10 per second with bursts of 10, and 100 per minute, on every API key.
//! let per_key = RedisLimiter::builder(&backend, "api")
//!     .limit(Kind::TokenBucket, Limit::per_second(10))
//!     .limit(Kind::SlidingWindow, Limit::per_minute(100))
//!     .on_failure(OnFailure::Fallback)
//!     .build()?;
//! let decision = per_key.check("key-42").await?;
//! println!("{:?} from {:?}", decision.decision(), decision.origin());
//!
//! // Per user and a global cap, all or nothing, in one round trip.
//! struct Request { user: String }
//! let stack = RedisStack::builder(&backend, "checkout")
//!     .layer(RedisLayer::keyed("user", |r: &Request| Some(r.user.clone()))
//!         .limit(Kind::TokenBucket, Limit::per_second(5)))
//!     .layer(RedisLayer::global("all").limit(Kind::FixedWindow, Limit::per_second(1_000)))
//!     .build()?;
//! let decision = stack.check(&Request { user: "ada".into() }).await?;
//! if decision.is_denied() {
//!     println!("retry in {:?}", decision.decision().map(|d| d.retry_after()));
//! }
//! # Ok(()) }
//! ```

mod backend;
mod batch;
mod breaker;
mod builder;
mod coalesce;
mod connect;
mod decision;
mod deny_cache;
mod error;
mod health;
mod held;
mod keyslot;
mod lease;
mod permits;
mod queue;
#[cfg(feature = "calendar")]
mod quota;
mod records;
mod refund;
mod script;
mod seam;
mod slots;
mod spec;
mod stack;
mod task;
mod topology;

pub use backend::{BackendStats, DEFAULT_MAX_IN_FLIGHT, DEFAULT_TIMEOUT, RedisBackend};
pub use batch::{BatchDecision, BatchError, RedisBatch};
pub use breaker::BreakerConfig;
pub use builder::{BackendBuilder, MIN_CONNECT_TIMEOUT};
pub use connect::secret::{REDACTED, Secret, SecretError};
#[cfg(feature = "tls")]
pub use connect::tls::{TlsError, TlsOptions};
pub use connect::url::{DEFAULT_PORT, NodeAddr, RedisUrl, ToRedisUrl, UrlError};
pub use decision::RedisDecision;
pub use error::{BackendError, BuildError, CallError, RefundError};
pub use health::{Deployment, MasterHealth, SentinelHealth, StoreHealth, slot_ranges};
pub use held::HeldPermit;
pub use lease::{
    DEFAULT_LEASE_TTL, LEASE_TTL_RANGE, Lease, LeaseStats, LeasedLimiter, LeasedStack, Slack,
};
/// Who decided a call: one type for every backend (`limiter_stack::Origin`).
pub use limiter_stack::Origin;
pub use permits::{Acquired, MAX_PERMIT_TTL, MAX_PERMITS, RedisPermit, RedisPermits};
#[cfg(feature = "calendar")]
pub use quota::{QuotaAnswer, RedisQuota};
pub use records::{LOGGED_CHANGES, RedisRecords, Since};
pub use refund::RedisGrant;
pub use script::SCRIPT;
pub use seam::decide_batch;
pub use spec::{Kind, RedisLimit};
pub use stack::{
    OnFailure, RedisLayer, RedisLimiter, RedisLimiterBuilder, RedisStack, RedisStackBuilder,
};
