//! Leased limits across OS processes: three processes, each with four tasks racing on one
//! key, share one `redis-server`. The fleet admits within the limit plus the slack, at least
//! the limit less the slack, and asks Redis about once per hundred decisions. A process killed
//! (SIGKILL) while it holds a lease loses that lease and nothing more, and the lease stops
//! counting against the slack once it expires. A lease running low is renewed ahead, in the
//! background, keeping what is left, so its callers never wait for Redis.
//!
//! Time is frozen (injected), so nothing refills and no lease expires during a run unless the
//! test moves its clock.

use limiter_testkit::redis_server as common;

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use limiter_core::{Limit, ManualClock};
use limiter_redis::{Kind, Lease, LeasedLimiter, OnFailure, RedisBackend, RedisLimiter, Slack};

const START: u64 = 1_795_000_000_000_000_000;
const CHILD_URL: &str = "LIMITER_REDIS_LEASE_CHILD_URL";
const LIMIT: u64 = 3_000;
const SLACK_PERCENT: u64 = 10;
const TASKS: u64 = 4;
const ATTEMPTS: u64 = 6_000;
const HOLD_URL: &str = "LIMITER_REDIS_LEASE_HOLD_URL";
/// The holding child's lease lives an hour, so its idle sweep (every half hour) cannot hand
/// the lease back before the test kills it.
const HOLD_TTL: Duration = Duration::from_secs(3_600);

async fn leased(url: &str) -> LeasedLimiter {
    leased_on(
        url,
        &ManualClock::starting_at(START),
        Limit::per_hour(LIMIT),
        Lease::new(Slack::percent(SLACK_PERCENT)),
    )
    .await
}

async fn leased_on(url: &str, clock: &ManualClock, limit: Limit, lease: Lease) -> LeasedLimiter {
    let clock = clock.clone();
    let backend = RedisBackend::builder(url)
        .time_from(clock.clone())
        .clock(clock)
        .timeout(std::time::Duration::from_secs(5))
        .deny_cache(0)
        .connect()
        .await
        .unwrap();
    RedisLimiter::builder(&backend, "leased-fleet")
        .limit(Kind::TokenBucket, limit)
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
        .leased(lease)
        .unwrap()
}

/// The per-day limit the kill test shares between the holding child and the survivor (per
/// day, so an hour's move of the clock refills little).
fn daily() -> Limit {
    Limit::per_day(LIMIT)
}

/// The entry point of the child the kill test starts: with the environment variable set, it
/// makes 50 calls, prints what it admitted and leased, then holds its lease until it is
/// killed (or its standard input closes); run normally, it has nothing to do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holding_child_process_entry_point() {
    let Ok(url) = std::env::var(HOLD_URL) else {
        return;
    };
    let clock = ManualClock::starting_at(START);
    let lease = Lease::new(Slack::percent(SLACK_PERCENT)).ttl(HOLD_TTL);
    let limiter = leased_on(&url, &clock, daily(), lease).await;
    let mut admitted = 0u64;
    for _ in 0..50 {
        admitted += u64::from(limiter.check("held").await.unwrap().is_allowed());
    }
    println!(
        "holding admitted={admitted} leased={} holder={}",
        limiter.stats().leased,
        limiter.stack().holder()
    );
    // Hold the lease: block until the parent kills this process.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// The entry point of the child processes the test below starts: with the environment
