//! Permits on Redis against a real `redis-server`: exact under racing tasks and across
//! processes, a release that is idempotent, expiry and renewal on a pinned clock, and a holder
//! killed with SIGKILL losing its permits after their time to live and nothing else; the
//! fleet's total (every key's permits, from the name's index) follows each of those, on one
//! server and on a cluster; a key or index of another type is refused and takes no permit.

use limiter_testkit::redis_server as common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use limiter_core::ManualClock;
use limiter_redis::{Acquired, BuildError, RedisBackend, RedisPermits};

const TTL: Duration = Duration::from_secs(30);
/// A Unix time (ns) the pinned tests start at.
const START: u64 = 1_795_000_000_000_000_000;
const CHILD_URL: &str = "LIMITER_REDIS_PERMITS_CHILD_URL";
const HOLD_URL: &str = "LIMITER_REDIS_PERMITS_HOLD_URL";

async fn pinned(server: &common::RedisServer, clock: &ManualClock) -> RedisBackend {
    RedisBackend::builder(server.url().as_str())
        .time_from(clock.clone())
        // Not a test of timeouts: a loaded machine (the whole suite at once) must not fail it.
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connects")
}

/// Permits `jobs`, 2 per key, on `server` with `clock` set to [`START`].
async fn two_jobs(server: &common::RedisServer, clock: &ManualClock) -> RedisPermits {
    clock.set(START);
    pinned(server, clock).await.permits("jobs", 2, TTL).unwrap()
}

fn permit(acquired: Acquired) -> limiter_redis::RedisPermit {
    match acquired {
        Acquired::Held(permit) => permit,
        busy => panic!("expected a permit, got {busy:?}"),
    }
}

#[tokio::test]
async fn a_release_is_idempotent_and_an_expired_permit_is_gone_once() {
    let server = common::RedisServer::start();
    let clock = ManualClock::new();
    let permits = two_jobs(&server, &clock).await;
    let first = permit(permits.acquire("acme").await.unwrap());
    assert_eq!(first.expires_at_ms(), START / 1_000_000 + 30_000);
    let second = permit(permits.acquire("acme").await.unwrap());
    assert_ne!(first.id(), second.id());
    let Acquired::Busy {
        held,
        count,
        retry_after,
    } = permits.acquire("acme").await.unwrap()
    else {
        panic!("a third permit past the count");
    };
    assert_eq!((held, count, retry_after), (2, 2, TTL));
    assert_eq!(
        permits.held_total().await.unwrap(),
        2,
        "every key's, from the index"
    );
    assert!(permits.release("acme", first.id()).await.unwrap());
    assert!(
        !permits.release("acme", first.id()).await.unwrap(),
        "released once"
    );
    assert_eq!(permits.held("acme").await.unwrap(), 1);
    assert_eq!(
        permits.held_total().await.unwrap(),
        1,
        "released once, unindexed once"
    );

    // Renewed at 20 s, the second outlives its first expiry; at 50 s it is gone, and
    // releasing it answers false: it expired.
    clock.advance(Duration::from_secs(20));
    let renewed = permits.renew("acme", second.id()).await.unwrap();
    assert_eq!(renewed, Some(START / 1_000_000 + 50_000));
    clock.advance(Duration::from_secs(15));
    assert_eq!(
        permits.held("acme").await.unwrap(),
        1,
        "renewed: still held"
    );
    let other = permit(permits.acquire("other").await.unwrap());
    assert_eq!(
        permits.held_total().await.unwrap(),
        2,
        "a renewed permit and another key's"
    );
    assert!(
        permits.release("other", other.id()).await.unwrap(),
        "another key, its own permits"
    );
    clock.advance(Duration::from_secs(15));
    assert_eq!(permits.held("acme").await.unwrap(), 0, "expired");
    assert_eq!(
        permits.held_total().await.unwrap(),
        0,
        "expired from the index too"
    );
    assert!(!permits.release("acme", second.id()).await.unwrap());
    assert_eq!(permits.renew("acme", second.id()).await.unwrap(), None);
}

