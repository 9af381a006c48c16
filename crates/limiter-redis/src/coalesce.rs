//! Coalescing: single decisions on one master share script calls.
//!
//! A decision that finds no script call in flight on its master sends its own call at once,
//! so a lone caller pays nothing extra. One that finds a call in flight joins that master's
//! queue; when a call ends, everything queued meanwhile (up to [`MAX_GROUPS`] decisions per
//! call) leaves in one script call, in batch mode 0: each decision is its own group, decided in
//! order, each on the state the ones before it left, at one `TIME`, exactly as if they had been
//! sent one after another. A further call leaves at once only when a full call's worth has
//! queued and fewer than `max_in_flight` calls are out: under load calls fill (16 callers share
//! one call at a time), and past [`MAX_GROUPS`] waiting, up to `max_in_flight` calls carry
//! them. So a queued decision waits at most for a call in flight to end.
//!
//! Every master has its own queue. On a Redis Cluster, one call carries decisions of every
//! slot its master serves, through the library's node-wide function (its keys passed as
//! arguments, flagged `allow-cross-slot-keys`); a decision whose slot has moved away is
//! refused by the script alone ("a non local key") and sent again on its own, following the
//! cluster's redirect.
//!
//! The task that sent a queue yields once after answering it before it lets its slot go, so
//! the callers it answered, back for their next decisions, queue for the next call rather
//! than each take the slot alone.
//!
//! The queued calls are sent by a task of their own, so a caller that stops waiting (its
//! future dropped, or its timeout passed) never strands the others; a caller that stopped
//! waiting before its call left is not sent at all.
#![deny(clippy::arithmetic_side_effects)]

use std::sync::Arc;

use tokio::sync::oneshot;

use crate::backend::RedisBackend;
use crate::error::BackendError;
pub(crate) use crate::queue::Answered;
use crate::queue::{Queued, State};
use crate::script::call::{Call, Mode};
use crate::script::reply;
use crate::topology::Node;

/// The most decisions one coalesced script call carries: more wait for the next, so no call
/// holds Redis for long.
pub(crate) const MAX_GROUPS: usize = 32;

/// Gives back a call slot when the call that took it ends, however it ends (a caller's future
/// may be dropped mid-call): what queued meanwhile leaves then.
struct Slot<'a> {
    backend: &'a RedisBackend,
    node: &'a Arc<Node>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        spawn_next(self.backend, self.node, self.node.coalescer.lock());
    }
}

/// Decides one group (`limits` limits on `keys`), in a call of its own when a slot is free,
/// else with whatever queues beside it on the same master.
pub(crate) async fn decide(
    backend: &RedisBackend,
    keys: &[String],
    group: Call,
    limits: usize,
) -> Answered {
    let node = match backend.node_for(keys) {
        Ok(node) => node,
        Err(e) => return Err(e),
    };
    if node.coalescer.max_in_flight == 0 || !backend.coalesces_on(&node) {
        return send_alone(backend, keys, group, limits).await;
    }
    let answer = match enqueue(backend, &node, keys, group, limits) {
        Ok(answer) => answer,
        Err(group) => {
            let _slot = Slot {
                backend,
                node: &node,
            };
            return send_alone(backend, keys, group, limits).await;
        }
    };
    match tokio::time::timeout(backend.timeout(), answer).await {
        Ok(Ok(answered)) => answered,
        // The sending task ended without answering: only when the runtime shut down.
        Ok(Err(_)) => Err(BackendError::Redis(
            "the runtime stopped before the call was sent".to_owned(),
        )),
        // Waited a whole timeout in the queue and on the wire: the failure policy answers (if
        // it had not left yet, it never will).
        Err(_) => Err(BackendError::Timeout {
            after: backend.timeout(),
        }),
    }
}

