//! TLS to a real `redis-server` with a TLS port, on certificates the test generates: a CA
//! file, mutual TLS, the name a certificate is checked against, and every way it can be
//! wrong (an untrusted CA, a name the certificate does not hold, no client certificate where
//! one is needed, a plaintext port) refused with an error that says so, never a fallback to
//! plaintext. A cluster over TLS spreads and decides like a plaintext one, and Sentinel over
//! TLS (the sentinels and the master) names the master and follows a failover.
#![cfg(feature = "tls")]

use limiter_testkit::redis_server::tls::TestCerts;
use limiter_testkit::redis_server::{
    ClusterOptions, MASTER_NAME, RedisCluster, RedisServer, SentinelOptions, SentinelSet,
};

use std::time::Duration;

use limiter_core::Limit;
use limiter_redis::{
    BackendError, Kind, OnFailure, Origin, RedisBackend, RedisLimiter, Secret, TlsOptions,
};

// A bucket of a day, not a window of an hour: on Redis's own clock, a test run across a
// window's boundary would get the count again; no unit comes back within a test's minutes.
fn limiter(backend: &RedisBackend) -> RedisLimiter {
    RedisLimiter::builder(backend, "tls")
        .limit(Kind::TokenBucket, Limit::per_day(3))
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap()
}

async fn connect(url: String, tls: TlsOptions) -> RedisBackend {
    RedisBackend::builder(url)
        .tls(tls)
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .expect("settings that can be used")
}

/// Three admissions then a denial of `key`, all decided on Redis.
async fn decides_exactly(backend: &RedisBackend, key: &str) {
    let limiter = limiter(backend);
    for left in [2, 1, 0] {
        let d = limiter.check(key).await.unwrap();
        assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
        assert_eq!(d.decision().unwrap().remaining(), left);
    }
    assert!(limiter.check(key).await.unwrap().is_denied());
}

