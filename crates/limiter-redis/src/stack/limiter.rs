//! [`RedisLimiter`]: a stack of one layer keyed by a string, tagged by its key.

use limiter_core::Limit;

use super::*;
use crate::backend::RedisBackend;
use crate::decision::RedisDecision;
use crate::error::{BuildError, CallError};
use crate::spec::Kind;

/// A limiter of one layer keyed by a string, with up to four limits on each key (10 per second
/// and 100 per minute, say), decided on Redis. Each key is its own hash tag, so keys spread over
/// a Redis Cluster.
#[derive(Debug)]
pub struct RedisLimiter {
    stack: RedisStack<String>,
}

/// Builds a [`RedisLimiter`]; see [`RedisLimiter::builder`].
#[derive(Debug)]
pub struct RedisLimiterBuilder {
    stack: RedisStackBuilder<String>,
    layer: RedisLayer<String>,
}

impl RedisLimiter {
    /// A limiter named `name` (part of its keys) on `backend`.
    pub fn builder(backend: &RedisBackend, name: impl Into<String>) -> RedisLimiterBuilder {
        RedisLimiterBuilder {
            stack: RedisStack::builder(backend, name).tag_by_key(),
            layer: RedisLayer::keyed("key", |key: &String| Some(key.clone())),
        }
    }

    /// Decides one unit for `key`.
    pub async fn check(&self, key: &str) -> Result<RedisDecision, CallError> {
        self.stack.check_n(&key.to_owned(), 1).await
    }

    /// Decides `cost` units for `key` (0 peeks).
    pub async fn check_n(&self, key: &str, cost: u64) -> Result<RedisDecision, CallError> {
        self.stack.check_n(&key.to_owned(), cost).await
    }

    /// Records `cost` units of usage that already happened for `key` in one round trip (see
    /// [`RedisStack::record`]): never refused, it may leave the key in debt.
    pub async fn record(&self, key: &str, cost: u64) -> Result<RedisDecision, CallError> {
        self.stack.record(&key.to_owned(), cost).await
    }

    /// Decides many independent `(key, cost)` calls in one round trip (one per key on a
    /// cluster, sent together).
    pub async fn check_many(&self, calls: &[(&str, u64)]) -> Vec<Result<RedisDecision, CallError>> {
        let owned: Vec<(String, u64)> = calls.iter().map(|(k, c)| ((*k).to_owned(), *c)).collect();
        let borrowed: Vec<(&String, u64)> = owned.iter().map(|(k, c)| (k, *c)).collect();
        self.stack.check_many(&borrowed).await
    }

    /// The Redis keys `key`'s state lives in, one per limit.
    pub fn redis_keys(&self, key: &str) -> Vec<String> {
        self.stack.redis_keys(&key.to_owned())
    }

    /// The one-layer stack behind the limiter, owned.
    pub fn into_stack(self) -> RedisStack<String> {
        self.stack
    }

    /// The one-layer stack behind the limiter (requests are the keys), to add its calls to a
    /// [`RedisBatch`](crate::RedisBatch) with other stacks' or as shadow calls.
    pub fn stack(&self) -> &RedisStack<String> {
        &self.stack
    }

    /// The backend the limiter decides on.
    pub fn backend(&self) -> &RedisBackend {
        self.stack.backend()
    }
}

impl RedisLimiterBuilder {
    /// Adds `limit`, decided by `kind`, to every key. A limit that cannot be counted is
    /// reported once, by [`build`](Self::build).
    pub fn limit(mut self, kind: Kind, limit: Limit) -> Self {
        self.layer = self.layer.limit(kind, limit);
        self
    }

    /// The first part of every key (default `limiter`).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.stack = self.stack.prefix(prefix);
        self
    }

    /// What a call does when Redis fails (default [`OnFailure::Fallback`]).
    pub fn on_failure(mut self, on_failure: OnFailure) -> Self {
        self.stack = self.stack.on_failure(on_failure);
        self
    }

    /// How many nodes share the limits while Redis is out (default 1); see
    /// [`RedisStackBuilder::fleet_size`].
    pub fn fleet_size(mut self, fleet: u64) -> Self {
        self.stack = self.stack.fleet_size(fleet);
        self
    }

    /// Checks the limits and builds the limiter.
    pub fn build(self) -> Result<RedisLimiter, BuildError> {
        Ok(RedisLimiter {
            stack: self.stack.layer(self.layer).build()?,
        })
    }
}