/// variable set, it makes `ATTEMPTS` calls on `TASKS` tasks, refunds what it holds and
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
    limiter.refund_leases().await;
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
    let children: Vec<_> = (0..3)
        .map(|_| {
            limiter_testkit::child_test(module_path!(), "leased_child_process_entry_point")
                .env(CHILD_URL, server.url())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
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
    // the slack (and were refunded).
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

/// Remaining units of `key` as Redis holds them (a peek on the per-call path).
async fn redis_remaining(node: &LeasedLimiter, key: &str) -> u64 {
    let peek = node.stack().stack().check_n(&key.to_owned(), 0).await;
    peek.unwrap().decision().unwrap().remaining()
}

#[test]
fn a_process_killed_holding_a_lease_loses_that_lease_and_nothing_more() {
    let server = common::RedisServer::start();
    let mut child =
        limiter_testkit::child_test(module_path!(), "holding_child_process_entry_point")
            .env(HOLD_URL, server.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the holding child");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let holding = stdout
        .lines()
        .map_while(Result::ok)
        // libtest may print the test's name on the same line first.
        .find_map(|line| line.find("holding ").map(|at| line[at..].to_owned()))
        .expect("the child reports its lease before it is killed");
    child.kill().unwrap(); // SIGKILL: no shutdown, nothing refunded
    child.wait().unwrap();
    let child_admitted = field(&holding, "admitted=");
    let child_leased = field(&holding, "leased=");
    let child_holder = holding
        .split_whitespace()
        .find_map(|w| w.strip_prefix("holder="))
        .unwrap()
        .to_owned();
    assert_eq!(child_admitted, 50, "{holding}");
    let slack = LIMIT * SLACK_PERCENT / 100;
    assert!(child_leased > 0, "{holding}");

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let clock = ManualClock::starting_at(START);
        let lease = Lease::new(Slack::percent(SLACK_PERCENT)).ttl(HOLD_TTL);
        let survivor = leased_on(&server.url(), &clock, daily(), lease).await;
        let remaining = redis_remaining(&survivor, "held").await;
        // What the dead process took from the bucket and did not admit: its unspent lease.
        let lost = LIMIT - child_admitted - remaining;
        assert!(
            lost > 0 && lost <= child_leased.min(slack),
            "lost {lost}: the dead process held a lease, within the slack of {slack}"
        );
        let mut admitted = 0;
        for _ in 0..LIMIT + slack {
            admitted += u64::from(survivor.check("held").await.unwrap().is_allowed());
        }
        assert_eq!(
            admitted, remaining,
            "the survivor admits all that is left, the dead lease excepted"
        );
        assert_eq!(child_admitted + admitted + lost, LIMIT);

        let ledger = format!(
            "{}:lease",
            survivor.stack().stack().redis_keys(&"held".to_owned())[0]
        );
        let mut conn = server.client();
        let holders: Vec<String> = redis::cmd("HKEYS").arg(&ledger).query(&mut conn).unwrap();
        assert!(
            holders.iter().any(|h| h.starts_with(&child_holder)),
            "the dead lease is recorded until it expires: {holders:?}"
        );
        // Past the dead lease's time to live its slack is free again: the next renewal prunes
        // it, and only the survivor is recorded.
        clock.advance(HOLD_TTL + Duration::from_secs(1));
        assert!(survivor.check("held").await.unwrap().is_allowed());
        let holders: Vec<String> = redis::cmd("HKEYS").arg(&ledger).query(&mut conn).unwrap();
        assert!(
            holders
                .iter()
                .all(|h| h.starts_with(survivor.stack().holder())),
            "{holders:?}"
        );
        survivor.refund_leases().await;
    });
}

/// What the ledger of the one leased key holds: each holder's units.
fn ledger_units(url: &str) -> Vec<u64> {
    let mut redis = redis::Client::open(url).unwrap().get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*:lease").query(&mut redis).unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let records: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(&keys[0])
        .query(&mut redis)
        .unwrap();
    records
        .iter()
        .map(|(_, record)| record.split(' ').next().unwrap().parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_running_low_is_renewed_ahead_keeping_what_is_left() {
    let server = common::RedisServer::start();
    let clock = ManualClock::starting_at(START);
    let lease = Lease::new(Slack::units(100)).ttl(Duration::from_secs(600));
    let node = leased_on(&server.url(), &clock, Limit::per_hour(LIMIT), lease).await;
    // A first lease of one unit, then (the frozen clock makes demand look endless) the whole
    // slack: 100 units.
    while node.stats().leased < 100 {
        node.check("hot").await.unwrap();
    }
    let (renewals, leased) = (node.stats().renewals, node.stats().leased);
    // 51 spent leave 49, under half the lease: the next is asked for ahead.
    for _ in 0..51 {
        let d = node.check("hot").await.unwrap();
        assert_eq!(d.origin(), Some(limiter_redis::Origin::Lease));
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while node.stats().leased == leased {
        assert!(std::time::Instant::now() < deadline, "never renewed ahead");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // One call in the background: the 49 left are kept and 51 more taken (the slack's 100
    // less what is kept), and the ledger counts the 100 as this holder's one lease.
    assert_eq!(node.stats().renewals, renewals + 1);
    assert_eq!(node.stats().leased, leased + 51);
    assert_eq!(ledger_units(&server.url()), [100]);
    // So 50 more calls are decided here (leaving half), none waiting for Redis.
    for _ in 0..50 {
        let d = node.check("hot").await.unwrap();
        assert_eq!(d.origin(), Some(limiter_redis::Origin::Lease));
    }
    assert_eq!(node.stats().renewals, renewals + 1);
    // Every unit admitted was taken from the bucket: the first call's, the leases'.
    let taken = LIMIT - redis_remaining(&node, "hot").await;
    assert_eq!(
        taken,
        node.stats().leased + 2,
        "the two renewing callers' units"
    );

    // Redis's ledger counts fewer units as this node's than it holds (say, written over): a
    // renewal ahead keeps no more than the ledger counts, so what the node may spend never
    // passes what the ledger records. 50 left: one more spend asks (49 < 50).
    let mut redis = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*:lease").query(&mut redis).unwrap();
    let records: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(&keys[0])
        .query(&mut redis)
        .unwrap();
    let (holder, record) = &records[0];
    let rest = record.split_once(' ').unwrap().1;
    let _: () = redis::cmd("HSET")
        .arg(&keys[0])
        .arg(holder)
        .arg(format!("20 {rest}"))
        .query(&mut redis)
        .unwrap();
    let leased = node.stats().leased;
    node.check("hot").await.unwrap();
    while node.stats().leased == leased {
        assert!(std::time::Instant::now() < deadline, "never renewed ahead");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // 20 kept (not the 29 left) and 80 taken: the ledger's 100 is all the node holds.
    assert_eq!(node.stats().leased, leased + 80);
    assert_eq!(ledger_units(&server.url()), [100]);

    // A record spent from the lease asks ahead too: 60 of the 100 leave 40.
    let leased = node.stats().leased;
    let d = node.record("hot", 60).await.unwrap();
    assert_eq!(d.origin(), Some(limiter_redis::Origin::Lease));
    while node.stats().leased == leased {
        assert!(
            std::time::Instant::now() < deadline,
            "a record never asked ahead"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(ledger_units(&server.url()), [100]);
}
