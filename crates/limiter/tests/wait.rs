//! `until_ready` and friends on tokio's paused clock: the limiters read a clock that follows
//! tokio's virtual time, so each wait is measured exactly and no test sleeps for real. Each
//! checks that a wait lasts what the denial said (no busy loop: a bounded number of attempts),
//! that a cost that can never be admitted fails at once, and that jitter stays in its bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use limiter::Kind;
use limiter::algorithm::Gcra;
use limiter::algorithm::KeyedLimiter;
use limiter::stack::{Layer, Stack};
use limiter::wait::{Jitter, UntilKeyReady, UntilReady, UntilRequestReady};
use limiter::{Clock, DecisionError, Limit, TokenBucket};
use tokio::time::Instant;

/// tokio's (virtual) time since the clock was made, counting its readings.
#[derive(Clone)]
struct TokioClock {
    start: Instant,
    reads: Arc<AtomicU64>,
}

impl TokioClock {
    fn new() -> Self {
        Self {
            start: Instant::now(),
            reads: Arc::new(AtomicU64::new(0)),
        }
    }

    fn reads(&self) -> u64 {
        self.reads.load(Ordering::SeqCst)
    }
}

impl Clock for TokioClock {
    fn now(&self) -> u64 {
        self.reads.fetch_add(1, Ordering::SeqCst);
        u64::try_from(self.start.elapsed().as_nanos()).expect("a short test")
    }
}

#[tokio::test(start_paused = true)]
async fn a_direct_limiter_waits_exactly_the_denials_retry_after() {
    let clock = TokioClock::new();
    let bucket =
        TokenBucket::with_clock(Limit::per_second(1).with_burst(1), clock.clone()).unwrap();
    let start = Instant::now();
    for i in 0..5u64 {
        let decision = bucket.until_ready().await.unwrap();
        assert!(decision.is_allowed());
        // The first is immediate; each later one comes one second after the previous.
        assert_eq!(start.elapsed(), Duration::from_secs(i));
    }
    // One attempt for the first, at most two (denied, then admitted) for each later one.
    assert!(
        clock.reads() <= 1 + 4 * 2,
        "{} attempts: a busy loop",
        clock.reads()
    );
}

#[tokio::test(start_paused = true)]
async fn a_cost_that_can_never_be_admitted_fails_at_once() {
    let clock = TokioClock::new();
    let bucket = TokenBucket::with_clock(Limit::per_second(5), clock.clone()).unwrap();
    let start = Instant::now();
    let err = bucket.until_n_ready(6, Jitter::none()).await.unwrap_err();
    assert_eq!(err, DecisionError::CostExceedsBurst { cost: 6, burst: 5 });
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert_eq!(clock.reads(), 1);

    // Several units at once wait for all of them.
    let first = bucket.until_n_ready(5, Jitter::none()).await.unwrap();
    assert!(first.is_allowed());
    bucket.until_n_ready(5, Jitter::none()).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn keyed_limiters_wait_per_key_by_borrowed_key() {
    let clock = TokioClock::new();
    let per_key =
        KeyedLimiter::<Gcra, String, _>::with_clock(Limit::per_minute(1), clock.clone()).unwrap();
    let start = Instant::now();
    per_key.until_key_ready("alice").await.unwrap();
    per_key.until_key_ready("bob").await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "other keys do not wait");
    per_key.until_key_ready("alice").await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(60));
    assert_eq!(per_key.peek_key("bob").unwrap().remaining(), 1);
}

struct Request {
    user: u64,
}

#[tokio::test(start_paused = true)]
async fn a_stack_waits_for_its_slowest_layer() {
    let clock = TokioClock::new();
    let stack = Stack::builder()
        .layer(
            Layer::keyed("per-user", |r: &Request| Some(r.user))
                .limit(Kind::TokenBucket, Limit::per_second(10)),
        )
        .layer(Layer::global("global").limit(Kind::TokenBucket, Limit::per_second(2).with_burst(1)))
        .clock(clock.clone())
        .build()
        .unwrap();
    let start = Instant::now();
    for i in 0..3u32 {
        let decision = stack
            .until_request_ready(&Request { user: 1 })
            .await
            .unwrap();
        assert!(decision.is_allowed());
        assert_eq!(start.elapsed(), Duration::from_millis(500) * i);
    }
    let err = stack
        .until_request_n_ready(&Request { user: 1 }, 2, Jitter::none())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("burst"), "{err}");
}

#[tokio::test(start_paused = true)]
async fn jitter_adds_at_most_its_bound_to_each_wait() {
    let clock = TokioClock::new();
    let bucket =
        TokenBucket::with_clock(Limit::per_second(1).with_burst(1), clock.clone()).unwrap();
    let jitter = Jitter::up_to(Duration::from_millis(100));
    let start = Instant::now();
    let mut last = Duration::ZERO;
    let mut gaps = Vec::new();
    for _ in 0..10 {
        bucket.until_n_ready(1, jitter).await.unwrap();
        let now = start.elapsed();
        if now > Duration::ZERO {
            gaps.push(now - last);
        }
        last = now;
    }
    for gap in &gaps {
        // At least the exact wait after the previous admission, at most the jitter (and
        // tokio's millisecond timer) more.
        assert!(*gap >= Duration::from_secs(1), "{gap:?}");
        assert!(*gap <= Duration::from_millis(1_102), "{gap:?}");
    }
    assert!(
        gaps.iter().any(|g| *g > Duration::from_millis(1_002)),
        "jitter was never added: {gaps:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn concurrent_waiters_are_admitted_no_faster_than_the_limit() {
    let clock = TokioClock::new();
    let bucket = Arc::new(
        TokenBucket::with_clock(Limit::per_second(10).with_burst(1), clock.clone()).unwrap(),
    );
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..20 {
        let bucket = Arc::clone(&bucket);
        tasks.push(tokio::spawn(async move {
            bucket.until_ready().await.unwrap();
            start.elapsed()
        }));
    }
    let mut admitted = Vec::new();
    for task in tasks {
        admitted.push(task.await.unwrap());
    }
    admitted.sort();
    for (i, at) in admitted.iter().enumerate() {
        // The i-th admission needs i intervals of 100 ms.
        let i = u32::try_from(i).unwrap();
        assert!(*at >= Duration::from_millis(100) * i, "{i}: {at:?}");
    }
    assert!(admitted[19] <= Duration::from_secs(5), "{:?}", admitted[19]);
}
