//! [`RedisBackend`]'s commands on one key beside the limiters' scripts: the records' reads and
//! writes, and the one-key scripts of permits and quotas (timed by Redis `TIME` or a pinned
//! test clock), each within the backend's timeout on the master serving its key, following
//! redirects, and (for writes) waiting for replicas when the backend asks.

use redis::Value;

use super::{RedisBackend, TimeSource};
use crate::error::BackendError;
use crate::keyslot::key_slot;
use crate::script::run;

/// What a timed one-key script ([`RedisBackend::eval_on_key`]) starts with: `now`, in ms, the
/// pinned test clock's reading given first in `ARGV`, else Redis `TIME`.
const SCRIPT_NOW: &str = "local now = tonumber(ARGV[1]) if not now then local t = redis.call('TIME') now = t[1] * 1000 + math.floor(t[2] / 1000) end ";

impl RedisBackend {
    /// Runs `cmd`, whose first key is `key`, within the backend's timeout on the master that
    /// serves it (the records beside the limits use it).
    pub(crate) async fn query(&self, key: &str, cmd: &redis::Cmd) -> Result<Value, BackendError> {
        self.query_on(key, cmd, false).await
    }

    /// Sends `cmd` (which writes) on the master serving `key`, as [`query`](Self::query)
    /// does, then, when the backend waits for replicas
    /// ([`wait_for_replicas`](crate::BackendBuilder::wait_for_replicas)), `WAIT` in the same
    /// round trip: a write fewer replicas acknowledged is [`BackendError::NotReplicated`], as a
    /// stack's decision is, so a failover cannot lose a permit or a quota's units unseen.
    pub(crate) async fn query_writing(
        &self,
        key: &str,
        cmd: &redis::Cmd,
    ) -> Result<Value, BackendError> {
        self.query_on(key, cmd, true).await
    }

    async fn query_on(
        &self,
        key: &str,
        cmd: &redis::Cmd,
        writes: bool,
    ) -> Result<Value, BackendError> {
        let node = self.inner.topology.node_for(Some(key))?;
        let slot = self.is_cluster().then(|| key_slot(key));
        let wait = self.inner.wait.filter(|_| writes);
        self.call_node(node, slot, |link, asking| async move {
            run::send(&link, cmd, asking, wait)
                .await
                .map(|value| (value, false))
        })
        .await
    }

    /// Runs `body`, a script of the one key `key` (permits, quotas), within the backend's
    /// timeout on the master serving it. `timed`: the script reads `now` (ms) as
    /// [`SCRIPT_NOW`] sets it, from the pinned test clock sent first in `ARGV` or from `TIME`.
    pub(crate) async fn eval_on_key(
        &self,
        key: &str,
        body: &str,
        timed: bool,
        args: &[&str],
    ) -> Result<Value, BackendError> {
        self.eval_on_keys(key, &[], body, timed, args).await
    }

    /// [`eval_on_key`](Self::eval_on_key) with `others` after `key` in `KEYS`, on the master
    /// serving `key`: every key must be on it (one server or Sentinel; on a cluster, one slot).
    pub(crate) async fn eval_on_keys(
        &self,
        key: &str,
        others: &[&str],
        body: &str,
        timed: bool,
        args: &[&str],
    ) -> Result<Value, BackendError> {
        let mut cmd = redis::cmd("EVAL");
        if timed {
            cmd.arg(format!("{SCRIPT_NOW}{body}"));
        } else {
            cmd.arg(body);
        }
        cmd.arg(others.len().saturating_add(1)).arg(key).arg(others);
        if timed {
            let now = self
                .pinned_now_ms()
                .map_or_else(String::new, |ms| ms.to_string());
            cmd.arg(now);
        }
        for arg in args {
            cmd.arg(*arg);
        }
        self.query_writing(key, &cmd).await
    }

    /// The test clock's reading in milliseconds since the Unix epoch, for scripts that read
    /// time themselves; `None`: they read Redis `TIME`.
    pub(crate) fn pinned_now_ms(&self) -> Option<u64> {
        match &self.inner.time {
            TimeSource::Server => None,
            TimeSource::Clock(clock) => Some(clock.now() / 1_000_000),
        }
    }
}
