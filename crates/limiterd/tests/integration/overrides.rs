//! unkey's overrides on Redis, in one instance: a change it makes holds from then on, whatever
//! its polls of Redis (which pick up other instances' changes) are doing at the time.

/// On Redis, a change is seen by the instance that made it from then on, however its polls of
/// Redis fall: a poll that read the overrides before the change and installed them after it
/// would bring a deleted override back (or lose a set one) until the next poll.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_on_redis_is_never_undone_by_a_poll_in_flight() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
    use std::time::{Duration, Instant};
    let server = limiter_testkit::redis_server::RedisServer::start();
    let backend = limiterd::store::RedisBackend::connect(server.url().as_str())
        .await
        .expect("connects");
    let records = limiterd::store::overrides::records_on(&backend).expect("records");
    let o = Arc::new(limiterd::ops::overrides::Overrides::on_redis(records).await);
    let stop = Arc::new(AtomicBool::new(false));
    // Polls back to back on a thread of their own, where a busy task makes each poll wait
    // about 2 ms for its turn after Redis answers it (as a loaded service's would): every
    // change races a poll read before it and installed after it.
    let polling = std::thread::spawn({
        let (o, stop) = (Arc::clone(&o), Arc::clone(&stop));
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let busy = tokio::spawn({
                    let stop = Arc::clone(&stop);
                    async move {
                        while !stop.load(Relaxed) {
                            let until = Instant::now() + Duration::from_millis(2);
                            while Instant::now() < until {
                                std::hint::spin_loop();
                            }
                            tokio::task::yield_now().await;
                        }
                    }
                });
                while !stop.load(Relaxed) {
                    // A poll fails only once the test is over and its Redis gone.
                    let _ = o.refresh().await;
                }
                busy.await.expect("the busy task");
            })
        }
    });
    // Each change's effect is read again and again for 5 ms after it (past the poll in
    // flight and the next).
    let holds_for_a_while = |want: Option<u64>| {
        let until = Instant::now() + Duration::from_millis(5);
        while Instant::now() < until {
            let seen = o.get("api", "ada").ok().map(|x| x.limit);
            if seen != want {
                return Err(seen);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    };
    let mut undone = Vec::new();
    for round in 1..=60_u64 {
        o.set("api", "ada", (round, 1_000), 10).await.unwrap();
        if let Err(seen) = holds_for_a_while(Some(round)) {
            undone.push(format!("round {round}: set, then read {seen:?}"));
        }
        o.delete("api", "ada").await.unwrap();
        if let Err(seen) = holds_for_a_while(None) {
            undone.push(format!("round {round}: deleted, then read {seen:?}"));
        }
    }
    stop.store(true, Relaxed);
    polling.join().expect("the poller");
    assert!(undone.is_empty(), "changes undone by a poll: {undone:?}");
}

/// On Redis, an instance's own change moves its copy to the records' version after it, so its
/// next poll is one `GET` (nothing changed) rather than every override read again: setting
/// thousands one by one read them all at every one. A change another instance made in
/// between is read by the next poll, whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instances_own_change_is_not_read_back_from_redis() {
    use limiterd::ops::overrides::Overrides;
    let server = limiter_testkit::redis_server::RedisServer::start();
    let backend = limiterd::store::RedisBackend::connect(server.url().as_str())
        .await
        .expect("connects");
    let records = || limiterd::store::overrides::records_on(&backend).expect("records");
    let (ours, theirs) = (
        Overrides::on_redis(records()).await,
        Overrides::on_redis(records()).await,
    );
    ours.set("api", "ada", (1, 1_000), 10).await.unwrap();
    assert_eq!(ours.refresh().await, Ok(false), "its own set");
    ours.set("api", "bob", (2, 1_000), 10).await.unwrap();
    ours.delete("api", "ada").await.unwrap();
    assert_eq!(ours.refresh().await, Ok(false), "its own set and delete");
    // Another instance's change is read, once.
    theirs.set("api", "cy", (3, 1_000), 10).await.unwrap();
    assert_eq!(ours.refresh().await, Ok(true), "another's set");
    assert_eq!(ours.get("api", "cy").map(|o| o.limit), Ok(3));
    assert_eq!(ours.refresh().await, Ok(false));
    // A change after another's that this copy has not read: the version moved by two, so the
    // copy is not taken for Redis's, and the next poll reads the other's change.
    theirs.set("api", "dee", (4, 1_000), 10).await.unwrap();
    ours.delete("api", "bob").await.unwrap();
    assert_eq!(
        ours.refresh().await,
        Ok(true),
        "another's set, before its own delete"
    );
    assert_eq!(ours.get("api", "dee").map(|o| o.limit), Ok(4));
    assert!(ours.get("api", "bob").is_err());
    // A delete of what Redis no longer holds moves nothing.
    theirs.delete("api", "cy").await.unwrap();
    assert!(ours.delete("api", "cy").await.is_err(), "gone already");
    assert_eq!(ours.refresh().await, Ok(true), "the other's delete");
    assert_eq!(ours.refresh().await, Ok(false));
    assert!(ours.get("api", "cy").is_err());
    // Many changes at once (more than are made one at a time): read from the log all the
    // same, patterns and deletes among them, and found by decisions.
    for i in 0..20 {
        theirs
            .set("api", &format!("team-{i}-*"), (i + 10, 1_000), 100)
            .await
            .unwrap();
    }
    theirs.delete("api", "team-3-*").await.unwrap();
    theirs.set("web", "eve", (5, 1_000), 10).await.unwrap();
    assert_eq!(ours.refresh().await, Ok(true));
    assert_eq!(ours.find("api", "team-7-x").map(|o| o.limit), Some(17));
    assert_eq!(ours.find("api", "team-3-x"), None, "deleted");
    assert_eq!(ours.find("web", "eve").map(|o| o.limit), Some(5));
    assert_eq!(ours.find("api", "dee").map(|o| o.limit), Some(4));
    assert_eq!(ours.refresh().await, Ok(false));
}
