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

/// A response body fed by a channel: open until its sender is dropped.
pub struct Fed(pub tokio::sync::mpsc::Receiver<bytes::Bytes>);

impl http_body::Body for Fed {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|chunk| chunk.map(|c| Ok(http_body::Frame::data(c))))
    }
}

/// The senders of the bodies a test feeds, one per open stream.
pub type Feeds = Arc<std::sync::Mutex<Vec<tokio::sync::mpsc::Sender<bytes::Bytes>>>>;

/// `/stream` answers a body the test feeds (its sender pushed to `feeds`); `/quick` answers
/// at once.
pub fn streaming_routes(feeds: &Feeds) -> Router {
    let pushed = Arc::clone(feeds);
    Router::new()
        .route(
            "/stream",
            routing::get(move || async move {
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                pushed.lock().unwrap().push(tx);
                axum::body::Body::new(Fed(rx))
            }),
        )
        .route("/quick", routing::get(|| async { "ok" }))
}

/// Opens `/stream` for `key` (header `x-api-key`) on a raw connection and reads the response
/// head.
pub async fn open_stream(addr: SocketAddr, key: &str) -> (tokio::net::TcpStream, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET /stream HTTP/1.1\r\nhost: test\r\nx-api-key: {key}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            stream.read(&mut byte).await.unwrap(),
            1,
            "the head ended early"
        );
        head.push(byte[0]);
    }
    (stream, String::from_utf8(head).unwrap())
}

/// Reads `stream`'s chunked body to its end (the last chunk).
pub async fn read_to_end(stream: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut rest = Vec::new();
    while !rest.ends_with(b"0\r\n\r\n") {
        let mut chunk = [0u8; 64];
        let n = stream.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the connection closed before the body ended");
        rest.extend_from_slice(&chunk[..n]);
    }
}
