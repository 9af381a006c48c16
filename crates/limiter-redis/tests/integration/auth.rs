//! Logging in to a real `redis-server` as an ACL user: the password from the URL, from the
//! builder or from a file (read again at each connection, so a rotated secret applies); a
//! wrong password named as authentication, never as a slow server, and never printed; and a
//! least-privilege user (docs/operations.md's ACL rule: the limiter's commands on its key prefixes)
//! deciding every kind of call exactly.

use limiter_testkit::redis_server::RedisServer;

use std::collections::BTreeSet;
use std::time::Duration;

use limiter_core::Limit;
use limiter_redis::{
    Acquired, BackendError, Kind, Lease, OnFailure, Origin, RedisBackend, RedisLimiter, Secret,
    Slack,
};

const PASSWORD: &str = "s3cret-Pa55-word";

/// docs/operations.md's rule for limiterd's user: its commands, on its key prefixes, nothing else.
const LEAST_PRIVILEGE: &str = "limiter on >s3cret-Pa55-word ~limiter:* ~limiterd:* \
     resetchannels -@all +ping +fcall +function|load +evalsha +eval +get +set +time +pttl \
     +pexpire +hset +hdel +hgetall +incr +zadd +zcard +zcount +zrange +zrem +zremrangebyscore +zscore +cluster|slots +cluster|info +asking +wait";

fn limiter(backend: &RedisBackend, name: &str, count: u64) -> RedisLimiter {
    RedisLimiter::builder(backend, name)
        .limit(Kind::TokenBucket, Limit::per_hour(count))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
}

fn with_password(url: &str, user: &str, password: &str) -> String {
    url.replacen("redis://", &format!("redis://{user}:{password}@"), 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_user_decides_every_kind_of_call_exactly() {
    let server = RedisServer::start_with_users(&[LEAST_PRIVILEGE]);
    let backend = RedisBackend::builder(with_password(&server.url(), "limiter", PASSWORD))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    assert!(backend.health().await.is_ready());
    let three = limiter(&backend, "acl", 3);
    for left in [2, 1, 0] {
        let d = three.check("k").await.unwrap();
        assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
        assert_eq!(d.decision().unwrap().remaining(), left);
    }
    assert!(three.check("k").await.unwrap().is_denied());
    // A batch, all or nothing: 2 + 2 of 3 is refused and takes nothing.
    let batch = three.check_all(&[("b", 2), ("b", 2)]).await.unwrap();
    assert!(!batch.is_admitted());
    assert_eq!(
        three.check_n("b", 3).await.unwrap().origin(),
        Some(Origin::Remote)
    );
    // A grant and its refund.
    let (d, grant) = three.acquire("g", 3).await.unwrap();
    assert!(d.is_allowed());
    let mut grant = grant.unwrap();
    three.refund("g", &mut grant, 2).await.unwrap();
    assert_eq!(
        three.check_n("g", 2).await.unwrap().origin(),
        Some(Origin::Remote)
    );
    // A record of usage, and a lease.
    assert!(three.record("r", 5).await.unwrap().origin() == Some(Origin::Remote));
    let leased = limiter(&backend, "leased", 100)
        .leased(Lease::new(Slack::units(10)))
        .unwrap();
    for _ in 0..20 {
        assert!(leased.check("l").await.unwrap().is_allowed());
    }
    leased.refund_leases().await;
    // Records beside the limits (limiterd's overrides).
    let records = backend
        .records("acl")
        .unwrap()
        .with_prefix("limiterd")
        .unwrap();
    assert_eq!(records.put("a", "1").await.unwrap(), 1);
    assert_eq!(
        records.all().await.unwrap().1,
        [("a".to_owned(), "1".to_owned())]
    );
    assert_eq!(records.remove("a").await.unwrap(), Some(2));
    assert_eq!(
        records.since(0).await.unwrap(),
        limiter_redis::Since::Changes {
            version: 2,
            changes: vec![
                ("a".to_owned(), Some("1".to_owned())),
                ("a".to_owned(), None)
            ],
        }
    );
    // Permits (sorted sets), under the default prefix and limiterd's.
    for permits in [
        backend.permits("acl", 1, Duration::from_secs(30)).unwrap(),
        backend
            .permits("acl", 1, Duration::from_secs(30))
            .unwrap()
            .with_prefix("limiterd")
            .unwrap(),
    ] {
        let Acquired::Held(permit) = permits.acquire("p").await.unwrap() else {
            panic!("the first permit is free");
        };
        assert!(matches!(
            permits.acquire("p").await.unwrap(),
            Acquired::Busy { held: 1, .. }
        ));
        assert!(permits.renew("p", permit.id()).await.unwrap().is_some());
        assert_eq!(permits.held("p").await.unwrap(), 1);
        assert!(permits.release("p", permit.id()).await.unwrap());
    }
    // A calendar quota, and its refund.
    #[cfg(feature = "calendar")]
    {
        use limiter_calendar::{Calendar, CalendarUnit};
        let quota = backend
            .quota("acl", 2, Calendar::new(CalendarUnit::Month, "UTC").unwrap())
            .unwrap()
            .with_prefix("limiterd")
            .unwrap();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
        let taken = quota.take("q", 2, now).await.unwrap();
        assert!(taken.decision.is_allowed(), "{taken:?}");
        quota.refund("q", 1, taken.window).await.unwrap();
        assert!(quota.take("q", 1, now).await.unwrap().decision.is_allowed());
        assert!(quota.take("q", 1, now).await.unwrap().decision.is_denied());
    }
    assert_eq!(backend.stats().outages, 0, "{:?}", backend.stats());
}

/// The `+` permissions of docs/operations.md's ACL rule for limiterd's user.
fn documented_rule() -> BTreeSet<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/operations.md");
    let doc = std::fs::read_to_string(path).expect("docs/operations.md");
    let start = doc.find("user limiterd on").expect("the ACL rule");
    let end = start + doc[start..].find("```").expect("the rule's block ends");
    doc[start..end]
        .split_whitespace()
        .filter_map(|word| word.strip_prefix('+'))
        .map(str::to_owned)
        .collect()
}

/// Every command this crate's sources send to a data server: what its Lua calls
/// (`redis.call('X'`, `redis.pcall('X'`, the records' `hashed('X'`) and what the client sends (`cmd("X")`,
/// `script_cmd("X"`), with a container command's subcommand (`CLUSTER SLOTS` is
/// `cluster|slots`). Sentinel's own commands go to the sentinels, not to the data server.
fn commands_sent() -> BTreeSet<String> {
    let mut sources = Vec::new();
    let mut dirs = vec![std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/src"
    ))];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs" || e == "lua") {
                sources.push(std::fs::read_to_string(&path).expect("source"));
            }
        }
    }
    let mut sent = BTreeSet::new();
    for text in &sources {
        for opener in [
            "redis.call('",
            "redis.pcall('",
            "redis.call(\"",
            // The records scripts' own wrapper of `redis.pcall`.
            "hashed('",
            "cmd(\"",
            "script_cmd(\"",
        ] {
            for (at, _) in text.match_indices(opener) {
                let rest = &text[at + opener.len()..];
                let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
                let name = name.to_ascii_lowercase();
                if name.is_empty() || name == "sentinel" {
                    continue;
                }
                if name == "cluster" || name == "function" {
                    // The subcommand is the next quoted argument (`.arg("SLOTS")`).
                    let after = &rest[..rest.len().min(200)];
                    if let Some(sub_at) = after.find(".arg(\"") {
                        let sub: String = after[sub_at + 6..]
                            .chars()
                            .take_while(char::is_ascii_alphabetic)
                            .collect();
                        sent.insert(format!("{name}|{}", sub.to_ascii_lowercase()));
                    }
                    continue;
                }
                sent.insert(name);
            }
        }
    }
    sent
}

