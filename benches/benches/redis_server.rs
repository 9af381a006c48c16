//! What a decision costs the shared Redis: microseconds of server CPU per decision, read from
//! Redis's own accounting (`INFO commandstats`, reset before each subject), so client-side noise
//! does not enter. Beside our decisions, in the same run, the floors: a bare `INCR`, an
//! `EVALSHA` of `return 1`, a script doing `GET` and `SET PX` of one key (the floor for a stored
//! state), and envoy's reference pattern (`INCRBY` and `EXPIRE`, pipelined).
//!
//! Every subject spreads its calls over 2,000 keys, all admitted. `one_limit_*`: one call per
//! decision (nothing to coalesce with); `stack_3_limits`: a stack of three layers;
//! `coalesced_16`: 16 callers on one backend, each deciding again as soon as it is answered,
//! whose decisions share script calls; `denied_1_limit`: every call denied (the deny cache
//! off, so each reaches the script); `cluster_coalesced_16`: the same 16 callers on a
//! three-master Redis Cluster, on one master at a time (coalesced per master, across its
//! slots), its CPU summed over the masters, and `cluster_spread_16` on all three at once; `wait_1_replica`: one limit whose admissions wait for one replica (`WAIT`,
//! its CPU and the scripts'), and `wall_one_limit` / `wall_wait_1_replica`: the wall-clock
//! time of one decision after another without and with it (µs, not CPU).
//!
//! Each subject runs `LIMITER_BENCH_PASSES` times (3 by default; `LIMITER_BENCH_QUICK` runs one
//! short pass) and every pass's figure goes to `<target>/bench-redis-server.csv` as
//! `subject,pass,µs per decision`, which `cargo xtask bench` reads for the targets. Starts its
//! own `redis-server` (skipped if there is none); criterion is not involved (no timing here).

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use limiter_core::Limit;
use limiter_redis::{Kind, OnFailure, RedisBackend, RedisLayer, RedisLimiter, RedisStack};
use limiter_testkit::redis_server::{RedisCluster, RedisServer, raw_command, wait_until};

const KEYS: u64 = 2_000;

