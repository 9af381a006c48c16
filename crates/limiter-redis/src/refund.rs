//! Refunds on Redis: [`RedisStack::acquire`] decides a call and, when Redis admitted it, hands
//! back a [`RedisGrant`] of the units taken; [`RedisStack::refund`] gives some or all of them
//! back in one script call, with the same guard as in process: never more than the grant took
//! (each refund takes its units off the grant), never above full, and units that have already
//! come back on their own are not returned twice (a token bucket's refund stops at full now; a
//! window's comes off the grant's window only while the state still counts it).
//!
//! A refund clears the deny cache for the keys it touches and moves its refund epoch on, so no
//! denial decided before the refund is answered locally after it.

use std::sync::Arc;

use limiter_stack::{Grant, Origin};

use crate::decision::RedisDecision;
use crate::error::{BackendError, CallError, RefundError};
use crate::script::call::{Call, Mode};
use crate::script::reply;
use crate::stack::{Prepared, RedisLimiter, RedisStack};

/// The units an admitted call took on Redis (or, when Redis could not decide, on the stack's
/// local fallback), which [`RedisStack::refund`] can give back. Not `Clone`: each refund takes
/// its units off the grant.
pub struct RedisGrant {
    stack: Arc<()>,
    call: Prepared,
    granted_us: u64,
    left: u64,
    /// Where the units were taken when the local fallback decided: its grant, and why Redis
    /// did not (`None`: taken on Redis).
    fallback: Option<Box<(Grant, BackendError)>>,
}

impl std::fmt::Debug for RedisGrant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisGrant")
            .field("keys", &self.call.keys)
            .field("granted_us", &self.granted_us)
            .field("taken", &self.call.cost)
            .field("left", &self.left)
            .field("fell_back", &self.fell_back())
            .finish()
    }
}

impl RedisGrant {
    /// Units the call took.
    pub fn taken(&self) -> u64 {
        self.call.cost
    }

    /// Units that may still come back.
    pub fn left(&self) -> u64 {
        self.left
    }

    /// Redis's time (microseconds since the Unix epoch) the units were taken at; 0 for units
    /// the local fallback took.
    pub fn granted_at_us(&self) -> u64 {
        self.granted_us
    }

    /// Whether the stack's local fallback took the units (Redis could not decide and the
    /// failure policy is [`OnFailure::Fallback`](crate::OnFailure::Fallback)): a refund gives
    /// them back there, whether or not Redis is back by then.
    pub fn fell_back(&self) -> bool {
        self.fallback.is_some()
    }

    /// The Redis keys the grant took from.
    pub fn keys(&self) -> &[String] {
        &self.call.keys
    }
}

impl<R> RedisStack<R> {
    /// Decides `cost` units for `request`, as [`check_n`](Self::check_n) does, and when they
    /// were taken returns a [`RedisGrant`] that [`refund`](Self::refund) can give back: units
    /// Redis admitted, or, when Redis could not decide, units the local fallback took (given
    /// back there). No grant comes with a peek, a denial, or an admission that took nothing
    /// (failing open).
    ///
    /// # Errors
    /// [`CallError`] for a call no limit can decide (its cost exceeds a burst).
    pub async fn acquire(
        &self,
        request: &R,
        cost: u64,
    ) -> Result<(RedisDecision, Option<RedisGrant>), CallError> {
        let call = self.prepare(request, cost)?;
        let (decision, now_us) = match self.ask_redis(request, &call).await {
            Ok(answered) => answered,
            Err(error) if cost > 0 => return Ok(self.granted_on_failure(request, call, error)),
            Err(error) => (self.on_failure_of(request, &call, error), None),
        };
        let grant = match now_us {
            Some(granted_us)
                if cost > 0
                    && decision.is_allowed()
                    && decision.origin() == Some(Origin::Remote) =>
            {
                Some(RedisGrant {
                    stack: Arc::clone(self.token()),
                    call,
                    granted_us,
                    left: cost,
                    fallback: None,
                })
            }
            _ => None,
        };
        Ok((decision, grant))
    }

    /// The failure policy's answer to a take Redis could not decide (`error`), with a grant
    /// of what the local fallback took.
    fn granted_on_failure(
        &self,
        request: &R,
        call: Prepared,
        error: BackendError,
    ) -> (RedisDecision, Option<RedisGrant>) {
        let (decision, held) = self.on_failure_granted(request, call.cost, error.clone());
        let grant = held.map(|local| RedisGrant {
            stack: Arc::clone(self.token()),
            left: call.cost,
            call,
            granted_us: 0,
            fallback: Some(Box::new((local, error))),
        });
        (decision, grant)
    }

    /// Gives back `units` of what `grant` took, on every limit the call touched, in one
    /// round trip (on the local fallback, with none, for units it took); answers with what
    /// `request` holds after it (a peek). Units that have come back on their own are not
    /// returned twice, and no limit goes above full.
    ///
    /// # Errors
    /// [`RefundError::WrongStack`] or [`RefundError::ExceedsGrant`] (nothing sent, the grant
    /// unchanged); [`RefundError::Backend`] when Redis failed: the grant no longer holds the
    /// units, so a lost reply never gives them back twice.
    pub async fn refund(
        &self,
        request: &R,
        grant: &mut RedisGrant,
        units: u64,
    ) -> Result<RedisDecision, RefundError> {
        if !Arc::ptr_eq(&grant.stack, self.token()) {
            return Err(RefundError::WrongStack);
        }
        if units > grant.left {
            return Err(RefundError::ExceedsGrant {
                units,
                left: grant.left,
                taken: grant.call.cost,
            });
        }
        if let Some(fallback) = grant.fallback.as_deref_mut() {
            let (local, error) = fallback;
            let after = self.refund_on_fallback(request, local, units, error)?;
            grant.left = grant.left.saturating_sub(units);
            return Ok(after);
        }
        // Spent before sending: whatever happens to the reply, these units never come back
        // twice.
        grant.left = grant.left.saturating_sub(units);
        self.send_refund(request, &grant.call, units, Some(grant.granted_us))
            .await
    }

