//! Probing masters for [`StoreHealth`]: one master's `PING` (one server, Sentinel's master),
//! past its breaker and within a timeout.

use core::time::Duration;

use limiter_core::Clock;
use redis::Value;

use super::Node;
use crate::error::BackendError;
use crate::health::{Deployment, MasterHealth, StoreHealth};

/// One server's (or Sentinel's master's) health: it answers `PING`.
pub(crate) async fn server(node: &Node, timeout: Duration, clock: &dyn Clock) -> StoreHealth {
    let master = probe(node, timeout, redis::cmd("PING"), clock)
        .await
        .map(|(master, _)| master);
    let down = master.as_ref().map_or_else(
        || Some(BackendError::Redis("no master is known".to_owned())),
        |m| m.answer.clone().err(),
    );
    StoreHealth {
        deployment: Deployment::Server,
        masters: master.into_iter().collect(),
        slots_failing: Vec::new(),
        sentinel: None,
        down,
    }
}

/// Sends `cmd` to `node`'s master within `timeout`, past its breaker: the master's health and
/// its reply, or `None` when no master is known.
pub(crate) async fn probe(
    node: &Node,
    timeout: Duration,
    cmd: redis::Cmd,
    clock: &dyn Clock,
) -> Option<(MasterHealth, Option<Value>)> {
    let addr = node.addr()?;
    let started = clock.now();
    let answer = match node.link() {
        Err(e) => Err(e),
        Ok(link) => match tokio::time::timeout(timeout, link.ask(&cmd)).await {
            Err(_) => Err(BackendError::Timeout { after: timeout }),
            Ok(answer) => answer,
        },
    };
    let took = Duration::from_nanos(clock.now().saturating_sub(started));
    let (answer, reply) = match answer {
        Ok(reply) => (Ok(took), Some(reply)),
        Err(e) => (Err(e), None),
    };
    let master = MasterHealth {
        addr: addr.to_string(),
        slots: Vec::new(),
        answer,
        breaker_open: node.breaker.is_open(),
    };
    Some((master, reply))
}
