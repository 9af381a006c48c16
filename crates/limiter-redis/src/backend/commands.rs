//! [`RedisBackend`]'s commands on one key beside the limiters' scripts: the records' reads and
//! writes, and the one-key scripts of permits and quotas (timed by Redis `TIME` or a pinned
//! test clock), each within the backend's timeout on the master serving its key, following
//! redirects, and (for writes) waiting for replicas when the backend asks. A script is sent
//! by its hash, hashed once per process, and in full only to a server that lacks it: `EVAL`
//! of the whole text on every call had Redis hash it each time (a quota's take: 5.58 against
//! 5.32 µs of server CPU, 1.4 KB more on the wire).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use redis::Value;

use super::{RedisBackend, TimeSource};
use crate::connect::link::Failed;
use crate::error::BackendError;
use crate::keyslot::key_slot;
use crate::script::run;

/// What a timed one-key script ([`RedisBackend::eval_on_key`]) starts with: `now`, in ms, the
/// pinned test clock's reading given first in `ARGV`, else Redis `TIME`.
const SCRIPT_NOW: &str = "local now = tonumber(ARGV[1]) if not now then local t = redis.call('TIME') now = t[1] * 1000 + math.floor(t[2] / 1000) end ";

/// The most distinct one-key scripts kept prepared (the crate sends a handful).
const MAX_PREPARED: usize = 64;

/// Every one-key script prepared so far (its text as sent and its hash), by the address and
/// length of its `'static` body (the same address and length are the same text, for the life
/// of the process) and whether it is timed.
type PreparedScripts = HashMap<(usize, usize, bool), Arc<Prepared>>;

/// A one-key script as sent, and its SHA-1 (what `EVALSHA` names it by).
#[derive(Debug)]
struct Prepared {
    text: String,
    hash: String,
}

static PREPARED: Mutex<Option<PreparedScripts>> = Mutex::new(None);

/// `body` as sent (after [`SCRIPT_NOW`] when `timed`) with its SHA-1, hashed once per process.
fn prepared(body: &'static str, timed: bool) -> Arc<Prepared> {
    let text = || {
        let text = if timed {
            format!("{SCRIPT_NOW}{body}")
        } else {
            body.to_owned()
        };
        let hash = redis::Script::new(&text).get_hash().to_owned();
        Arc::new(Prepared { text, hash })
    };
    let id = (body.as_ptr() as usize, body.len(), timed);
    let mut kept = PREPARED.lock().unwrap_or_else(PoisonError::into_inner);
    let kept = kept.get_or_insert_with(HashMap::new);
    if let Some(script) = kept.get(&id) {
        return Arc::clone(script);
    }
    let script = text();
    if kept.len() < MAX_PREPARED {
        kept.insert(id, Arc::clone(&script));
    }
    script
}

impl RedisBackend {
    /// Runs `cmd` (which only reads), whose first key is `key`, within the backend's timeout
    /// on the master that serves it (the records beside the limits use it).
    pub(crate) async fn query(&self, key: &str, cmd: &redis::Cmd) -> Result<Value, BackendError> {
        let node = self.inner.topology.node_for(Some(key))?;
        let slot = self.is_cluster().then(|| key_slot(key));
        self.call_node(node, slot, |link, asking| async move {
            run::send(&link, cmd, asking, None)
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
        body: &'static str,
        timed: bool,
        args: &[&str],
    ) -> Result<Value, BackendError> {
        self.eval_on_keys(key, &[], body, timed, args).await
    }

    /// [`eval_on_key`](Self::eval_on_key) with `others` after `key` in `KEYS`, on the master
    /// serving `key`: every key must be on it (one server or Sentinel; on a cluster, one slot).
    /// Sent by its hash (`EVALSHA`); in full (`EVAL`, which caches it) only where the server
    /// lacks it, as the decision script is. When the backend waits for replicas
    /// ([`wait_for_replicas`](crate::BackendBuilder::wait_for_replicas)), `WAIT` follows in the
    /// same round trip: a write fewer replicas acknowledged is
    /// [`BackendError::NotReplicated`], as a stack's decision is, so a failover cannot lose a
    /// permit or a quota's units unseen.
    pub(crate) async fn eval_on_keys(
        &self,
        key: &str,
        others: &[&str],
        body: &'static str,
        timed: bool,
        args: &[&str],
    ) -> Result<Value, BackendError> {
        self.run_prepared(key, others, prepared(body, timed), timed, args, true)
            .await
    }

    /// [`eval_on_keys`](Self::eval_on_keys) of a script that only reads (untimed): never
    /// waits for replicas.
    pub(crate) async fn read_on_keys(
        &self,
        key: &str,
        others: &[&str],
        body: &'static str,
        args: &[&str],
    ) -> Result<Value, BackendError> {
        self.run_prepared(key, others, prepared(body, false), false, args, false)
            .await
    }

    /// Sends `script` by its hash, in full where the server lacks it; after a write, `WAIT`
    /// when the backend waits for replicas.
    async fn run_prepared(
        &self,
        key: &str,
        others: &[&str],
        script: Arc<Prepared>,
        timed: bool,
        args: &[&str],
        writes: bool,
    ) -> Result<Value, BackendError> {
        let now = timed.then(|| {
            self.pinned_now_ms()
                .map_or_else(String::new, |ms| ms.to_string())
        });
        let command = |name: &str, script_or_hash: &str| {
            let mut cmd = redis::cmd(name);
            cmd.arg(script_or_hash);
            cmd.arg(others.len().saturating_add(1)).arg(key).arg(others);
            if let Some(now) = &now {
                cmd.arg(now);
            }
            for arg in args {
                cmd.arg(*arg);
            }
            cmd
        };
        let by_hash = command("EVALSHA", &script.hash);
        let node = self.inner.topology.node_for(Some(key))?;
        let slot = self.is_cluster().then(|| key_slot(key));
        let wait = self.inner.wait.filter(|_| writes);
        let (by_hash, command, script) = (&by_hash, &command, &script);
        self.call_node(node, slot, |link, asking| async move {
            match run::send(&link, by_hash, asking, wait).await {
                Err(Failed::Call(e))
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
                {
                    // Not the decision library's load (`script_loads`, which loads it on every
                    // master): `EVAL` caches this script on this server for the next call.
                    let in_full = command("EVAL", &script.text);
                    run::send(&link, &in_full, asking, wait)
                        .await
                        .map(|value| (value, false))
                }
                answer => answer.map(|value| (value, false)),
            }
        })
        .await
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
