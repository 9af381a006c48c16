//! Test plumbing: an axum app served on a free loopback port, the testkit's real HTTP/1.1
//! client (a new connection per request), and a Structured Field reader for the headers.
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::{self, any};
use tokio::net::TcpListener;

/// An app whose handlers count the requests that reached them.
pub fn counting_app() -> (Router, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let (a, b) = (Arc::clone(&calls), Arc::clone(&calls));
    let app = Router::new()
        .route(
            "/",
            any(move || async move {
                a.fetch_add(1, Ordering::SeqCst);
                "ok"
            }),
        )
        .route(
            "/other",
            routing::get(move || async move {
                b.fetch_add(1, Ordering::SeqCst);
                "other"
            }),
        );
    (app, calls)
}

/// Serves `app` on a free loopback port with the peer address recorded (as axum apps behind a
/// limiter must be served), and returns the address.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .expect("serve");
    });
    addr
}

/// Serves `app` without recording peer addresses (a set-up mistake the limiter must report).
pub async fn serve_without_connect_info(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local address");
    tokio::spawn(async move {
        axum::serve(listener, app).await.expect("serve");
    });
    addr
}

pub use limiter_testkit::http_client::{Reply, send};

pub async fn get(addr: SocketAddr, headers: &[(&str, &str)]) -> Reply {
    send(addr, "GET", "/", headers).await
}

/// A Structured Field List of Items, each a String with Integer parameters, as
/// `(name, [(parameter, value)])`; panics if the value is anything else.
pub fn items(value: &str) -> Vec<(String, Vec<(String, i64)>)> {
    let list: sfv::List = sfv::Parser::new(value)
        .parse()
        .unwrap_or_else(|e| panic!("{value:?} is not a Structured Field List: {e}"));
    list.into_iter()
        .map(|entry| match entry {
            sfv::ListEntry::Item(item) => {
                let name = item
                    .bare_item
                    .as_string()
                    .unwrap_or_else(|| panic!("{value:?}: a policy name is a String"))
                    .as_str()
                    .to_owned();
                let params = item
                    .params
                    .iter()
                    .map(|(k, v)| {
                        let n = v
                            .as_integer()
                            .unwrap_or_else(|| panic!("{value:?}: parameter {k:?} is an Integer"));
                        (k.as_str().to_owned(), i64::from(n))
                    })
                    .collect();
                (name, params)
            }
            sfv::ListEntry::InnerList(_) => panic!("{value:?} has an inner list"),
        })
        .collect()
}

/// Shorthand for an expected item.
pub fn item(name: &str, params: &[(&str, i64)]) -> (String, Vec<(String, i64)>) {
    (
        name.to_owned(),
        params.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
    )
}