/// Takes a free slot for a call of the group's own (`Err`, the group handed back), or queues
/// it and returns where its answer will come.
fn enqueue(
    backend: &RedisBackend,
    node: &Arc<Node>,
    keys: &[String],
    group: Call,
    limits: usize,
) -> Result<oneshot::Receiver<Answered>, Call> {
    let coalescer = &node.coalescer;
    let mut state = coalescer.lock();
    if state.in_flight == 0 && state.queue.is_empty() {
        state.in_flight = 1;
        return Err(group);
    }
    let (reply, answer) = oneshot::channel();
    state.queue.push(Queued {
        keys: keys.to_vec(),
        group,
        limits,
        reply,
    });
    // A full call's worth queued while a slot is free, or nothing in flight to take the
    // queue when it ends: a call of its own for the queue.
    if state.in_flight < coalescer.max_in_flight
        && (state.queue.len() >= MAX_GROUPS || state.in_flight == 0)
    {
        state.in_flight = state.in_flight.saturating_add(1);
        spawn_next(backend, node, state);
    }
    Ok(answer)
}

/// One group in a script call of its own, routed by its keys.
pub(crate) async fn send_alone(
    backend: &RedisBackend,
    keys: &[String],
    group: Call,
    limits: usize,
) -> Answered {
    let value = backend.eval(keys, group).await?;
    let (now, mut groups) = reply::parse(&value, &[limits])?;
    let group = groups
        .pop()
        .ok_or_else(|| BackendError::BadReply("no group".into()))?;
    Ok((now, group))
}

/// With a slot held (`state` locked): sends up to [`MAX_GROUPS`] queued decisions in a task
/// that keeps the slot, or gives the slot back when none is queued.
fn spawn_next(
    backend: &RedisBackend,
    node: &Arc<Node>,
    mut state: std::sync::MutexGuard<'_, State>,
) {
    state.queue.retain(|q| !q.reply.is_closed());
    if state.queue.is_empty() {
        state.in_flight = state.in_flight.saturating_sub(1);
        return;
    }
    let take = state.queue.len().min(MAX_GROUPS);
    let batch: Vec<Queued> = state.queue.drain(..take).collect();
    drop(state);
    let sender = backend.clone();
    let on = Arc::clone(node);
    let send = async move {
        let _slot = Slot {
            backend: &sender,
            node: &on,
        };
        send_batch(&sender, &on, batch).await;
        // The callers just answered come back for their next decisions: let them queue for
        // the call this slot sends next, rather than each take the slot alone.
        tokio::task::yield_now().await;
    };
    if crate::task::spawn(send).is_err() {
        // No runtime to send from (it is shutting down): the unsent call drops the queued
        // replies, so each caller hears the runtime stopped, and the slot is given back.
        spawn_next(backend, node, node.coalescer.lock());
    }
}

/// Sends queued decisions as one script call on `node` (mode 0: independent groups, in
/// order) and answers each; on a cluster, a group whose key has left the node is sent again
/// on its own.
async fn send_batch(backend: &RedisBackend, node: &Arc<Node>, batch: Vec<Queued>) {
    let mut call = Call::new(Mode::Independent);
    let mut keys = Vec::new();
    let mut sizes = Vec::with_capacity(batch.len());
    let mut waiting = Vec::with_capacity(batch.len());
    for queued in batch {
        // Its keys follow those of the groups before.
        call.append(&queued.group, keys.len());
        keys.extend(queued.keys.iter().cloned());
        sizes.push(queued.limits);
        waiting.push(queued);
    }
    call.note_keys(&keys);
    backend.count_coalesced(waiting.len());
    let answered = match backend.eval_coalesced(node, &keys, call).await {
        Ok(value) => reply::parse(&value, &sizes),
        Err(e) => Err(e),
    };
    match answered {
        Ok((now, groups)) => {
            for (queued, group) in waiting.into_iter().zip(groups) {
                match group {
                    Err(reason) if backend.is_cluster() && left_the_node(&reason) => {
                        let again = send_alone(backend, &queued.keys, queued.group, queued.limits);
                        let _ = queued.reply.send(again.await);
                    }
                    group => {
                        let _ = queued.reply.send(Ok((now, group)));
                    }
                }
            }
        }
        Err(e) => {
            for queued in waiting {
                let _ = queued.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Whether a group's refusal says its key is not on the node that ran it (its slot moved,
/// or the node cannot serve it now): sent alone, it follows the cluster's answer.
fn left_the_node(reason: &str) -> bool {
    reason.contains("Script attempted to")
}
