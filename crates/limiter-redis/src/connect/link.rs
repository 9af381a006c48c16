//! [`Link`]: the connection to one Redis server: one multiplexed connection shared by every
//! call, opened on first use and opened again after it breaks (TCP, TLS when the settings say
//! so, then the login and a first `PING`), by a task of its own within the connect timeout,
//! while callers wait for it within their own. A port that refuses connections fails the
//! call at once; a server that does not answer fails it at the timeout. Errors
//! name the server and, for a failed login or TLS handshake, say so in those words, never
//! with a password.

use core::fmt;
use core::time::Duration;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, PoisonError};

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisConnectionInfo, Value};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;

use super::secret::Password;
use super::url::NodeAddr;
use crate::error::BackendError;

/// How every link of a backend logs in and encrypts.
#[derive(Clone, Debug, Default)]
pub(crate) struct LinkSettings {
    pub(crate) username: Option<String>,
    pub(crate) password: Option<Password>,
    pub(crate) db: i64,
    #[cfg(feature = "tls")]
    pub(crate) tls: Option<super::tls::TlsSetup>,
    /// The most opening a connection (TCP, TLS, login, a first `PING`) may take.
    pub(crate) connect_timeout: Duration,
}

impl LinkSettings {
    /// Whether links speak TLS.
    pub(crate) fn tls(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.tls.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }
}

/// Why a call on a link failed: it could not connect (already in this crate's terms), or the
/// server answered an error or the connection broke mid-call (raw, so callers can tell a
/// missing function or a redirect; [`Link::explain`] words it).
#[derive(Debug)]
pub(crate) enum Failed {
    Backend(BackendError),
    Call(redis::RedisError),
}

/// One open connection and which opening it was (so a failure drops only that one).
#[derive(Clone)]
struct Open {
    generation: u64,
    connection: MultiplexedConnection,
}

/// Where a link's connection is.
enum State {
    /// None open, none being opened.
    Idle,
    /// Being opened by a task of its own; callers wait for its result.
    Opening(watch::Receiver<Option<Result<Open, BackendError>>>),
    Open(Open),
}

/// The connection to one server (see the module docs).
pub(crate) struct Link {
    addr: NodeAddr,
    settings: Arc<LinkSettings>,
    state: Mutex<State>,
    /// How many connections have been opened (each one's generation).
    opened: std::sync::atomic::AtomicU64,
}

