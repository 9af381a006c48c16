//! Several limiters, on separate connections and in separate OS processes, sharing one Redis:
//! together they admit exactly the limit under concurrent load.
//!
//! Time is frozen (injected), so nothing refills during the run and the total is exact.

use limiter_testkit::redis_server as common;

use std::sync::Arc;

use limiter_core::{Limit, ManualClock};
use limiter_redis::{Kind, OnFailure, Origin, RedisBackend, RedisLayer, RedisLimiter, RedisStack};

const START: u64 = 1_795_000_000_000_000_000;
const CHILD_URL: &str = "LIMITER_REDIS_TEST_CHILD_URL";

async fn frozen_backend(url: &str) -> RedisBackend {
    RedisBackend::builder(url)
        .time_from(ManualClock::starting_at(START))
        .timeout(std::time::Duration::from_secs(5))
        .deny_cache(0)
        .connect()
        .await
        .unwrap()
}

async fn bucket(backend: &RedisBackend) -> RedisLimiter {
    RedisLimiter::builder(backend, "fleet")
        .limit(Kind::TokenBucket, Limit::per_hour(500))
        .limit(Kind::SlidingWindow, Limit::per_day(10_000))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
}

/// Calls `attempts` times on the shared key, `tasks` at a time; returns the admissions.
async fn hammer(limiter: Arc<RedisLimiter>, tasks: u64, attempts: u64) -> u64 {
    let handles: Vec<_> = (0..tasks)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let mut admitted = 0;
                for _ in 0..attempts / tasks {
                    let d = limiter.check("shared").await.unwrap();
                    assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
                    admitted += u64::from(d.is_allowed());
                }
                admitted
            })
        })
        .collect();
    let mut total = 0;
    for handle in handles {
        total += handle.await.unwrap();
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limiters_on_separate_connections_admit_exactly_the_limit() {
    let server = common::RedisServer::start();
    let mut runs = Vec::new();
    for _ in 0..4 {
        let backend = frozen_backend(&server.url()).await;
        let limiter = Arc::new(bucket(&backend).await);
        runs.push(tokio::spawn(hammer(limiter, 8, 400)));
    }
    let mut total = 0;
    for run in runs {
        total += run.await.unwrap();
    }
    assert_eq!(total, 500, "4 instances x 400 attempts on a burst of 500");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_stack_keeps_every_layer_exact() {
    struct Req {
        user: u64,
    }
    let server = common::RedisServer::start();
    let mut runs = Vec::new();
    for instance in 0..3_u64 {
        let backend = frozen_backend(&server.url()).await;
        let stack = Arc::new(
            RedisStack::builder(&backend, "fleet-stack")
                .layer(
                    RedisLayer::keyed("user", |r: &Req| Some(r.user.to_string()))
                        .limit(Kind::FixedWindow, Limit::per_hour(40)),
                )
                .layer(RedisLayer::global("all").limit(Kind::TokenBucket, Limit::per_hour(300)))
                .on_failure(OnFailure::Closed)
                .build()
                .unwrap(),
        );
        for task in 0..4_u64 {
            let stack = Arc::clone(&stack);
            runs.push(tokio::spawn(async move {
                let mut per_user = [0_u64; 10];
                for i in 0..150_u64 {
                    let user = (i + task + instance) % 10;
                    let d = stack.check(&Req { user }).await.unwrap();
                    per_user[user as usize] += u64::from(d.is_allowed());
                }
                per_user
            }));
        }
    }
    let mut per_user = [0_u64; 10];
    for run in runs {
        for (total, n) in per_user.iter_mut().zip(run.await.unwrap()) {
            *total += n;
        }
    }
    assert_eq!(
        per_user.iter().sum::<u64>(),
        300,
        "the global cap binds exactly: {per_user:?}"
    );
    assert!(
        per_user.iter().all(|&n| n <= 40),
        "no user past 40: {per_user:?}"
    );
}

/// The entry point of the child processes `processes_sharing_one_redis_admit_exactly_the_limit`
/// starts: with the environment variable set, it makes 400 calls and prints its admissions;
/// run normally, it has nothing to do.
#[tokio::test]
async fn child_process_entry_point() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    let backend = frozen_backend(&url).await;
    let limiter = Arc::new(bucket(&backend).await);
    let admitted = hammer(limiter, 4, 400).await;
    println!("admitted={admitted}");
}

#[test]
fn processes_sharing_one_redis_admit_exactly_the_limit() {
    let server = common::RedisServer::start();
    let children: Vec<_> = (0..3)
        .map(|_| {
            limiter_testkit::child_test(module_path!(), "child_process_entry_point")
                .env(CHILD_URL, server.url())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a child test process")
        })
        .collect::<Vec<_>>();
    let mut total = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let admitted: u64 = stdout
            .lines()
            .find_map(|l| l.split_once("admitted=").map(|(_, n)| n))
            .and_then(|n| n.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no count in the child's output: {stdout}"));
        assert!(admitted <= 400);
        total += admitted;
    }
    assert!(total > 0);
    // 3 x 400 attempts; whatever order they ran in, the first 500 are admitted, no more.
    assert_eq!(total, 500);
}
