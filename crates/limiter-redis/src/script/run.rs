//! How one server runs the script: `FCALL` while it has functions (loading the library when it
//! lacks it), `EVALSHA` where functions are refused (sent in full when the server lacks the
//! hash), `ASKING` first when a cluster redirects a migrating slot, and `WAIT` after it when
//! a write must reach replicas before it is answered.

use core::time::Duration;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::Value;

use super::Scripts;
use crate::connect::link::{Failed, Link};
use crate::error::BackendError;

/// Replicas that must acknowledge a call's writes before it is answered, and how long to
/// wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Wait {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// One script call, ready to send.
pub(crate) struct ScriptCall<'a> {
    pub(crate) scripts: &'a Scripts,
    /// Whether the server runs functions (until one says it cannot).
    pub(crate) functions: &'a AtomicBool,
    pub(crate) keys: &'a [String],
    pub(crate) args: &'a [&'a [u8]],
    /// A cluster node's coalesced call: its keys go in `ARGV` (see `decide_node`).
    pub(crate) node_wide: bool,
    pub(crate) wait: Option<Wait>,
}

/// `cmd_name` (`FCALL`, `EVALSHA` or `EVAL`) of `body` (the function, the hash or the
/// script), then the keys and arguments; a node-wide call declares no keys and passes them
/// after the arguments.
fn script_cmd(cmd_name: &str, body: &str, call: &ScriptCall<'_>) -> redis::Cmd {
    let mut cmd = redis::cmd(cmd_name);
    cmd.arg(body);
    if call.node_wide {
        cmd.arg(0);
        for arg in call.args {
            cmd.arg(*arg);
        }
        if call.args.len() < 2 {
            cmd.arg(""); // the holder's place
        }
        cmd.arg(call.keys);
    } else {
        cmd.arg(call.keys.len()).arg(call.keys);
        for arg in call.args {
            cmd.arg(*arg);
        }
    }
    cmd
}

/// Whether `e` says the server has no such function (never loaded, flushed, a new node).
fn function_missing(e: &redis::RedisError) -> bool {
    e.to_string().contains("Function not found")
}

/// Whether `e` says the server cannot run or load functions (before Redis 7, or an ACL that
/// refuses them): the script then runs by `EVALSHA`.
fn functions_unavailable(e: &redis::RedisError) -> bool {
    let text = e.to_string().to_ascii_lowercase();
    [
        "unknown command",
        "unknown subcommand",
        "noperm",
        "no permissions",
    ]
    .iter()
    .any(|says| text.contains(says))
}

/// Sends `cmd` on `link`: after `ASKING` when `asking`, followed by `WAIT` when `wait` asks
/// for replicas; the command's reply, or the error it (or too few replicas) gave.
pub(crate) async fn send(
    link: &Arc<Link>,
    cmd: &redis::Cmd,
    asking: bool,
    wait: Option<Wait>,
) -> Result<Value, Failed> {
    if !asking && wait.is_none() {
        return link.query(cmd).await;
    }
    let mut pipeline = redis::pipe();
    if asking {
        pipeline.cmd("ASKING");
    }
    pipeline.add_command(cmd.clone());
    if let Some(wait) = wait {
        let ms = u64::try_from(wait.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        pipeline.cmd("WAIT").arg(wait.replicas).arg(ms);
    }
    let replies = [asking, true, wait.is_some()]
        .iter()
        .filter(|&&sent| sent)
        .count();
    let mut values = link.pipeline(&pipeline, replies).await?.into_iter();
    if asking {
        values.next();
    }
    let answer = values
        .next()
        .ok_or_else(|| Failed::Backend(BackendError::BadReply("no reply to the script".into())))?
        .extract_error()
        .map_err(Failed::Call)?;
    if let Some(wait) = wait {
        let acked = match values.next() {
            Some(Value::Int(n)) => u32::try_from(n).unwrap_or(0),
            _ => 0,
        };
        if acked < wait.replicas {
            return Err(Failed::Backend(BackendError::NotReplicated {
                acked,
                wanted: wait.replicas,
                within: wait.timeout,
            }));
        }
    }
    Ok(answer)
}

/// Runs `call` on `link` (see the module docs); the flag says whether the script had to be
/// loaded.
pub(crate) async fn run(
    link: &Arc<Link>,
    call: &ScriptCall<'_>,
    asking: bool,
) -> Result<(Value, bool), Failed> {
    let scripts = call.scripts;
    // Relaxed: whether functions work is a hint; each call's outcome corrects it.
    if call.functions.load(Ordering::Relaxed) {
        let name = if call.node_wide {
            &scripts.node_function
        } else {
            &scripts.function
        };
        let fcall = script_cmd("FCALL", name, call);
        match send(link, &fcall, asking, call.wait).await {
            Err(Failed::Call(e)) if function_missing(&e) => {
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg("REPLACE").arg(&scripts.library);
                match link.query(&load).await {
                    Ok(_) => {
                        return send(link, &fcall, asking, call.wait)
                            .await
                            .map(|value| (value, true));
                    }
                    Err(Failed::Call(e)) if functions_unavailable(&e) => {
                        // Relaxed: a hint, as above.
                        call.functions.store(false, Ordering::Relaxed);
                    }
                    Err(e) => return Err(e),
                }
            }
            // Relaxed: a hint shared by calls; a call that reads it late tries FCALL once more.
            Err(Failed::Call(e)) if functions_unavailable(&e) => {
                call.functions.store(false, Ordering::Relaxed);
            }
            answer => return answer.map(|value| (value, false)),
        }
    }
    if call.node_wide {
        // Only a function takes keys of several slots: the caller sends each group alone.
        return Err(Failed::Backend(BackendError::Redis(
            "this server runs no functions, so decisions of several slots cannot share a call"
                .to_owned(),
        )));
    }
    let by_hash = script_cmd("EVALSHA", scripts.eval.get_hash(), call);
    match send(link, &by_hash, asking, call.wait).await {
        Err(Failed::Call(e))
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
        {
            let in_full = script_cmd("EVAL", super::SCRIPT, call);
            send(link, &in_full, asking, call.wait)
                .await
                .map(|value| (value, true))
        }
        answer => answer.map(|value| (value, false)),
    }
}
