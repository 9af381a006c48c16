//! Where a call goes: the one server, the master Sentinel names, or the master serving a
//! Redis Cluster slot. Each master is a [`Node`] with its own link, circuit breaker, deny cache
//! and coalescing queue, so a master that fails costs only the keys it serves: its breaker
//! opens, its standing denials are forgotten, and every other master's calls go on.

pub(crate) mod cluster;
pub(crate) mod probe;
pub(crate) mod sentinel;

use std::sync::{Arc, Mutex, PoisonError, RwLock};

use limiter_core::Clock;

use crate::breaker::{Breaker, BreakerConfig};
use crate::connect::link::Link;
use crate::connect::url::NodeAddr;
use crate::deny_cache::DenyCache;
use crate::error::BackendError;
use crate::health::StoreHealth;
use crate::queue::Coalescer;

/// One master: how to reach it, and what this process keeps about it.
pub(crate) struct Node {
    /// `None` until Sentinel names a master; replaced when it names another.
    link: RwLock<Option<Arc<Link>>>,
    pub(crate) breaker: Breaker,
    pub(crate) deny_cache: DenyCache,
    pub(crate) coalescer: Coalescer,
}

impl Node {
    /// The link to the master, or why there is none yet.
    pub(crate) fn link(&self) -> Result<Arc<Link>, BackendError> {
        // A poisoned lock still holds a whole value: it is replaced in one assignment.
        self.link
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
            .ok_or_else(|| BackendError::Redis("no sentinel has named the master yet".to_owned()))
    }

    /// Where the master is, if known.
    pub(crate) fn addr(&self) -> Option<NodeAddr> {
        self.link
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .map(|link| link.addr().clone())
    }

    /// Points the node at another master (a Sentinel failover): its breaker closes and its
    /// standing denials are forgotten (the new master may not have every write the old one
    /// took).
    pub(crate) fn switch_to(&self, link: Link) {
        *self.link.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(link));
        self.breaker.success();
        self.deny_cache.clear();
    }
}

/// What every node of a backend is built with.
#[derive(Clone, Debug)]
pub(crate) struct NodeMaker {
    pub(crate) breaker: BreakerConfig,
    pub(crate) deny_cache: usize,
    /// The refund epoch every node's deny cache shares.
    pub(crate) refunds: Arc<Mutex<u64>>,
    pub(crate) max_in_flight: usize,
}

impl NodeMaker {
    pub(crate) fn make(&self, link: Option<Link>) -> Node {
        Node {
            link: RwLock::new(link.map(Arc::new)),
            breaker: Breaker::new(self.breaker),
            deny_cache: DenyCache::sharing(self.deny_cache, Arc::clone(&self.refunds)),
            coalescer: Coalescer::new(self.max_in_flight),
        }
    }
}

/// How the backend reaches Redis.
pub(crate) enum Topology {
    Single(Arc<Node>),
    Sentinel(Arc<sentinel::Sentinel>),
    Cluster(Arc<cluster::Cluster>),
}

impl Topology {
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// The node a call on `key` goes to (every key of one call shares its slot, or its node
    /// on a cluster); `None` for a call without keys.
    pub(crate) fn node_for(&self, key: Option<&str>) -> Result<Arc<Node>, BackendError> {
        match self {
            Self::Single(node) => Ok(Arc::clone(node)),
            Self::Sentinel(sentinel) => Ok(sentinel.node()),
            Self::Cluster(cluster) => cluster.node_for_key(key),
        }
    }

    /// A cluster redirected a call on `slot` to `to` (`MOVED` when `moved`, else `ASK`): the
    /// node to try next. `None` on other topologies.
    pub(crate) fn redirected(&self, slot: u16, to: &NodeAddr, moved: bool) -> Option<Arc<Node>> {
        match self {
            Self::Cluster(cluster) => Some(cluster.redirected(slot, to, moved)),
            _ => None,
        }
    }

    /// A call to `node` failed as an outage: look for a new master (Sentinel) or a new slot
    /// map (cluster) soon, without making the caller wait for it.
    pub(crate) fn outage(&self) {
        match self {
            Self::Single(_) => {}
            Self::Sentinel(sentinel) => sentinel.wake(),
            Self::Cluster(cluster) => cluster::Cluster::refresh_soon(cluster),
        }
    }

    /// Every node now (for statistics).
    pub(crate) fn nodes(&self) -> Vec<Arc<Node>> {
        match self {
            Self::Single(node) => vec![Arc::clone(node)],
            Self::Sentinel(sentinel) => vec![sentinel.node()],
            Self::Cluster(cluster) => cluster.masters(),
        }
    }

    /// Probes every master, past the breakers (see [`StoreHealth`]).
    pub(crate) async fn health(
        &self,
        timeout: core::time::Duration,
        clock: &dyn Clock,
    ) -> StoreHealth {
        match self {
            Self::Single(node) => probe::server(node, timeout, clock).await,
            Self::Sentinel(sentinel) => sentinel.health(timeout, clock).await,
            Self::Cluster(cluster) => cluster.health(timeout, clock).await,
        }
    }
}