/// A key or the name's index holding another type (an operator's, another program's under the
/// prefix) refuses the call with an error naming it and the fix, and is left as found; no
/// permit is taken for a call that failed. Reads (what a key holds, the name's total) name it
/// too.
#[tokio::test]
async fn a_key_of_another_type_is_refused_naming_it_and_takes_no_permit() {
    use redis::Commands;
    let server = common::RedisServer::start();
    let clock = ManualClock::new();
    let permits = two_jobs(&server, &clock).await;
    let mut conn = server.client();
    let _: () = conn.set("limiter:permits:jobs:{acme}", "mine").unwrap();
    let error = permits.acquire("acme").await.unwrap_err().to_string();
    assert!(error.contains("limiter:permits:jobs:{acme}"), "{error}");
    assert!(error.contains("delete it or change the prefix"), "{error}");
    let error = permits.release("acme", "some-id").await.unwrap_err();
    assert!(error.to_string().contains("{acme}"), "{error}");
    // Read only, too: what it holds is not answered as Redis's bare `WRONGTYPE`.
    let error = permits.held("acme").await.unwrap_err().to_string();
    assert!(error.contains("limiter:permits:jobs:{acme}"), "{error}");
    assert!(error.contains("delete it or change the prefix"), "{error}");
    let kept: String = conn.get("limiter:permits:jobs:{acme}").unwrap();
    assert_eq!(kept, "mine", "left as found");

    // The index of every key's permits spoilt: the key's permit is not taken either.
    let _: () = conn.set("limiter:permits:{jobs}", "mine").unwrap();
    let error = permits.acquire("bolt").await.unwrap_err().to_string();
    assert!(error.contains("limiter:permits:{jobs}"), "{error}");
    let error = permits.held_total().await.unwrap_err().to_string();
    assert!(error.contains("limiter:permits:{jobs}"), "{error}");
    assert!(error.contains("delete it or change the prefix"), "{error}");
    let _: () = conn.del("limiter:permits:{jobs}").unwrap();
    assert_eq!(permits.held("bolt").await.unwrap(), 0, "no permit taken");
    let first = permit(permits.acquire("bolt").await.unwrap());
    assert_eq!(permits.held_total().await.unwrap(), 1);
    assert!(permits.release("bolt", first.id()).await.unwrap());
}