impl fmt::Debug for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Link")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl Link {
    pub(crate) fn new(addr: NodeAddr, settings: Arc<LinkSettings>) -> Self {
        Self {
            addr,
            settings,
            state: Mutex::new(State::Idle),
            opened: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The server's address.
    pub(crate) fn addr(&self) -> &NodeAddr {
        &self.addr
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is valid after any panic: it is replaced whole.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Drops the open connection (the next call opens another): after a call timed out on it
    /// and the node's breaker opened, in case the connection itself is what hangs.
    pub(crate) fn reset(&self) {
        let mut state = self.state();
        if matches!(*state, State::Open(_)) {
            *state = State::Idle;
        }
    }

    /// Sends `cmd`; the caller bounds the wait.
    pub(crate) async fn query(self: &Arc<Self>, cmd: &redis::Cmd) -> Result<Value, Failed> {
        let open = self.connection().await.map_err(Failed::Backend)?;
        let mut connection = open.connection.clone();
        match connection.send_packed_command(cmd).await {
            // A server's error comes back as a value.
            Ok(value) => value.extract_error().map_err(Failed::Call),
            Err(e) => Err(self.failed(open.generation, e)),
        }
    }

    /// Sends `pipeline` and returns each command's reply (a server's error as a value).
    pub(crate) async fn pipeline(
        self: &Arc<Self>,
        pipeline: &redis::Pipeline,
        replies: usize,
    ) -> Result<Vec<Value>, Failed> {
        let open = self.connection().await.map_err(Failed::Backend)?;
        let mut connection = open.connection.clone();
        connection
            .send_packed_commands(pipeline, 0, replies)
            .await
            .map_err(|e| self.failed(open.generation, e))
    }

    /// Sends `cmd` and words any failure in this crate's terms.
    pub(crate) async fn ask(self: &Arc<Self>, cmd: &redis::Cmd) -> Result<Value, BackendError> {
        self.query(cmd).await.map_err(|f| self.explain(f))
    }

    /// A failure in this crate's terms, naming this server.
    pub(crate) fn explain(&self, failed: Failed) -> BackendError {
        match failed {
            Failed::Backend(e) => e,
            Failed::Call(e) => classify(&self.addr, &self.settings, &e),
        }
    }

    /// A call failed with `e`: a broken connection is dropped (the next call opens another).
    fn failed(&self, generation: u64, e: redis::RedisError) -> Failed {
        if e.is_io_error() || e.is_connection_dropped() || e.is_unrecoverable_error() {
            let mut state = self.state();
            if matches!(&*state, State::Open(open) if open.generation == generation) {
                *state = State::Idle;
            }
        }
        Failed::Call(e)
    }

    /// The open connection. Without one, a task opens it (so an opening outlives a caller
    /// that stops waiting, and every caller meanwhile waits for the same one).
    async fn connection(self: &Arc<Self>) -> Result<Open, BackendError> {
        let mut result = {
            let mut state = self.state();
            match &*state {
                State::Open(open) => return Ok(open.clone()),
                State::Opening(result) => result.clone(),
                State::Idle => {
                    let (send, result) = watch::channel(None);
                    let link = Arc::clone(self);
                    let open = async move {
                        let opened = link.connect().await.map(|connection| Open {
                            // Relaxed: an id, compared with its own connection's only.
                            generation: link.opened.fetch_add(1, Ordering::Relaxed),
                            connection,
                        });
                        *link.state() = match &opened {
                            Ok(open) => State::Open(open.clone()),
                            Err(_) => State::Idle,
                        };
                        let _ = send.send(Some(opened));
                    };
                    if crate::task::spawn(open).is_err() {
                        return Err(BackendError::Redis(
                            "no tokio runtime to open a connection on".to_owned(),
                        ));
                    }
                    *state = State::Opening(result.clone());
                    result
                }
            }
        };
        match result.wait_for(Option::is_some).await {
            Ok(opened) => opened
                .clone()
                .unwrap_or_else(|| Err(BackendError::Redis("no connection".to_owned()))),
            Err(_) => Err(BackendError::Redis(
                "the runtime stopped while a connection was opened".to_owned(),
            )),
        }
    }

    /// Opens a connection: TCP, TLS if configured, the login and a first `PING`.
    async fn connect(&self) -> Result<MultiplexedConnection, BackendError> {
        let timeout = self.settings.connect_timeout;
        let addr = &self.addr;
        let tcp =
            match tokio::time::timeout(timeout, TcpStream::connect((addr.host(), addr.port())))
                .await
            {
                Err(_) => return Err(BackendError::Timeout { after: timeout }),
                Ok(Err(e)) => {
                    return Err(BackendError::Redis(format!("cannot reach {addr}: {e}")));
                }
                Ok(Ok(tcp)) => tcp,
            };
        let _ = tcp.set_nodelay(true);
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.settings.tls {
            let stream = match tokio::time::timeout(timeout, super::tls::handshake(tls, addr, tcp))
                .await
            {
                Err(_) => {
                    return Err(BackendError::Tls(format!(
                        "{addr}: no TLS answer within {timeout:?}; is this Redis's tls-port (rediss:// needs it)?"
                    )));
                }
                Ok(stream) => stream?,
            };
            return self.log_in(stream).await;
        }
        self.log_in(tcp).await
    }

    /// Starts the multiplexed connection on `stream`, which logs in (`AUTH`) and selects the
    /// database, then checks it with `PING` (a TLS 1.3 server refuses a client certificate
    /// only after the handshake, so this is where that shows).
    async fn log_in<S>(&self, stream: S) -> Result<MultiplexedConnection, BackendError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let settings = &*self.settings;
        let timeout = settings.connect_timeout;
        let mut info = RedisConnectionInfo::default().set_skip_set_lib_name();
        if let Some(user) = &settings.username {
            info = info.set_username(user);
        }
        if let Some(password) = &settings.password {
            let secret = password
                .read()
                .map_err(|e| BackendError::Authentication(format!("{}: {e}", self.addr)))?;
            info = info.set_password(secret.expose());
        }
        if settings.db != 0 {
            info = info.set_db(settings.db);
        }
        // No timeouts of the client's own (500 ms by default): every call is bounded by the
        // backend's timeout, which may be longer.
        let config = AsyncConnectionConfig::new()
            .set_response_timeout(None)
            .set_connection_timeout(None);
        let started = tokio::time::timeout(
            timeout,
            MultiplexedConnection::new_with_config(&info, stream, config),
        )
        .await;
        let (mut connection, driver) = match started {
            Err(_) => return Err(BackendError::Timeout { after: timeout }),
            Ok(Err(e)) => return Err(classify(&self.addr, settings, &e)),
            Ok(Ok(started)) => started,
        };
        if crate::task::spawn(driver).is_err() {
            return Err(BackendError::Redis(
                "no tokio runtime to drive the connection".to_owned(),
            ));
        }
        match tokio::time::timeout(timeout, connection.send_packed_command(&redis::cmd("PING")))
            .await
        {
            Err(_) => Err(BackendError::Timeout { after: timeout }),
            Ok(Err(e)) => Err(classify(&self.addr, settings, &e)),
            Ok(Ok(value)) => match value.extract_error() {
                Ok(_) => Ok(connection),
                Err(e) => Err(classify(&self.addr, settings, &e)),
            },
        }
    }
}

/// `e` from `addr` in this crate's terms: a refused login is [`BackendError::Authentication`],
/// a refused TLS session [`BackendError::Tls`], the rest [`BackendError::Redis`], each naming
/// the server.
pub(crate) fn classify(
    addr: &NodeAddr,
    settings: &LinkSettings,
    e: &redis::RedisError,
) -> BackendError {
    let user = settings.username.as_deref().unwrap_or("default");
    let code = e.code().unwrap_or("");
    if e.kind() == redis::ErrorKind::AuthenticationFailed || matches!(code, "WRONGPASS" | "NOAUTH")
    {
        let why = if code == "NOAUTH" {
            "Redis asks for a password and none was given"
        } else {
            "Redis refused the user name and password"
        };
        return BackendError::Authentication(format!(
            "{addr}: authentication failed as user `{user}`: {why}; check the user name and password (or the file or variable they come from)"
        ));
    }
    let text = e.to_string();
    if settings.tls() && e.is_io_error() && text.to_ascii_lowercase().contains("alert") {
        return BackendError::Tls(format!(
            "{addr}: the server ended the TLS session ({text}); with mutual TLS, give a client certificate and key signed by a CA the server trusts"
        ));
    }
    if code == "NOPERM" {
        return BackendError::Redis(format!(
            "{addr}: user `{user}` lacks a permission Redis asked for ({text}); see docs/operations.md's ACL rule for the limiter's user"
        ));
    }
    BackendError::Redis(format!("{addr}: {text}"))
}
