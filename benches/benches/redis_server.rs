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
//! off, so each reaches the script).
//!
//! Each subject runs `LIMITER_BENCH_PASSES` times (3 by default; `LIMITER_BENCH_QUICK` runs one
//! short pass) and every pass's figure goes to `<target>/bench-redis-server.csv` as
//! `subject,pass,µs per decision`, which `cargo xtask bench` reads for the targets. Starts its
//! own `redis-server` (skipped if there is none); criterion is not involved (no timing here).

use std::time::Duration;

use futures_util::future::join_all;
use limiter_core::Limit;
use limiter_redis::{Kind, OnFailure, RedisBackend, RedisLayer, RedisLimiter, RedisStack};

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
        let get_set = redis::Script::new(
            "local v = redis.call('GET', KEYS[1]) if not v then v = '0' end \
             redis.call('SET', KEYS[1], v, 'PX', 60000) return 1",
        );
        let nothing = redis::Script::new("return 1");
        let key = |i: u64| format!("floor:{}", i % KEYS);
        for pass in 0..passes {
            let mut row = |name: &str, usec: f64| {
                println!(
                    "redis_server/{name}: {usec:.2} µs of Redis CPU per decision (pass {pass})"
                );
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
            // 16 callers, each deciding one key after another as fast as its answers come:
            // what coalescing packs into each script call under steady load.
            let callers = |per_caller: u64| {
                let bucket = &bucket;
                join_all((0..16u64).map(move |caller| async move {
                    for i in 0..per_caller {
                        let key = (caller * per_caller + i) % KEYS;
                        let d = bucket.check(&key.to_string()).await.expect("decided");
                        assert!(d.is_allowed(), "{d:?}");
                    }
                }))
            };
            callers(KEYS / 16).await;
            reset(&mut conn).await;
            let per_caller = decisions / 16;
            callers(per_caller).await;
            let usec = usec_in(&mut conn, SCRIPTS).await / (per_caller * 16) as f64;
            row("coalesced_16", usec);
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
