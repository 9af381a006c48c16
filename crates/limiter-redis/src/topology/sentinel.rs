//! Redis Sentinel: the master is whichever server the sentinels name for the master's name.
//! It is asked at connect and then every [`WATCH_EVERY`] by a background watch (sooner when a
//! call to the master fails, at most every [`WATCH_GAP`]), each time from the first sentinel
//! that answers. When the answer
//! changes (a failover promoted a replica), the master's node switches to the new address: its
//! breaker closes and its deny cache is forgotten, so calls go back to Redis within one watch
//! round (and a connection) of the promotion. The watch ends with the backend.

use core::time::Duration;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use limiter_core::Clock;
use redis::Value;
use tokio::sync::Notify;

use super::Node;
use crate::connect::link::{Link, LinkSettings};
use crate::connect::url::NodeAddr;
use crate::error::BackendError;
use crate::health::{Deployment, SentinelHealth, StoreHealth};

/// How often the watch asks the sentinels where the master is.
pub(crate) const WATCH_EVERY: Duration = Duration::from_millis(250);

/// The least time between two rounds, however often failing calls wake the watch.
pub(crate) const WATCH_GAP: Duration = Duration::from_millis(50);

/// The sentinels, the master's name, and the master's node (see the module docs).
pub(crate) struct Sentinel {
    master_name: String,
    sentinels: Vec<Arc<Link>>,
    /// How the master is reached (its own login and TLS).
    data: Arc<LinkSettings>,
    node: Arc<Node>,
    timeout: Duration,
    /// Sentinels that answered the watch's last round.
    answering: AtomicUsize,
    /// Shared with the watch, which holds the sentinel only weakly.
    wake: Arc<Notify>,
    last_error: std::sync::Mutex<Option<BackendError>>,
}

impl Sentinel {
    pub(crate) fn new(
        master_name: String,
        sentinels: Vec<Arc<Link>>,
        data: Arc<LinkSettings>,
        node: Node,
        timeout: Duration,
    ) -> Self {
        Self {
            master_name,
            sentinels,
            data,
            node: Arc::new(node),
            timeout,
            answering: AtomicUsize::new(0),
            wake: Arc::new(Notify::new()),
            last_error: std::sync::Mutex::new(None),
        }
    }

    pub(crate) fn node(&self) -> Arc<Node> {
        Arc::clone(&self.node)
    }

    /// Asks the watch to look for the master now.
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    /// Starts the watch (see the module docs); it holds the sentinel weakly and ends when
    /// the backend is dropped.
    pub(crate) fn watch(this: &Arc<Self>) {
        let weak: Weak<Self> = Arc::downgrade(this);
        let wake = Arc::clone(&this.wake);
        let watch = async move {
            loop {
                let Some(sentinel) = weak.upgrade() else {
                    return;
                };
                sentinel.follow().await;
                drop(sentinel);
                crate::task::pause(WATCH_GAP).await;
                tokio::select! {
                    () = crate::task::pause(WATCH_EVERY.saturating_sub(WATCH_GAP)) => {}
                    () = wake.notified() => {}
                }
            }
        };
        // Without a runtime there is no watch; connect runs on one, so this does not happen.
        let _ = crate::task::spawn(watch);
    }

    /// Asks the sentinels for the master and switches to it if it moved.
    pub(crate) async fn follow(&self) {
        match self.ask_all(false).await {
            Ok((addr, _)) => {
                *self
                    .last_error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
                let current = self.node.addr();
                if current.as_ref() != Some(&addr) {
                    match &current {
                        Some(old) => tracing::info!(
                            target: "limiter_redis::sentinel",
                            master = %self.master_name,
                            from = %old,
                            to = %addr,
                            "Sentinel named a new master (a failover): calls go to it now"
                        ),
                        None => tracing::info!(
                            target: "limiter_redis::sentinel",
                            master = %self.master_name,
                            at = %addr,
                            "Sentinel named the master"
                        ),
                    }
                    self.node.switch_to(Link::new(addr, Arc::clone(&self.data)));
                }
            }
            Err(e) => {
                tracing::debug!(target: "limiter_redis::sentinel", error = %e, "no sentinel named the master");
                *self
                    .last_error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
            }
        }
    }

    /// Asks the sentinels in order for the master's address (every one when `all`, to count
    /// those that answer); the first answer, and how many answered.
    async fn ask_all(&self, all: bool) -> Result<(NodeAddr, usize), BackendError> {
        let mut found = None;
        let mut answered = 0_usize;
        let mut last = BackendError::Redis("no sentinel is configured".to_owned());
        for link in &self.sentinels {
            match self.ask(link).await {
                Ok(addr) => {
                    answered = answered.saturating_add(1);
                    found.get_or_insert(addr);
                    if !all {
                        break;
                    }
                }
                Err(e) => last = e,
            }
        }
        if all || found.is_some() {
            // Relaxed: a statistic for health reports.
            self.answering.store(answered, Ordering::Relaxed);
        }
        found.map(|addr| (addr, answered)).ok_or(last)
    }

    /// One sentinel's answer: where the master named `master_name` is.
    async fn ask(&self, link: &Arc<Link>) -> Result<NodeAddr, BackendError> {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg("GET-MASTER-ADDR-BY-NAME").arg(&self.master_name);
        let value = match tokio::time::timeout(self.timeout, link.ask(&cmd)).await {
            Err(_) => {
                return Err(BackendError::Timeout {
                    after: self.timeout,
                });
            }
            Ok(value) => value?,
        };
        let sentinel = link.addr();
        match value {
            Value::Nil => Err(BackendError::Redis(format!(
                "sentinel {sentinel} knows no master named `{}`; check the master's name",
                self.master_name
            ))),
            Value::Array(parts) => match parts.as_slice() {
                [Value::BulkString(host), Value::BulkString(port)] => {
                    let host = String::from_utf8_lossy(host).into_owned();
                    let port = String::from_utf8_lossy(port).parse::<u16>().ok();
                    port.map(|port| NodeAddr::new(host, port)).ok_or_else(|| {
                        BackendError::BadReply(format!("sentinel {sentinel}: a bad port"))
                    })
                }
                _ => Err(BackendError::BadReply(format!(
                    "sentinel {sentinel}: {parts:?}"
                ))),
            },
            other => Err(BackendError::BadReply(format!(
                "sentinel {sentinel}: {other:?}"
            ))),
        }
    }

    /// Asks every sentinel, then the master (`PING`).
    pub(crate) async fn health(&self, timeout: Duration, clock: &dyn Clock) -> StoreHealth {
        let asked = self.ask_all(true).await;
        let mut health = super::probe::server(&self.node, timeout, clock).await;
        health.deployment = Deployment::Sentinel;
        health.sentinel = Some(SentinelHealth {
            master_name: self.master_name.clone(),
            // Relaxed: a statistic.
            answering: self.answering.load(Ordering::Relaxed),
            configured: self.sentinels.len(),
        });
        if let (Err(e), true) = (asked, health.masters.is_empty()) {
            health.down = Some(e);
        }
        health
    }
}