    /// Sends `units` of `call` back, taken at `granted_us` (`None`: now, without a grant), in
    /// one script call (mode 2; one per slot for a call across cluster slots), and answers
    /// with what `request` holds after it.
    async fn send_refund(
        &self,
        request: &R,
        call: &Prepared,
        units: u64,
        granted_us: Option<u64>,
    ) -> Result<RedisDecision, RefundError> {
        if !call.spans_slots() {
            return self
                .send_refund_part(request, call, units, granted_us)
                .await;
        }
        let mut layers = Vec::new();
        let mut at = None;
        for part in call.by_slot() {
            let peek = self
                .send_refund_part(request, &part, units, granted_us)
                .await?;
            at = at.or(peek.decided_at_micros());
            layers.extend(peek.layers().iter().copied());
        }
        Ok(RedisDecision::from_parts(layers, at))
    }

    /// [`send_refund`](Self::send_refund) for a call whose keys share a slot: one script call.
    pub(crate) async fn send_refund_part(
        &self,
        request: &R,
        call: &Prepared,
        units: u64,
        granted_us: Option<u64>,
    ) -> Result<RedisDecision, RefundError> {
        let mut args = Call::new(Mode::Refund);
        args.refund_group(units, granted_us, call.limits());
        self.encode_limits(call, 0, &mut args);
        let sent = self.backend().sent();
        let value = self
            .backend()
            .eval(&call.keys, args)
            .await
            .map_err(RefundError::Backend)?;
        // Units came back: standing denials of these keys may no longer stand.
        self.backend().forget_denials(&call.keys);
        let (now_us, mut groups) =
            reply::parse(&value, &[call.limits()]).map_err(RefundError::Backend)?;
        match groups.pop() {
            Some(Ok(answers)) if answers.len() == call.limits() => Ok(self
                .conclude(request, call, Ok(answers), sent, false)
                .at(now_us)),
            Some(Err(reason)) => Err(RefundError::Backend(BackendError::Script(reason))),
            _ => Err(RefundError::Backend(BackendError::BadReply(
                "the refund's answer does not match its limits".into(),
            ))),
        }
    }

    /// Gives back `units` to every limit `request` touches, in one round trip, without a
    /// grant: a caller's own account of units it took and did not use (envoy's
    /// `is_negative_hits`), as if taken now. No limit goes above full, and a window takes
    /// units back only from its current count. Unlike [`refund`](Self::refund), nothing proves
    /// the units were taken: expose it only to callers trusted with the limits. Answers with
    /// what `request` holds after it (a peek), and clears the deny cache for its keys.
    ///
    /// # Errors
    /// [`RefundError::Backend`] when Redis failed (nothing is known to have come back).
    pub async fn refund_units(
        &self,
        request: &R,
        units: u64,
    ) -> Result<RedisDecision, RefundError> {
        let call = self.prepare_record(request, units);
        if call.keys.is_empty() || units == 0 {
            return self
                .check_n(request, 0)
                .await
                .map_err(|e| RefundError::Backend(BackendError::BadReply(e.to_string())));
        }
        self.send_refund(request, &call, units, None).await
    }
}

impl RedisLimiter {
    /// Decides `cost` units for `key` and, when Redis admitted them, returns a grant
    /// [`refund`](Self::refund) can give back; see [`RedisStack::acquire`].
    ///
    /// ```no_run
    /// use limiter_core::Limit;
    /// use limiter_redis::{Kind, RedisBackend, RedisLimiter};
    ///
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let backend = RedisBackend::connect("redis://127.0.0.1:6379").await?;
    /// let tokens = RedisLimiter::builder(&backend, "llm-tokens")
    ///     .limit(Kind::TokenBucket, Limit::per_minute(10_000))
    ///     .build()?;
    /// // Reserve the most a completion may use, then give back what it did not.
    /// let (decision, grant) = tokens.acquire("team-7", 2_000).await?;
    /// if let Some(mut grant) = grant {
    ///     let used = 1_234;
    ///     tokens.refund("team-7", &mut grant, 2_000 - used).await?;
    /// }
    /// # let _ = decision;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`CallError`] for a cost above a burst.
    pub async fn acquire(
        &self,
        key: &str,
        cost: u64,
    ) -> Result<(RedisDecision, Option<RedisGrant>), CallError> {
        self.stack().acquire(&key.to_owned(), cost).await
    }

    /// Gives back `units` of `grant` on `key`; see [`RedisStack::refund`].
    ///
    /// # Errors
    /// [`RefundError`], as [`RedisStack::refund`].
    pub async fn refund(
        &self,
        key: &str,
        grant: &mut RedisGrant,
        units: u64,
    ) -> Result<RedisDecision, RefundError> {
        self.stack().refund(&key.to_owned(), grant, units).await
    }
}