/// Server CPU, in µs, spent in the commands named (from `INFO commandstats`).
async fn usec_in(conn: &mut redis::aio::MultiplexedConnection, commands: &[&str]) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let mut total = 0.0;
    for line in info.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if !commands.contains(&name) {
            continue;
        }
        for field in stats.split(',') {
            if let Some(usec) = field.strip_prefix("usec=") {
                total += usec.parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    total
}

async fn reset(conn: &mut redis::aio::MultiplexedConnection) {
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(conn)
        .await
        .expect("CONFIG RESETSTAT");
}

/// The script commands a decision may be counted under.
const SCRIPTS: &[&str] = &["evalsha", "eval", "fcall", "fcall_ro"];

/// Server CPU, in µs, spent in script calls on every master of `cluster` (and resets their
/// counts when `reset`).
fn cluster_usec(cluster: &RedisCluster, reset: bool) -> f64 {
    cluster
        .nodes
        .iter()
        .map(|node| {
            let mut conn = node.client();
            if reset {
                let _: () = redis::cmd("CONFIG")
                    .arg("RESETSTAT")
                    .query(&mut conn)
                    .expect("CONFIG RESETSTAT");
                return 0.0;
            }
            let info: String = redis::cmd("INFO")
                .arg("commandstats")
                .query(&mut conn)
                .expect("INFO commandstats");
            info.lines()
                .filter_map(|l| l.strip_prefix("cmdstat_")?.split_once(':'))
                .filter(|(name, _)| SCRIPTS.contains(name))
                .flat_map(|(_, stats)| stats.split(','))
                .filter_map(|f| f.strip_prefix("usec=")?.parse::<f64>().ok())
                .sum::<f64>()
        })
        .sum()
}

/// 16 callers, each deciding one of `keys` after another as fast as its answers come,
/// `per_caller` decisions each: what coalescing packs into each script call under steady load.
async fn sixteen_callers(limiter: &RedisLimiter, keys: &[String], per_caller: u64) {
    join_all((0..16u64).map(|caller| async move {
        for i in 0..per_caller {
            let at = usize::try_from((caller * per_caller + i) % keys.len() as u64).unwrap_or(0);
            let d = limiter.check(&keys[at]).await.expect("decided");
            assert!(d.is_allowed(), "{d:?}");
        }
    }))
    .await;
}

/// `KEYS` identifiers whose keys `limiter` puts on each master of `cluster` (spread over that
/// master's slots), by master.
fn keys_by_master(cluster: &RedisCluster, limiter: &RedisLimiter) -> Vec<Vec<String>> {
    let mut by_master = vec![Vec::new(); cluster.nodes.len()];
    for i in 0.. {
        if by_master
            .iter()
            .all(|keys: &Vec<String>| keys.len() as u64 >= KEYS)
        {
            break;
        }
        let id = format!("c{i}");
        let master = cluster.master_of(&limiter.redis_keys(&id)[0]);
        if (by_master[master].len() as u64) < KEYS {
            by_master[master].push(id);
        }
    }
    by_master
}

/// µs of wall-clock time per decision of `limiter`, one after another.
async fn wall_per_decision(limiter: &RedisLimiter, decisions: u64) -> f64 {
    let started = Instant::now();
    for i in 0..decisions {
        let d = limiter
            .check(&(i % KEYS).to_string())
            .await
            .expect("decided");
        assert!(d.is_allowed(), "{d:?}");
    }
    started.elapsed().as_secs_f64() * 1e6 / decisions as f64
}

/// Runs `decisions` decisions of `subject` (an async closure of the decision's number) and
/// returns the server CPU per decision spent in `commands`.
async fn measure<F, Fut>(
    conn: &mut redis::aio::MultiplexedConnection,
    commands: &[&str],
    decisions: u64,
    subject: F,
) -> f64
where
    F: Fn(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    // One warm-up round (scripts loaded, keys present), not counted.
    for i in 0..KEYS.min(decisions) {
        subject(i).await;
    }
    reset(conn).await;
    for i in 0..decisions {
        subject(i).await;
    }
    usec_in(conn, commands).await / decisions as f64
}

struct Req(u64);

fn main() {
    // Criterion's arguments (a filter) may come along from `cargo bench`: run only when the
    // filter names this group, or none is given.
    // (Flags and their numeric values, such as `--measurement-time 0.3`, are no filter.)
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-') && a.parse::<f64>().is_err())
        .collect();
    if !filter.is_empty()
        && !filter
            .iter()
            .any(|f| "redis_server".contains(f.as_str()) || f.contains("redis_server"))
    {
        return;
    }
    let Some(server) = limiter_benches::RedisProcess::start() else {
        eprintln!("redis_server: no redis-server to start; skipping");
        return;
    };
    let quick = std::env::var_os("LIMITER_BENCH_QUICK").is_some();
    let passes: usize = if quick {
        1
    } else {
        std::env::var("LIMITER_BENCH_PASSES")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(3)
    };
    let decisions: u64 = if quick { 4_000 } else { 20_000 };
    let url = server.url();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let mut lines = String::new();
    rt.block_on(async {
        let client = redis::Client::open(url.as_str()).expect("a client");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection");
        let backend = RedisBackend::builder(&url)
            .timeout(Duration::from_secs(2))
            .deny_cache(0)
            .connect()
            .await
            .expect("the backend");
        let roomy = Limit::per_second(1_000_000_000);
        let one = |kind: Kind| {
            RedisLimiter::builder(&backend, format!("cpu-{kind}"))
                .limit(kind, roomy)
                .on_failure(OnFailure::Closed)
                .build()
                .expect("a limiter")
        };
        let bucket = one(Kind::TokenBucket);
        let fixed = one(Kind::FixedWindow);
        let sliding = RedisLimiter::builder(&backend, "cpu-sliding")
            .limit(Kind::SlidingWindow, Limit::per_second(1_000_000))
            .on_failure(OnFailure::Closed)
            .build()
            .expect("a limiter");
        let denied = RedisLimiter::builder(&backend, "cpu-denied")
            .limit(Kind::TokenBucket, Limit::per_hour(1))
            .on_failure(OnFailure::Closed)
            .build()
            .expect("a limiter");
        let stack = RedisStack::builder(&backend, "cpu-stack")
            .layer(
                RedisLayer::keyed("user", |r: &Req| Some(r.0.to_string()))
                    .limit(Kind::TokenBucket, roomy),
            )
            .layer(
                RedisLayer::keyed("team", |r: &Req| Some((r.0 % 97).to_string()))
                    .limit(Kind::SlidingWindow, Limit::per_second(1_000_000)),
            )
            .layer(RedisLayer::global("all").limit(Kind::FixedWindow, roomy))
            .on_failure(OnFailure::Closed)
            .build()
            .expect("a stack");
        // A three-master cluster, and a replica of the server for `WAIT`.
        let cluster = RedisCluster::start();
        let on_cluster = RedisBackend::cluster_builder(cluster.urls())
            .timeout(Duration::from_secs(2))
            .deny_cache(0)
            .connect()
            .await
            .expect("the cluster backend");
        let cluster_bucket = RedisLimiter::builder(&on_cluster, "cpu-cluster")
            .limit(Kind::TokenBucket, roomy)
            .on_failure(OnFailure::Closed)
            .build()
            .expect("a limiter");
        let cluster_keys = keys_by_master(&cluster, &cluster_bucket);
        let all_keys: Vec<String> = (0..KEYS).map(|k| k.to_string()).collect();
        let replica = RedisServer::start_with(vec![
            "--replicaof".into(),
            "127.0.0.1".into(),
            server.port.to_string(),
        ]);
        let replica_port = replica.port;
        wait_until("the replica to be in sync", || {
            raw_command(replica_port, "INFO replication")
                .is_some_and(|r| r.contains("master_link_status:up"))
        });
        let waiting = RedisBackend::builder(&url)
            .timeout(Duration::from_secs(2))
            .deny_cache(0)
            .wait_for_replicas(1, Duration::from_secs(1))
            .connect()
            .await
            .expect("the waiting backend");
        let wait_bucket = RedisLimiter::builder(&waiting, "cpu-wait")
            .limit(Kind::TokenBucket, roomy)
            .on_failure(OnFailure::Closed)
            .build()
            .expect("a limiter");
        let get_set = redis::Script::new(
            "local v = redis.call('GET', KEYS[1]) if not v then v = '0' end \
             redis.call('SET', KEYS[1], v, 'PX', 60000) return 1",
        );
        let nothing = redis::Script::new("return 1");
        let key = |i: u64| format!("floor:{}", i % KEYS);
        for pass in 0..passes {
            let mut row = |name: &str, usec: f64| {
                let what = if name.starts_with("wall_") {
                    "of wall-clock time"
                } else {
                    "of Redis CPU"
                };
                println!("redis_server/{name}: {usec:.2} µs {what} per decision (pass {pass})");
                lines.push_str(&format!("{name},{pass},{usec}\n"));
            };
            let c = conn.clone();
            let usec = measure(&mut conn, &["incr"], decisions, |i| {
                let mut c = c.clone();
                let k = key(i);
                async move {
                    let _: i64 = redis::cmd("INCR")
                        .arg(k)
                        .query_async(&mut c)
                        .await
                        .expect("INCR");
                }
            })
            .await;
            row("floor_incr", usec);
            let usec = measure(&mut conn, SCRIPTS, decisions, |_| {
                let mut c = c.clone();
                let s = &nothing;
                async move {
                    let _: i64 = s.invoke_async(&mut c).await.expect("return 1");
                }
            })
            .await;
            row("floor_evalsha_return_1", usec);
            let usec = measure(&mut conn, SCRIPTS, decisions, |i| {
                let mut c = c.clone();
                let k = key(i);
                let s = &get_set;
                async move {
                    let _: i64 = s.key(k).invoke_async(&mut c).await.expect("GET SET");
                }
            })
            .await;
            row("floor_get_set_px", usec);
            let usec = measure(&mut conn, &["incrby", "expire"], decisions, |i| {
                let mut c = c.clone();
                let k = key(i);
                async move {
                    let _: (i64, i64) = redis::pipe()
                        .cmd("INCRBY")
                        .arg(&k)
                        .arg(1)
                        .cmd("EXPIRE")
                        .arg(&k)
                        .arg(60)
                        .query_async(&mut c)
                        .await
                        .expect("INCRBY EXPIRE");
                }
            })
            .await;
            row("floor_envoy_incrby_expire", usec);
            for (name, limiter) in [
                ("one_limit_token_bucket", &bucket),
                ("one_limit_fixed_window", &fixed),
                ("one_limit_sliding_window", &sliding),
            ] {
                let usec = measure(&mut conn, SCRIPTS, decisions, |i| async move {
                    let d = limiter
                        .check(&(i % KEYS).to_string())
                        .await
                        .expect("decided");
                    assert!(d.is_allowed(), "{d:?}");
                })
                .await;
                row(name, usec);
            }
            let usec = measure(&mut conn, SCRIPTS, decisions, |i| {
                let denied = &denied;
                async move {
                    let d = denied
                        .check(&format!("d{}", i % KEYS))
                        .await
                        .expect("decided");
                    assert!(i < KEYS || d.is_denied(), "{d:?}");
                }
            })
            .await;
            row("denied_1_limit", usec);
            let usec = measure(&mut conn, SCRIPTS, decisions, |i| {
                let stack = &stack;
                async move {
                    let d = stack.check(&Req(i % KEYS)).await.expect("decided");
                    assert!(d.is_allowed(), "{d:?}");
                }
            })
            .await;
            row("stack_3_limits", usec);
            let per_caller = decisions / 16;
            sixteen_callers(&bucket, &all_keys, KEYS / 16).await;
            reset(&mut conn).await;
            sixteen_callers(&bucket, &all_keys, per_caller).await;
            let usec = usec_in(&mut conn, SCRIPTS).await / (per_caller * 16) as f64;
            row("coalesced_16", usec);
            // The cluster, 16 callers on each master in turn (keys over its slots): the same
            // load per master as the one server's, each master's CPU unshared with the others'
            // on this machine's two cores.
            for keys in &cluster_keys {
                sixteen_callers(&cluster_bucket, keys, KEYS / 16).await;
            }
            cluster_usec(&cluster, true);
            for keys in &cluster_keys {
                sixteen_callers(&cluster_bucket, keys, per_caller / 3).await;
            }
            let usec = cluster_usec(&cluster, false) / (per_caller / 3 * 3 * 16) as f64;
            row("cluster_coalesced_16", usec);
            // The same 16 callers on every master at once (about 5 per master, and three Redis
            // processes and the client sharing two cores: each command's time grows).
            cluster_usec(&cluster, true);
            sixteen_callers(&cluster_bucket, &all_keys, per_caller).await;
            let usec = cluster_usec(&cluster, false) / (per_caller * 16) as f64;
            row("cluster_spread_16", usec);
            let usec = measure(
                &mut conn,
                &["fcall", "evalsha", "eval", "wait"],
                decisions / 4,
                |i| {
                    let wait_bucket = &wait_bucket;
                    async move {
                        let d = wait_bucket
                            .check(&(i % KEYS).to_string())
                            .await
                            .expect("decided");
                        assert!(d.is_allowed(), "{d:?}");
                    }
                },
            )
            .await;
            row("wait_1_replica", usec);
            row(
                "wall_one_limit",
                wall_per_decision(&bucket, decisions / 4).await,
            );
            row(
                "wall_wait_1_replica",
                wall_per_decision(&wait_bucket, decisions / 4).await,
            );
        }
    });
    let csv = limiter_benches::target_dir().join("bench-redis-server.csv");
    if let Some(dir) = csv.parent() {
        let _ = std::fs::create_dir_all(dir);
    }
    if let Err(e) = std::fs::write(&csv, lines) {
        eprintln!("redis_server: cannot write {}: {e}", csv.display());
    }
    drop(server);
}