/// The failure a misconfigured backend reports, through `health` and a decision alike.
async fn refused(backend: &RedisBackend) -> BackendError {
    let health = backend.health().await;
    assert!(!health.is_ready(), "{health:?}");
    let d = limiter(backend).check("k").await.unwrap();
    let (true, Some(from_call)) = (d.failed_closed(), d.backend_error()) else {
        panic!("a refused session is an outage the policy answers: {d:?}");
    };
    // A handshake no server answers ends in the call's timeout or the connection's, whichever
    // comes first: the two reports may differ only then.
    let timed_out = |e: &BackendError| {
        matches!(e, BackendError::Timeout { .. }) || e.to_string().contains("no TLS answer within")
    };
    let down = health.down.as_ref().expect("not ready");
    if !timed_out(from_call) || !timed_out(down) {
        assert_eq!(from_call, down, "{health:?}");
    }
    from_call.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ca_file_and_mutual_tls_decide_on_redis() {
    let certs = TestCerts::fresh("mutual");
    let server = RedisServer::start_tls(&certs, true, Vec::new());
    let tls = TlsOptions::new()
        .ca_file(&certs.ca)
        .unwrap()
        .client_identity_files(&certs.client_cert, &certs.client_key)
        .unwrap();
    let backend = connect(server.tls_url("localhost"), tls.clone()).await;
    decides_exactly(&backend, "by-name").await;
    assert!(backend.health().await.is_ready());
    // Checked against an IP address the certificate holds.
    decides_exactly(
        &connect(server.tls_url("127.0.0.1"), tls).await,
        "by-address",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checked_name_can_differ_from_the_host() {
    let certs = TestCerts::fresh("name");
    let server = RedisServer::start_tls(&certs, false, Vec::new());
    let ca = TlsOptions::new().ca_file(&certs.ca).unwrap();
    // Reached by address, checked against a name the certificate holds.
    let by_name = connect(
        server.tls_url("127.0.0.1"),
        ca.clone().server_name("redis.test"),
    )
    .await;
    decides_exactly(&by_name, "k").await;
    // Checked against a name it does not hold: refused, naming the name.
    let wrong = connect(server.tls_url("127.0.0.1"), ca.server_name("cache.example")).await;
    let e = refused(&wrong).await;
    assert!(matches!(e, BackendError::Tls(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("not valid for the name `cache.example`"),
        "{text}"
    );
}

/// Certificates renewed in place (a Kubernetes secret cert-manager rotates, say) apply at the
/// next connection, with no restart: a CA file and a client certificate and key, each wrong at
/// first, then overwritten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_tls_files_apply_at_the_next_connection() {
    let certs = TestCerts::fresh("rotated");
    let stranger = TestCerts::fresh("rotated-stranger");
    let server = RedisServer::start_tls(&certs, true, Vec::new());
    let dir = std::env::temp_dir().join(format!("limiter-tls-rotated-{}", server.port));
    std::fs::create_dir_all(&dir).unwrap();
    let (ca, cert, key) = (
        dir.join("ca.pem"),
        dir.join("client.pem"),
        dir.join("client.key"),
    );
    let put = |from: &std::path::Path, to: &std::path::Path| {
        std::fs::copy(from, to).unwrap();
    };
    // A CA that signed nothing here, and a client certificate of another CA.
    put(&certs.other_ca, &ca);
    put(&stranger.client_cert, &cert);
    put(&stranger.client_key, &key);
    let tls = TlsOptions::new()
        .ca_file(&ca)
        .unwrap()
        .client_identity_files(&cert, &key)
        .unwrap();
    let backend = connect(server.tls_url("localhost"), tls).await;
    let e = refused(&backend).await;
    assert!(
        e.to_string()
            .contains("not signed by a CA this client trusts"),
        "{e}"
    );

    // The CA renewed: the next connection trusts the server, whose turn it is to refuse the
    // client's certificate.
    put(&certs.ca, &ca);
    let e = refused(&backend).await;
    assert!(e.to_string().contains("client certificate"), "{e}");

    // The client's certificate and key renewed: decided on Redis, the same backend.
    put(&certs.client_cert, &cert);
    put(&certs.client_key, &key);
    decides_exactly(&backend, "rotated").await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wrong_setting_is_refused_by_name_and_never_falls_back_to_plaintext() {
    let certs = TestCerts::fresh("wrong");
    let server = RedisServer::start_tls(&certs, true, Vec::new());
    let ca = || TlsOptions::new().ca_file(&certs.ca).unwrap();
    let client = |tls: TlsOptions| {
        tls.client_identity_files(&certs.client_cert, &certs.client_key)
            .unwrap()
    };

    // A CA that did not sign the server's certificate.
    let other = TlsOptions::new().ca_file(&certs.other_ca).unwrap();
    let e = refused(&connect(server.tls_url("localhost"), client(other)).await).await;
    assert!(matches!(e, BackendError::Tls(_)), "{e:?}");
    assert!(
        e.to_string()
            .contains("not signed by a CA this client trusts"),
        "{e}"
    );

    // No client certificate where the server asks for one.
    let e = refused(&connect(server.tls_url("localhost"), ca()).await).await;
    assert!(matches!(e, BackendError::Tls(_)), "{e:?}");
    assert!(e.to_string().contains("client certificate"), "{e}");

    // TLS to the plaintext port: no session (a plaintext server never answers the TLS
    // hello, so the call times out), and no plaintext either.
    let plain_port = format!("rediss://localhost:{}", server.port);
    let e = refused(&connect(plain_port, client(ca())).await).await;
    assert!(
        matches!(e, BackendError::Tls(_) | BackendError::Timeout { .. }),
        "{e:?}"
    );

    // Plaintext to the TLS port fails too: the two never mix.
    let to_tls = format!("redis://127.0.0.1:{}", server.tls_port.unwrap());
    let backend = RedisBackend::builder(to_tls)
        .timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    assert!(!backend.health().await.is_ready());

    // Settings that can never work are refused at connect, naming the setting.
    let redis_url = RedisBackend::builder(server.url())
        .tls(ca())
        .connect()
        .await;
    let e = redis_url.unwrap_err().to_string();
    assert!(e.contains("write rediss://"), "{e}");
    let garbage =
        TlsOptions::new().client_identity(b"not a certificate".to_vec(), Secret::new("nor a key"));
    let e = RedisBackend::builder(server.tls_url("localhost"))
        .tls(garbage)
        .connect()
        .await
        .unwrap_err();
    assert!(matches!(e, BackendError::Tls(_)), "{e:?}");
    assert!(e.to_string().contains("certificate file"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_spreads_and_decides() {
    let certs = TestCerts::fresh("cluster");
    let cluster = RedisCluster::start_with(&ClusterOptions {
        tls: Some(certs.clone()),
        ..ClusterOptions::default()
    });
    // Nodes the cluster names by address are checked against a name their certificate holds.
    let backend = RedisBackend::cluster_builder(cluster.urls())
        .tls(TlsOptions::new().ca_file(&certs.ca).unwrap())
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .unwrap();
    let health = backend.health().await;
    assert!(health.is_ready(), "{health:?}");
    assert_eq!(health.masters_answering(), 3, "{health:?}");
    let limiter = limiter(&backend);
    let mut masters = [0_u32; 3];
    for i in 0..60 {
        let id = format!("id-{i}");
        let d = limiter.check(&id).await.unwrap();
        assert_eq!(d.origin(), Some(Origin::Remote), "{d:?}");
        masters[cluster.master_of(&limiter.redis_keys(&id)[0])] += 1;
    }
    assert!(masters.iter().all(|&n| n > 0), "{masters:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_names_the_master_and_follows_a_failover() {
    let certs = TestCerts::fresh("sentinel");
    let mut set = SentinelSet::start_with(&SentinelOptions {
        replicas: 1,
        tls: Some(certs.clone()),
        ..SentinelOptions::default()
    });
    assert!(
        set.sentinel_urls()
            .iter()
            .all(|u| u.starts_with("rediss://"))
    );
    // One CA for the sentinels and the masters they name.
    let backend = RedisBackend::sentinel_builder(MASTER_NAME, set.sentinel_urls())
        .tls(TlsOptions::new().ca_file(&certs.ca).unwrap())
        .timeout(Duration::from_millis(500))
        .connect()
        .await
        .unwrap();
    let health = backend.health().await;
    assert!(health.is_ready(), "{health:?}");
    decides_exactly(&backend, "before").await;
    set.wait_for_replication();
    set.fail_over();
    let started = std::time::Instant::now();
    let limiter = limiter(&backend);
    loop {
        let d = limiter.check("before").await.unwrap();
        if d.origin() == Some(Origin::Remote) {
            assert!(d.is_denied(), "spent before the failover: {d:?}");
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(10), "{d:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