#[test]
fn every_command_the_backend_sends_is_in_the_documented_acl_rule() {
    let rule = documented_rule();
    let sent = commands_sent();
    // The scan finds what it should: a Lua command, a client command, a subcommand.
    for known in [
        "zadd",
        "hgetall",
        "evalsha",
        "fcall",
        "cluster|slots",
        "time",
    ] {
        assert!(sent.contains(known), "the scan missed `{known}`: {sent:?}");
    }
    let missing: Vec<&String> = sent.iter().filter(|c| !rule.contains(*c)).collect();
    assert!(
        missing.is_empty(),
        "docs/operations.md's ACL rule lacks {missing:?}: a least-privilege user would be refused them"
    );
}

#[test]
fn the_tests_least_privilege_user_is_the_documented_rule() {
    let tested: BTreeSet<String> = LEAST_PRIVILEGE
        .split_whitespace()
        .filter_map(|word| word.strip_prefix('+'))
        .map(str::to_owned)
        .collect();
    assert_eq!(tested, documented_rule());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_is_an_authentication_failure_and_is_never_printed() {
    let server = RedisServer::start_with_users(&[LEAST_PRIVILEGE]);
    let wrong = "not-the-Pa55-word";
    let backend = RedisBackend::builder(with_password(&server.url(), "limiter", wrong))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let health = backend.health().await;
    let Some(down) = &health.down else {
        panic!("not ready with a wrong password: {health:?}");
    };
    assert!(matches!(down, BackendError::Authentication(_)), "{down:?}");
    let text = down.to_string();
    assert!(
        text.contains("authentication failed as user `limiter`"),
        "{text}"
    );
    let d = limiter(&backend, "wrong", 3).check("k").await.unwrap();
    assert!(
        d.failed_closed() && matches!(d.backend_error(), Some(BackendError::Authentication(_))),
        "{d:?}"
    );
    // No surface prints the password: errors, the backend, its health, the decision.
    for shown in [
        text,
        format!("{d:?}"),
        format!("{backend:?}"),
        format!("{health:?}"),
        format!(
            "{:?}",
            RedisBackend::builder(with_password(&server.url(), "limiter", wrong))
        ),
    ] {
        assert!(!shown.contains(wrong), "{shown}");
    }
    // No password where one is needed: named too.
    let server = RedisServer::start_with(vec!["--requirepass".into(), PASSWORD.into()]);
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let down = backend.health().await.down.unwrap().to_string();
    assert!(
        down.contains("asks for a password and none was given"),
        "{down}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_file_is_read_at_each_connection() {
    let server = RedisServer::start_with_users(&[LEAST_PRIVILEGE]);
    let file = server.dir().join("redis-password");
    std::fs::write(&file, "an old password\n").unwrap();
    let backend = RedisBackend::builder(server.url())
        .username("limiter")
        .password_file(&file)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let down = backend.health().await.down;
    assert!(
        matches!(down, Some(BackendError::Authentication(_))),
        "{down:?}"
    );
    // The secret is rotated in place: the next connection reads it.
    std::fs::write(&file, format!("{PASSWORD}\n")).unwrap();
    let health = backend.health().await;
    assert!(health.is_ready(), "{health:?}");
    assert_eq!(
        limiter(&backend, "file", 3)
            .check("k")
            .await
            .unwrap()
            .origin(),
        Some(Origin::Remote)
    );
    // The builder's password wins over the URL's.
    let backend = RedisBackend::builder(with_password(&server.url(), "limiter", "stale"))
        .password(Secret::new(PASSWORD))
        .connect()
        .await
        .unwrap();
    assert!(backend.health().await.is_ready());
}
