//! Records (a service's run-time data beside the limits, limiterd's overrides) on a real
//! `redis-server`: every change moves the version, reads are whole, and keys holding what no
//! change wrote are refused by name before anything is written, while a record that is not
//! UTF-8 still reads beside the others.

use limiter_testkit::redis_server as common;

use std::time::Duration;

use limiter_redis::{BackendError, RedisBackend, RedisRecords};
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
    // Both keys share a hash tag: one slot on a cluster.
    let mut connection = redis::Client::open(server.url())
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = connection.keys("limiterd:{records:overrides}:*").unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
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
