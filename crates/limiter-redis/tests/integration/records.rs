//! Records (a service's run-time data beside the limits, limiterd's overrides) on a real
//! `redis-server`: every change moves the version, reads are whole, and keys holding what no
//! change wrote are refused by name before anything is written, while a record that is not
//! UTF-8 still reads beside the others.

use limiter_testkit::redis_server as common;

use std::time::Duration;

use limiter_redis::{BackendError, LOGGED_CHANGES, RedisBackend, RedisRecords, Since};
use redis::Commands;

async fn overrides(server: &common::RedisServer) -> RedisRecords {
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    backend
        .records("overrides")
        .unwrap()
        .with_prefix("limiterd")
        .unwrap()
}

#[tokio::test]
async fn records_move_their_version_with_every_change_and_read_whole() {
    let server = common::RedisServer::start();
    let records = overrides(&server).await;
    let backend = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    assert_eq!(records.version().await.unwrap(), 0);
    assert_eq!(records.all().await.unwrap(), (0, Vec::new()));
    assert_eq!(records.put("a", "1").await.unwrap(), 1);
    assert_eq!(records.put("b", "{\"x\": 2}").await.unwrap(), 2);
    assert_eq!(
        records.put("a", "3").await.unwrap(),
        3,
        "a change of a field moves it too"
    );
    let (version, mut fields) = records.all().await.unwrap();
    fields.sort();
    assert_eq!(version, 3);
    assert_eq!(
        fields,
        [("a".into(), "3".into()), ("b".into(), "{\"x\": 2}".into())]
    );
    assert_eq!(
        records.remove("a").await.unwrap(),
        Some(4),
        "the version after"
    );
    assert_eq!(records.remove("a").await.unwrap(), None, "gone already");
    assert_eq!(
        records.version().await.unwrap(),
        4,
        "only a real removal moves it"
    );
    // Another backend on the same server sees the same records; another name does not.
    let other = RedisBackend::builder(server.url())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let same = other.records("overrides").unwrap().with_prefix("limiterd");
    assert_eq!(same.unwrap().all().await.unwrap().1.len(), 1);
    let elsewhere = other.records("overrides").unwrap();
    assert_eq!(elsewhere.version().await.unwrap(), 0, "another prefix");
    assert_eq!(other.records("else").unwrap().version().await.unwrap(), 0);
    for bad in ["", "a{b", "c}"] {
        let refused = backend.records(bad).expect_err("a bad name");
        assert!(refused.to_string().contains("records"), "{refused}");
        let prefix = backend.records("ok").unwrap().with_prefix(bad);
        assert!(prefix.is_err(), "{bad:?} as a prefix");
    }
    // The three keys share a hash tag: one slot on a cluster.
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = connection.keys("limiterd:{records:overrides}:*").unwrap();
    assert_eq!(keys.len(), 3, "{keys:?}");
}

/// A reader behind reads the changes since its version, in order, with their values; one
/// further behind than the log keeps, or past a change no log holds, reads every record.
#[tokio::test]
async fn a_reader_behind_reads_the_changes_since_its_version() {
    let server = common::RedisServer::start();
    let records = overrides(&server).await;
    assert_eq!(records.since(0).await.unwrap(), Since::Unchanged);
    assert_eq!(records.put("a", "1").await.unwrap(), 1);
    assert_eq!(records.put("b:x", "{\"k\": \"v:w\"}").await.unwrap(), 2);
    assert_eq!(records.remove("a").await.unwrap(), Some(3));
    assert_eq!(records.remove("a").await.unwrap(), None, "nothing to log");
    let set = |f: &str, v: &str| (f.to_owned(), Some(v.to_owned()));
    assert_eq!(
        records.since(0).await.unwrap(),
        Since::Changes {
            version: 3,
            changes: vec![
                set("a", "1"),
                set("b:x", "{\"k\": \"v:w\"}"),
                ("a".to_owned(), None)
            ],
        }
    );
    assert_eq!(
        records.since(2).await.unwrap(),
        Since::Changes {
            version: 3,
            changes: vec![("a".to_owned(), None)],
        }
    );
    assert_eq!(records.since(3).await.unwrap(), Since::Unchanged);

    // A change no log holds (a version that did not log, or a hand's `INCR`): whole.
    let mut conn = server.client();
    let _: () = conn
        .incr("limiterd:{records:overrides}:version", 1)
        .unwrap();
    let whole = Since::Whole {
        version: 4,
        fields: vec![("b:x".to_owned(), "{\"k\": \"v:w\"}".to_owned())],
    };
    assert_eq!(records.since(2).await.unwrap(), whole);
    assert_eq!(records.since(3).await.unwrap(), whole);
    // The log keeps the last `LOGGED_CHANGES`; a reader further behind reads whole.
    for i in 0..LOGGED_CHANGES {
        records.put("c", &i.to_string()).await.unwrap();
    }
    let last = 4 + LOGGED_CHANGES;
    let Since::Changes { version, changes } = records.since(last - LOGGED_CHANGES).await.unwrap()
    else {
        panic!("the log holds the last {LOGGED_CHANGES}");
    };
    assert_eq!((version, changes.len() as u64), (last, LOGGED_CHANGES));
    let logged: u64 = conn.zcard("limiterd:{records:overrides}:log").unwrap();
    assert_eq!(logged, LOGGED_CHANGES, "bounded");
    assert!(matches!(
        records.since(last - LOGGED_CHANGES - 1).await.unwrap(),
        Since::Whole { version, .. } if version == last
    ));
}