#[tokio::test]
async fn bad_settings_are_refused_naming_the_range() {
    let server = common::RedisServer::start();
    let backend = RedisBackend::builder(server.url().as_str())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    for (count, ttl) in [
        (0, TTL),
        (3, Duration::ZERO),
        (3, Duration::from_secs(90_000)),
    ] {
        let err = backend.permits("jobs", count, ttl).unwrap_err();
        assert!(matches!(err, BuildError::Permits { .. }), "{err}");
        assert!(err.to_string().contains("give 1"), "{err}");
    }
    // A name or prefix a Redis key cannot hold as laid out is refused, naming the part.
    for name in ["", "a{b", "a}b"] {
        let err = backend.permits(name, 3, TTL).unwrap_err();
        assert!(
            matches!(
                err,
                BuildError::BadName {
                    what: "permits",
                    ..
                }
            ),
            "{err}"
        );
    }
    let permits = backend.permits("jobs:daily", 3, TTL).unwrap();
    let err = permits.with_prefix("{app}").unwrap_err();
    assert!(
        matches!(err, BuildError::BadName { what: "prefix", .. }),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_keys_of_every_master_hold_and_release_their_permits() {
    let cluster = common::RedisCluster::start();
    let backend = RedisBackend::cluster_builder(cluster.urls())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let permits = backend
        .permits("jobs", 1, TTL)
        .unwrap()
        .with_prefix("app")
        .unwrap();
    // Sixty keys land on every master; each holds its one permit, refuses a second, and
    // gives it back once.
    let mut held = Vec::new();
    for n in 0..60 {
        let key = format!("customer-{n}");
        held.push((key.clone(), permit(permits.acquire(&key).await.unwrap())));
        assert!(matches!(
            permits.acquire(&key).await.unwrap(),
            Acquired::Busy {
                held: 1,
                count: 1,
                ..
            }
        ));
    }
    // One total over every master's keys, from the index in its own slot.
    assert_eq!(permits.held_total().await.unwrap(), 60);
    for (key, permit) in &held {
        assert!(permits.release(key, permit.id()).await.unwrap());
        assert!(!permits.release(key, permit.id()).await.unwrap());
        assert_eq!(permits.held(key).await.unwrap(), 0);
    }
    assert_eq!(permits.held_total().await.unwrap(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_tasks_never_hold_more_than_the_count() {
    let server = common::RedisServer::start();
    let backend = RedisBackend::builder(server.url().as_str())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let permits = Arc::new(backend.permits("race", 3, TTL).unwrap());
    let in_flight = Arc::new(AtomicU64::new(0));
    let most = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let (permits, in_flight, most) = (
                Arc::clone(&permits),
                Arc::clone(&in_flight),
                Arc::clone(&most),
            );
            tokio::spawn(async move {
                let mut admitted = 0u64;
                for _ in 0..100 {
                    let Acquired::Held(permit) = permits.acquire("hot").await.unwrap() else {
                        continue;
                    };
                    admitted += 1;
                    // SeqCst: the count must order with Redis's answers as seen here.
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    assert!(permits.release("hot", permit.id()).await.unwrap());
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    assert!(admitted > 0);
    assert!(most.load(Ordering::SeqCst) <= 3, "more than 3 in flight");
    assert_eq!(permits.held("hot").await.unwrap(), 0);
}

/// The entry point of the child processes the next test starts: with the variable set, it
/// takes as many permits as it can (never releasing) and prints how many; run normally, it has
/// nothing to do.
#[tokio::test]
async fn permits_child_process_entry_point() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    let permits = shared(&url).await;
    let mut taken = 0;
    for _ in 0..5 {
        if let Acquired::Held(_) = permits.acquire("shared").await.unwrap() {
            taken += 1;
        }
    }
    println!("taken={taken}");
}

async fn shared(url: &str) -> RedisPermits {
    let backend = RedisBackend::builder(url)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connects");
    backend
        .permits("fleet", 4, Duration::from_secs(600))
        .unwrap()
}

fn child(entry: &str, var: &str, url: &str) -> Command {
    let mut command = limiter_testkit::child_test(module_path!(), entry);
    command.env(var, url);
    command
}

fn field(stdout: &str, name: &str) -> u64 {
    stdout
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in the child's output: {stdout}"))
}

#[test]
fn processes_racing_for_permits_take_exactly_the_count() {
    let server = common::RedisServer::start();
    let children: Vec<_> = (0..3)
        .map(|_| {
            child(
                "permits_child_process_entry_point",
                CHILD_URL,
                &server.url(),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a child test process")
        })
        .collect();
    let mut total = 0;
    for child in children {
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success(), "child failed: {stdout}");
        total += field(&stdout, "taken=");
    }
    // Three processes asked for 15 permits of a key that holds 4, none released: exactly 4,
    // and the fleet's total indexed those 4 alone.
    assert_eq!(total, 4);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let indexed = runtime.block_on(async { shared(&server.url()).await.held_total().await });
    assert_eq!(indexed.unwrap(), 4);
}

/// The entry point of the holder the SIGKILL test starts: takes two permits, says so, and
/// blocks until it is killed.
#[tokio::test]
async fn permits_holder_process_entry_point() {
    let Ok(url) = std::env::var(HOLD_URL) else {
        return;
    };
    let backend = RedisBackend::builder(url.as_str())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("connects");
    let permits = backend.permits("holders", 3, TTL).unwrap();
    for _ in 0..2 {
        permit(permits.acquire("acme").await.unwrap());
    }
    println!("holding");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

#[tokio::test]
async fn a_holder_killed_with_sigkill_loses_its_permits_after_their_ttl_and_nothing_else() {
    let server = common::RedisServer::start();
    let mut holder = child(
        "permits_holder_process_entry_point",
        HOLD_URL,
        &server.url(),
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .expect("start the holder");
    let stdout = BufReader::new(holder.stdout.take().unwrap());
    assert!(
        stdout
            .lines()
            .map_while(Result::ok)
            .any(|line| line.contains("holding")),
        "the holder reports its permits before it is killed"
    );
    holder.kill().unwrap(); // SIGKILL: nothing released
    holder.wait().unwrap();

    // This process reads time from a clock it moves, started at the wall clock (the holder
    // took its permits by Redis's clock, a moment ago).
    let clock = ManualClock::new();
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    clock.set(u64::try_from(wall.as_nanos()).unwrap());
    let permits = pinned(&server, &clock)
        .await
        .permits("holders", 3, TTL)
        .unwrap();
    assert_eq!(
        permits.held("acme").await.unwrap(),
        2,
        "the dead holder's permits still count"
    );
    assert_eq!(
        permits.held_total().await.unwrap(),
        2,
        "in the fleet's total too"
    );
    let mine = permit(permits.acquire("acme").await.unwrap());
    assert!(matches!(
        permits.acquire("acme").await.unwrap(),
        Acquired::Busy { held: 3, .. }
    ));

    clock.advance(Duration::from_secs(20));
    assert!(permits.renew("acme", mine.id()).await.unwrap().is_some());
    clock.advance(Duration::from_secs(5));
    assert_eq!(
        permits.held("acme").await.unwrap(),
        3,
        "not before their time to live"
    );
    clock.advance(Duration::from_secs(10)); // 35 s: past the dead holder's 30
    assert_eq!(
        permits.held("acme").await.unwrap(),
        1,
        "only this process's renewed permit"
    );
    assert_eq!(
        permits.held_total().await.unwrap(),
        1,
        "the total forgets them too"
    );
    assert!(permits.release("acme", mine.id()).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_wait_for_replicas_a_permit_is_answered_once_a_replica_has_it() {
    let master = common::RedisServer::start();
    let mut replica = common::RedisServer::start_with(vec![
        "--replicaof".into(),
        "127.0.0.1".into(),
        master.port.to_string(),
    ]);
    common::wait_until("the replica to be in sync", || {
        common::raw_command(replica.port, "INFO replication")
            .is_some_and(|info| info.contains("master_link_status:up"))
    });
    common::wait_until_replicated(master.port, replica.port);
    let backend = RedisBackend::builder(master.url().as_str())
        .timeout(Duration::from_secs(2))
        .wait_for_replicas(1, Duration::from_millis(300))
        .connect()
        .await
        .unwrap();
    let permits = backend.permits("replicated", 1, TTL).unwrap();
    let held = permit(permits.acquire("k").await.unwrap());
    // Answered only once the replica acknowledged: it holds the permit already.
    let on_replica = common::raw_command(replica.port, "ZCARD limiter:permits:replicated:{k}");
    assert_eq!(on_replica.as_deref(), Some(":1\r\n"));
    // Without a replica to acknowledge, the write is reported as not replicated (the failure
    // policy's to answer), never as a permit a failover could lose.
    replica.kill();
    common::wait_until("the master to see the replica gone", || {
        common::raw_command(master.port, "INFO replication")
            .is_some_and(|info| info.contains("connected_slaves:0"))
    });
    let err = permits.release("k", held.id()).await.unwrap_err();
    assert!(
        matches!(
            err,
            limiter_redis::BackendError::NotReplicated {
                acked: 0,
                wanted: 1,
                ..
            }
        ),
        "{err}"
    );
    let err = permits.acquire("other").await.unwrap_err();
    assert!(
        matches!(err, limiter_redis::BackendError::NotReplicated { .. }),
        "{err}"
    );
}

/// Calls of `command` the server has counted.
fn calls(server: &common::RedisServer, command: &str) -> u64 {
    let stats = common::raw_command(server.port, "INFO commandstats").expect("INFO");
    common::calls_in(&stats, command)
}

/// A permit's scripts go by their hash (`EVALSHA`), each sent in full (`EVAL`) once to a
/// server that lacks it, and once more after the server's scripts are flushed: not the whole
/// text on every call, which the server would hash each time; and sending one in full is not
/// a load of the decision library.
#[tokio::test]
async fn scripts_go_by_their_hash_and_in_full_once_to_a_server_that_lacks_them() {
    let server = common::RedisServer::start();
    let clock = ManualClock::new();
    clock.set(START);
    let backend = pinned(&server, &clock).await;
    let permits = backend.permits("hashed", 100, TTL).unwrap();
    for _ in 0..5 {
        let held = permit(permits.acquire("acme").await.unwrap());
        assert!(permits.release("acme", held.id()).await.unwrap());
    }
    // Two scripts (an acquire and a release), each sent in full once.
    assert_eq!(calls(&server, "eval"), 2);
    assert!(calls(&server, "evalsha") >= 10, "every call by its hash");
    assert_eq!(
        common::raw_command(server.port, "SCRIPT FLUSH").as_deref(),
        Some("+OK\r\n")
    );
    let held = permit(permits.acquire("acme").await.unwrap());
    assert!(permits.release("acme", held.id()).await.unwrap());
    assert_eq!(calls(&server, "eval"), 4, "sent in full again, once each");
    assert_eq!(permits.held("acme").await.unwrap(), 0);
    // Not the decision library's loads, which would load it on every master of a cluster.
    assert_eq!(backend.stats().script_loads, 0);
    assert_eq!(calls(&server, "function|load"), 0);
}
