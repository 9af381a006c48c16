//! [`HeldPermit`]: a Redis permit that gives itself back. Dropped, it releases its permit in a
//! task on the tokio runtime it was taken on (a holder that forgets, panics or loses its
//! client still frees the permit at once, not after the time to live); while it is held, the
//! holder renews it as its work makes progress.

use crate::error::BackendError;
use crate::permits::{RedisPermit, RedisPermits};

/// A permit held by a guard ([`RedisPermits::hold`]): released when dropped (or by
/// [`release`](Self::release)), renewed by [`renew`](Self::renew) or, from code that cannot
/// wait, [`renew_soon_if_due`](Self::renew_soon_if_due).
#[derive(Debug)]
pub struct HeldPermit {
    permits: RedisPermits,
    key: String,
    permit: RedisPermit,
    /// The backend's local clock reading when the permit was last taken or renewed.
    renewed_at: u64,
    runtime: Option<tokio::runtime::Handle>,
    released: bool,
}

impl RedisPermits {
    /// `permit`, just acquired for `key`, held by a guard that releases it when dropped. Call
    /// it inside a tokio runtime: the release runs there (outside one, a dropped permit is
    /// left to expire after its time to live).
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # use limiter_redis::{Acquired, RedisBackend};
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// let exports = backend.permits("exports", 2, Duration::from_secs(30))?;
    /// if let Acquired::Held(permit) = exports.acquire("acme").await? {
    ///     let mut held = exports.hold("acme", permit);
    ///     // ... long work, renewing as it goes ...
    ///     held.renew().await?;
    /// } // dropped: released
    /// # Ok(()) }
    /// ```
    pub fn hold(&self, key: &str, permit: RedisPermit) -> HeldPermit {
        HeldPermit {
            permits: self.clone(),
            key: key.to_owned(),
            permit,
            renewed_at: self.local_now(),
            runtime: tokio::runtime::Handle::try_current().ok(),
            released: false,
        }
    }
}

impl HeldPermit {
    /// The permit.
    pub fn permit(&self) -> &RedisPermit {
        &self.permit
    }

    /// The key it is held for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Moves its expiry to a full time to live from now: whether it was still held (false once
    /// it expired: the key's count no longer includes it).
    pub async fn renew(&mut self) -> Result<bool, BackendError> {
        self.renewed_at = self.permits.local_now();
        let renewed = self.permits.renew(&self.key, self.permit.id()).await?;
        Ok(renewed.is_some())
    }

    /// Renews the permit in a background task when half its time to live has passed since it
    /// was taken or last renewed (by the backend's local clock): for code that cannot wait,
    /// such as a response body yielding its next frame. Whether a renewal was started.
    pub fn renew_soon_if_due(&mut self) -> bool {
        let now = self.permits.local_now();
        let half_ttl = u64::try_from(self.permits.ttl().as_nanos() / 2).unwrap_or(u64::MAX);
        if now.saturating_sub(self.renewed_at) < half_ttl {
            return false;
        }
        self.renewed_at = now;
        let (permits, key, id) = (
            self.permits.clone(),
            self.key.clone(),
            self.permit.id().to_owned(),
        );
        self.run_in_background(async move {
            // Best effort: a renewal that fails leaves the permit to expire, which frees it.
            let _ = permits.renew(&key, &id).await;
        })
    }

    /// Releases the permit now: whether it was still held (false once it had expired).
    pub async fn release(mut self) -> Result<bool, BackendError> {
        self.released = true;
        self.permits.release(&self.key, self.permit.id()).await
    }

    fn run_in_background(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> bool {
        match &self.runtime {
            Some(runtime) => {
                crate::task::spawn_on(runtime, task);
                true
            }
            None => crate::task::spawn(task).is_ok(),
        }
    }
}

impl Drop for HeldPermit {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let (permits, key, id) = (
            self.permits.clone(),
            std::mem::take(&mut self.key),
            self.permit.id().to_owned(),
        );
        // Best effort: a release that fails (Redis out) leaves the permit to expire.
        self.run_in_background(async move {
            let _ = permits.release(&key, &id).await;
        });
    }
}
