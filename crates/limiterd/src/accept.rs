//! Taking connections without spinning (feature `server`): an accept that fails (out of file
//! descriptors, say) is tried again after a pause, once connections had time to close, and
//! said at most once every ten seconds with the number not said since. Both servers take
//! their connections here: the HTTP loop one at a time, tonic's as a stream (tonic's own loop
//! retries at once and logs at trace level: a core spun and nothing said).

use std::time::Duration;

use futures_util::Stream;
use limiter_core::Paced;
use tokio::net::{TcpListener, TcpStream};

/// How long a failed accept waits before the next.
const PAUSE: Duration = Duration::from_millis(50);

/// A listener whose failed accepts are paused and reported, not spun on.
pub(crate) struct Acceptor {
    listener: TcpListener,
    /// Which server: the log line's `server` field.
    server: &'static str,
    refusals: Paced,
}

impl Acceptor {
    /// Connections of the server named `server` (`http`, `grpc`) on `listener`.
    pub(crate) fn new(listener: TcpListener, server: &'static str) -> Self {
        Self {
            listener,
            server,
            refusals: Paced::new(Duration::from_secs(10)),
        }
    }

    /// The next connection, `TCP_NODELAY` set (an answer is one small write).
    pub(crate) async fn next(&self) -> TcpStream {
        loop {
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    return stream;
                }
                Err(error) => {
                    if let Some(unlogged) = self.refusals.due() {
                        tracing::warn!(
                            server = self.server,
                            %error,
                            unlogged,
                            "cannot accept a connection; trying again every 50 ms (one such line every 10 s)"
                        );
                    }
                    tokio::time::sleep(PAUSE).await;
                }
            }
        }
    }

    /// Every connection, as a stream that never fails or ends (for tonic's server, which
    /// stops taking them at its shutdown signal).
    pub(crate) fn into_stream(self) -> impl Stream<Item = std::io::Result<TcpStream>> {
        futures_util::stream::unfold(self, |acceptor| async move {
            let stream = acceptor.next().await;
            Some((Ok(stream), acceptor))
        })
    }
}