/// Each way the records' keys can hold what no change wrote, and what every call says.
#[tokio::test]
async fn keys_holding_what_no_change_wrote_are_refused_by_name_and_left_alone() {
    let server = common::RedisServer::start();
    let records = overrides(&server).await;
    let mut conn = server.client();
    let (hash, version) = (
        "limiterd:{records:overrides}:hash",
        "limiterd:{records:overrides}:version",
    );
    // A version that is not a whole number: every call refused, nothing written.
    let _: () = conn.set(version, "not a version").unwrap();
    refused_naming(&records, version, &["version", "all", "put", "remove"]).await;
    let written: bool = conn.exists(hash).unwrap();
    assert!(!written, "a refused put writes no field");
    let kept: String = conn.get(version).unwrap();
    assert_eq!(kept, "not a version");
    // A version of another type.
    let _: () = conn.del(version).unwrap();
    let _: () = conn.rpush(version, "x").unwrap();
    refused_naming(&records, version, &["version", "all", "put", "remove"]).await;
    // The hash of another type (the version, absent, reads as 0).
    let _: () = conn.del(version).unwrap();
    let _: () = conn.set(hash, "not a hash").unwrap();
    refused_naming(&records, hash, &["all", "put", "remove"]).await;
    let moved: Option<String> = conn.get(version).unwrap();
    assert_eq!(moved, None, "a refused put moves no version");
    // The log of another type: refused before anything is written.
    let _: () = conn.del(hash).unwrap();
    let log = "limiterd:{records:overrides}:log";
    let _: () = conn.set(log, "not a log").unwrap();
    refused_naming(&records, log, &["all", "put", "remove"]).await;
    let written: bool = conn.exists(hash).unwrap();
    assert!(!written, "a refused put writes no field");
    let _: () = conn.del(log).unwrap();
    // A record that is not UTF-8 reads (its bad bytes replaced) beside a good one.
    let _: () = conn.del(hash).unwrap();
    assert_eq!(records.put("good", "{}").await.unwrap(), 1);
    let _: () = conn.hset(hash, "bad", vec![0xff_u8, b'x']).unwrap();
    let (_, mut fields) = records.all().await.unwrap();
    fields.sort();
    assert_eq!(
        fields,
        [
            ("bad".into(), "\u{fffd}x".into()),
            ("good".into(), "{}".into())
        ]
    );
}

/// Asserts that each of `records`' calls named in `refused` (`version`, `all`, `put`,
/// `remove`) is refused with an error naming `key` and the fix.
async fn refused_naming(records: &RedisRecords, key: &str, refused: &[&str]) {
    for &call in refused {
        let result = match call {
            "version" => records.version().await.map(|v| v.to_string()),
            "all" => records.all().await.map(|a| format!("{a:?}")),
            "put" => records.put("a", "1").await.map(|v| v.to_string()),
            _ => records.remove("a").await.map(|r| format!("{r:?}")),
        };
        let message: String = result.map_or_else(
            |e: BackendError| e.to_string(),
            |ok| panic!("{call} on {key}: not refused, answered {ok}"),
        );
        assert!(message.contains(key), "{call}: {message}");
        assert!(message.contains("delete it"), "{call}: {message}");
    }
}
