//! A real HTTP/1.1 client for the tests (feature `http-client`): hyper over a loopback TCP
//! connection, no mocks. [`Client`] keeps one connection alive across requests (limiterd's
//! tests); [`send`] opens a new one per request, so every request meets a fresh clone of a
//! tower service (the middleware's tests).

use std::net::SocketAddr;

use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// A response as the client saw it.
#[derive(Debug)]
pub struct Reply {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The body, as UTF-8.
    pub body: String,
}

impl Reply {
    /// The header `name`'s value, which must be ASCII.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header"))
    }
}

/// The longest a request waits for its whole answer: every server under test answers in
/// milliseconds, so past this it is not going to.
const ANSWER_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// One HTTP/1.1 connection, kept alive across requests.
#[derive(Debug)]
pub struct Client {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: String,
}

impl Client {
    /// Connects to `addr` and completes the HTTP/1.1 handshake.
    pub async fn connect(addr: SocketAddr) -> Self {
        let stream = TcpStream::connect(addr).await.expect("connect");
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .expect("HTTP/1.1 handshake");
        tokio::spawn(connection);
        Self {
            sender,
            host: addr.to_string(),
        }
    }

    /// Sends `method path` with `headers` and `body`, and reads the whole response.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &str,
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.host);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::from(body.to_owned())))
            .expect("request");
        let exchange = async {
            self.sender
                .ready()
                .await
                .expect("the connection is open for another request");
            let response = self.sender.send_request(request).await.expect("response");
            let status = response.status();
            let headers = response.headers().clone();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            Reply {
                status,
                headers,
                body: String::from_utf8(body.to_vec()).expect("UTF-8 body"),
            }
        };
        // A server that never answers fails the test, naming the request, where it would
        // otherwise hang the whole suite.
        tokio::time::timeout(ANSWER_WITHIN, exchange)
            .await
            .unwrap_or_else(|_| panic!("no answer to {method} {path} within {ANSWER_WITHIN:?}"))
    }
}

/// Sends `method path` with `headers` and no body to `addr` over a new connection.
pub async fn send(addr: SocketAddr, method: &str, path: &str, headers: &[(&str, &str)]) -> Reply {
    Client::connect(addr)
        .await
        .request(method, path, headers, "")
        .await
}
