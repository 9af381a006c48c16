//! Leased limits across OS processes: three processes, each with four tasks racing on one
//! key, share one `redis-server`. The fleet admits within the limit plus the slack, at least
//! the limit less the slack, and asks Redis about once per hundred decisions.
//!
//! Time is frozen (injected), so nothing refills and no lease expires during the run.

use limiter_testkit::redis_server as common;

use std::process::Command;
use std::sync::Arc;

use limiter_core::{Limit, ManualClock};
use limiter_redis::{Kind, Lease, LeasedLimiter, OnFailure, RedisBackend, RedisLimiter, Slack};

const START: u64 = 1_795_000_000_000_000_000;
const CHILD_URL: &str = "LIMITER_REDIS_LEASE_CHILD_URL";
const LIMIT: u64 = 3_000;
const SLACK_PERCENT: u64 = 10;
const TASKS: u64 = 4;
const ATTEMPTS: u64 = 6_000;

async fn leased(url: &str) -> LeasedLimiter {
    let clock = ManualClock::starting_at(START);
    let backend = RedisBackend::builder(url)
        .time_from(clock.clone())
        .clock(clock)
        .timeout(std::time::Duration::from_secs(5))
        .deny_cache(0)
        .connect()
        .await
        .unwrap();
    RedisLimiter::builder(&backend, "leased-fleet")
        .limit(Kind::TokenBucket, Limit::per_hour(LIMIT))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
        .leased(Lease::new(Slack::percent(SLACK_PERCENT)))
        .unwrap()
}

/// The entry point of the child processes the test below starts: with the environment
/// variable set, it makes `ATTEMPTS` calls on `TASKS` tasks, hands back what it holds and
/// prints its admissions and script calls; run normally, it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_child_process_entry_point() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    let limiter = Arc::new(leased(&url).await);
    let handles: Vec<_> = (0..TASKS)
        .map(|_| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..ATTEMPTS / TASKS {
                    admitted += u64::from(limiter.check("shared").await.unwrap().is_allowed());
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for handle in handles {
        admitted += handle.await.unwrap();
    }
    limiter.shutdown().await;
    let calls = limiter.stack().stack().backend().stats().round_trips;
    println!("admitted={admitted} calls={calls}");
}

fn field(stdout: &str, name: &str) -> u64 {
    stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the child's output: {stdout}"))
}

#[test]
fn processes_sharing_a_leased_limit_stay_within_its_bound() {
    let server = common::RedisServer::start();
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "--exact",
                    "leased_child_process_entry_point",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_URL, server.url())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("start a child test process")
        })
        .collect();
    let (mut total, mut calls) = (0, 0);
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child failed: {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        total += field(&stdout, "admitted=");
        calls += field(&stdout, "calls=");
    }
    let slack = LIMIT * SLACK_PERCENT / 100;
    // Frozen time: every admitted unit came from the bucket's 3,000, so the fleet is within
    // the limit plus the slack; units left unspent in leases when demand ended are at most
    // the slack (and were handed back).
    assert!(total <= LIMIT + slack, "{total} admitted");
    assert!(total >= LIMIT - slack, "{total} admitted");
    let decisions = 3 * ATTEMPTS;
    assert!(
        calls * 100 <= decisions,
        "{calls} script calls for {decisions} decisions"
    );
    println!(
        "admitted {total} of {LIMIT} (slack {slack}) with {calls} script calls for {decisions} decisions"
    );
}
