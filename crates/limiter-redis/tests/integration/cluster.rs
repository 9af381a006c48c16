//! A three-master Redis Cluster started by the test: stacks whose keys share a slot work,
//! keyed limiters spread over the masters, independent batches span slots, and all-or-nothing
//! batches work within one hash tag and are refused across slots (stacks across slots:
//! `cluster_spread.rs`).

use limiter_testkit::redis_server as common;

use std::collections::HashSet;

use limiter_core::{Limit, ManualClock};
use limiter_redis::{
    BatchError, Kind, OnFailure, Origin, RedisBackend, RedisLayer, RedisLimiter, RedisStack,
};

const START: u64 = 1_795_000_000_000_000_000;

struct Req {
    tenant: &'static str,
    user: String,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacks_and_limiters_work_on_a_three_master_cluster() {
    let cluster = common::RedisCluster::start();
    let backend = RedisBackend::cluster_builder(cluster.urls())
        .time_from(ManualClock::starting_at(START))
        .timeout(std::time::Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    assert!(backend.is_cluster());

    // A stack tagged by tenant: each call's keys in one slot, tenants spread over the masters.
    let stack = RedisStack::builder(&backend, "cluster-stack")
        .layer(
            RedisLayer::keyed("user", |r: &Req| Some(r.user.clone()))
                .limit(Kind::TokenBucket, Limit::per_hour(3)),
        )
        .layer(
            RedisLayer::keyed("tenant", |r: &Req| Some(r.tenant.to_owned()))
                .limit(Kind::SlidingWindow, Limit::per_hour(5)),
        )
        .hash_tag_from(|r: &Req| r.tenant.to_owned())
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    for tenant in ["acme", "globex", "initech", "umbrella"] {
        let mut admitted = 0;
        for i in 0..8 {
            let req = Req {
                tenant,
                user: format!("u{}", i % 2),
            };
            let d = stack.check(&req).await.unwrap();
            let cached = d.is_denied() && d.origin() == Some(Origin::DenyCache);
            assert!(d.origin() == Some(Origin::Remote) || cached, "{d:?}");
            admitted += u32::from(d.is_allowed());
        }
        // Two users of 3 each, under the tenant's 5: 6 asked for in all, 5 admitted... but each
        // user stops at 3, so the tenant binds on the sixth.
        assert_eq!(admitted, 5, "tenant {tenant}");
    }

    // A keyed limiter tags by key: keys spread over the masters.
    let limiter = RedisLimiter::builder(&backend, "cluster-keys")
        .limit(Kind::FixedWindow, Limit::per_hour(2))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..30).map(|i| format!("key-{i}")).collect();
    let mut calls: Vec<(&str, u64)> = keys.iter().map(|k| (k.as_str(), 1)).collect();
    calls.extend(keys.iter().map(|k| (k.as_str(), 2)));
    let results = limiter.check_many(&calls).await;
    for (i, result) in results.iter().enumerate() {
        let d = result.as_ref().unwrap();
        assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
        // Each key's first call takes 1 of 2, its second asks for 2 and is denied.
        assert_eq!(d.is_allowed(), i < keys.len(), "call {i}: {d:?}");
    }
    let mut masters = HashSet::new();
    for key in &keys {
        let redis_key = limiter.redis_keys(key).remove(0);
        let owner = cluster
            .nodes
            .iter()
            .position(|n| {
                let mut conn = n.client();
                let exists: redis::RedisResult<bool> =
                    redis::cmd("EXISTS").arg(&redis_key).query(&mut conn);
                exists.unwrap_or(false)
            })
            .unwrap_or_else(|| panic!("{redis_key} is on no master"));
        masters.insert(owner);
    }
    assert_eq!(masters.len(), 3, "30 keys should land on all three masters");

    // A batch within one hash tag is one script call, all or nothing.
    let hooli = |user: &str| Req {
        tenant: "hooli",
        user: user.to_owned(),
    };
    let (u0, u1) = (hooli("u0"), hooli("u1"));
    let over = stack.check_all(&[(&u0, 3), (&u1, 3)]).await.unwrap();
    assert!(!over.is_admitted(), "6 is over the tenant's 5: {over:?}");
    let fits = stack.check_all(&[(&u0, 2), (&u1, 3)]).await.unwrap();
    assert!(
        fits.is_admitted(),
        "the refused batch took nothing: {fits:?}"
    );
    assert!(
        fits.decisions()
            .iter()
            .all(|d| d.origin() == Some(Origin::Remote))
    );

    // A batch across slots is refused before anything is sent, naming both slots as the
    // cluster itself computes them.
    let before = limiter.check_n("key-0", 0).await.unwrap();
    let error = limiter
        .check_all(&[("key-0", 1), ("key-1", 1)])
        .await
        .unwrap_err();
    let BatchError::CrossSlot { index, slot, first } = error else {
        panic!("{error}");
    };
    let mut conn = cluster.nodes[0].client();
    let mut keyslot = |key: &str| -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(limiter.redis_keys(key).remove(0))
            .query(&mut conn)
            .unwrap()
    };
    assert_eq!((index, first), (1, keyslot("key-0")));
    assert_eq!(slot, keyslot("key-1"));
    assert!(error.to_string().contains("check_many"), "{error}");
    assert_eq!(limiter.check_n("key-0", 0).await.unwrap(), before);
}
