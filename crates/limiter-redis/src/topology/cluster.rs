//! A Redis Cluster: which master serves each of the 16384 slots (learned from `CLUSTER
//! SLOTS`), one [`Node`] per master, and keeping that map true. The map is learned at
//! connect, and learned again (in the background, at most every [`REFRESH_GAP`]) when a call
//! meets a redirect or a failing master, and at each health probe; a `MOVED` reply updates
//! its slot at once. A master that dies fails only its own slots' calls (a refused connection
//! at once); when its replica is promoted, the next map sends those slots to the new master.
#![deny(clippy::arithmetic_side_effects)]

use core::time::Duration;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use limiter_core::Clock;
use redis::Value;

use super::{Node, NodeMaker};
use crate::connect::link::{Link, LinkSettings};
use crate::connect::url::NodeAddr;
use crate::error::BackendError;
use crate::health::{Deployment, MasterHealth, StoreHealth};
use crate::keyslot::key_slot;

/// Slots in a Redis Cluster.
pub(crate) const SLOTS: usize = 16_384;

/// The least time between two background map refreshes.
pub(crate) const REFRESH_GAP: Duration = Duration::from_millis(100);

/// A slot no master serves (in the map's `owner`).
const NONE: u16 = u16::MAX;

/// Which master serves each slot.
struct SlotMap {
    /// Per slot, an index into `masters`, or [`NONE`].
    owner: Box<[u16]>,
    masters: Vec<Arc<Node>>,
}

impl SlotMap {
    fn empty() -> Self {
        Self {
            owner: vec![NONE; SLOTS].into_boxed_slice(),
            masters: Vec::new(),
        }
    }

    fn node(&self, slot: u16) -> Option<&Arc<Node>> {
        let index = *self.owner.get(usize::from(slot))?;
        self.masters.get(usize::from(index))
    }

    /// Each master's slots as ranges, in slot order, and the slots no master serves.
    fn ranges(
        &self,
    ) -> (
        Vec<Vec<core::ops::RangeInclusive<u16>>>,
        Vec<core::ops::RangeInclusive<u16>>,
    ) {
        let mut per_master = vec![Vec::new(); self.masters.len()];
        let mut unserved = Vec::new();
        let mut start = 0_u16;
        for slot in 0..SLOTS {
            let slot = u16::try_from(slot).unwrap_or(u16::MAX);
            let owner = self.owner[usize::from(slot)];
            let next = usize::from(slot).saturating_add(1);
            if next < SLOTS && self.owner[next] == owner {
                continue;
            }
            let range = start..=slot;
            match per_master.get_mut(usize::from(owner)) {
                Some(ranges) => ranges.push(range),
                None => unserved.push(range),
            }
            start = slot.saturating_add(1);
        }
        (per_master, unserved)
    }
}

/// A cluster's masters and slot map (see the module docs).
pub(crate) struct Cluster {
    seeds: Vec<NodeAddr>,
    settings: Arc<LinkSettings>,
    maker: NodeMaker,
    clock: Arc<dyn Clock>,
    timeout: Duration,
    /// Every node ever learned, by address: a master keeps its breaker and deny cache across
    /// refreshes.
    nodes: Mutex<HashMap<NodeAddr, Arc<Node>>>,
    map: RwLock<Arc<SlotMap>>,
    /// A background refresh is running (a hint that keeps them from piling up).
    refreshing: AtomicBool,
    /// The local clock's reading at the last refresh's start.
    last_refresh: Mutex<Option<u64>>,
    /// Why the last refresh failed, if it did.
    last_error: Mutex<Option<BackendError>>,
}

impl Cluster {
    pub(crate) fn new(
        seeds: Vec<NodeAddr>,
        settings: Arc<LinkSettings>,
        maker: NodeMaker,
        clock: Arc<dyn Clock>,
        timeout: Duration,
    ) -> Self {
        Self {
            seeds,
            settings,
            maker,
            clock,
            timeout,
            nodes: Mutex::new(HashMap::new()),
            map: RwLock::new(Arc::new(SlotMap::empty())),
            refreshing: AtomicBool::new(false),
            last_refresh: Mutex::new(None),
            last_error: Mutex::new(None),
        }
    }

    fn map(&self) -> Arc<SlotMap> {
        // A poisoned lock still holds a whole map: it is replaced in one assignment.
        Arc::clone(&self.map.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// The node at `addr`, made on first sight.
    fn node_at(&self, addr: &NodeAddr) -> Arc<Node> {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(nodes.entry(addr.clone()).or_insert_with(|| {
            let link = Link::new(addr.clone(), Arc::clone(&self.settings));
            Arc::new(self.maker.make(Some(link)))
        }))
    }

    /// The master serving `key`'s slot.
    pub(crate) fn node_for_key(
        self: &Arc<Self>,
        key: Option<&str>,
    ) -> Result<Arc<Node>, BackendError> {
        let slot = key.map_or(0, key_slot);
        match self.map().node(slot) {
            Some(node) => Ok(Arc::clone(node)),
            None => {
                Self::refresh_soon(self);
                let why = self
                    .last_error
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map_or_else(String::new, |e| format!(" ({e})"));
                Err(BackendError::Redis(format!(
                    "no master of the cluster is known to serve slot {slot} yet{why}"
                )))
            }
        }
    }

    /// The masters of the current map.
    pub(crate) fn masters(&self) -> Vec<Arc<Node>> {
        self.map().masters.clone()
    }

    /// A call on `slot` was redirected to `to`: `MOVED` updates the slot's master at once
    /// (and the whole map soon); `ASK` is for this one call.
    pub(crate) fn redirected(self: &Arc<Self>, slot: u16, to: &NodeAddr, moved: bool) -> Arc<Node> {
        let node = self.node_at(to);
        if moved {
            let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
            let mut next = SlotMap {
                owner: map.owner.clone(),
                masters: map.masters.clone(),
            };
            let index = match next.masters.iter().position(|m| Arc::ptr_eq(m, &node)) {
                Some(index) => index,
                None => {
                    next.masters.push(Arc::clone(&node));
                    next.masters.len().saturating_sub(1)
                }
            };
            if let (Some(owner), Ok(index)) =
                (next.owner.get_mut(usize::from(slot)), u16::try_from(index))
            {
                *owner = index;
            }
            *map = Arc::new(next);
            drop(map);
            Self::refresh_soon(self);
        }
        node
    }

    /// Learns the map again in the background, unless a refresh is running or one started
    /// less than [`REFRESH_GAP`] ago.
    pub(crate) fn refresh_soon(this: &Arc<Self>) {
        let now = this.clock.now();
        {
            let last = this
                .last_refresh
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let gap = u64::try_from(REFRESH_GAP.as_nanos()).unwrap_or(u64::MAX);
            if last.is_some_and(|at| now.saturating_sub(at) < gap) {
                return;
            }
        }
        // Relaxed: a hint that keeps refreshes from piling up; the map is swapped under its lock.
        if this.refreshing.swap(true, Ordering::Relaxed) {
            return;
        }
        let cluster = Arc::clone(this);
        let refresh = async move {
            let _ = cluster.refresh().await;
            // Relaxed: the hint above.
            cluster.refreshing.store(false, Ordering::Relaxed);
        };
        if crate::task::spawn(refresh).is_err() {
            // Relaxed: the hint above (no runtime: the next call tries again).
            this.refreshing.store(false, Ordering::Relaxed);
        }
    }

    /// Learns the map from the first node that answers `CLUSTER SLOTS`: the current masters
    /// first, then the seeds.
    pub(crate) async fn refresh(&self) -> Result<(), BackendError> {
        *self
            .last_refresh
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(self.clock.now());
        let mut candidates: Vec<NodeAddr> = self
            .map()
            .masters
            .iter()
            .filter(|m| !m.breaker.is_open())
            .filter_map(|m| m.addr())
            .collect();
        for seed in &self.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        let mut last = BackendError::Redis("the cluster has no seed nodes".to_owned());
        for addr in candidates {
            let node = self.node_at(&addr);
            let answer = match node.link() {
                Ok(link) => {
                    let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
                    match tokio::time::timeout(self.timeout, link.ask(&slots)).await {
                        Err(_) => Err(BackendError::Timeout {
                            after: self.timeout,
                        }),
                        Ok(answer) => answer,
                    }
                }
                Err(e) => Err(e),
            };
            match answer.and_then(|value| self.read_slots(&addr, &value)) {
                Ok(map) => {
                    *self.map.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(map);
                    *self
                        .last_error
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner) = None;
                    return Ok(());
                }
                Err(e) => last = e,
            }
        }
        *self
            .last_error
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(last.clone());
        Err(last)
    }

    /// Reads a `CLUSTER SLOTS` reply from `asked` into a map.
    fn read_slots(&self, asked: &NodeAddr, value: &Value) -> Result<SlotMap, BackendError> {
        let bad = || BackendError::BadReply(format!("CLUSTER SLOTS from {asked}: {value:?}"));
        let Value::Array(entries) = value else {
            return Err(bad());
        };
        let mut map = SlotMap::empty();
        for entry in entries {
            let Value::Array(parts) = entry else {
                return Err(bad());
            };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                return Err(bad());
            };
            let host = match master.first() {
                Some(Value::BulkString(bytes)) if !bytes.is_empty() && bytes != b"?" => {
                    String::from_utf8_lossy(bytes).into_owned()
                }
                // No endpoint named: the node asked, at the port given.
                _ => asked.host().to_owned(),
            };
            let Some(Value::Int(port)) = master.get(1) else {
                return Err(bad());
            };
            let port = u16::try_from(*port).map_err(|_| bad())?;
            let node = self.node_at(&NodeAddr::new(host, port));
            let index = match map.masters.iter().position(|m| Arc::ptr_eq(m, &node)) {
                Some(index) => index,
                None => {
                    map.masters.push(node);
                    map.masters.len().saturating_sub(1)
                }
            };
            let index = u16::try_from(index).map_err(|_| bad())?;
            let (start, end) = (usize::try_from(*start), usize::try_from(*end));
            let (Ok(start), Ok(end)) = (start, end) else {
                return Err(bad());
            };
            if start > end || end >= SLOTS {
                return Err(bad());
            }
            for owner in &mut map.owner[start..=end] {
                *owner = index;
            }
        }
        Ok(map)
    }

    /// Learns the map, then asks every master for `CLUSTER INFO` (see [`StoreHealth`]).
    pub(crate) async fn health(&self, timeout: Duration, clock: &dyn Clock) -> StoreHealth {
        let refreshed = self.refresh().await;
        let map = self.map();
        let (ranges, unserved) = map.ranges();
        let info = redis::cmd("CLUSTER").arg("INFO").to_owned();
        let probes = map
            .masters
            .iter()
            .map(|node| cluster_state(node, timeout, info.clone(), clock));
        let probed = futures_util::future::join_all(probes).await;
        let mut masters = Vec::with_capacity(probed.len());
        let mut slots_failing = unserved;
        let mut state_ok = false;
        let mut state_fail = None;
        for ((master, ok), slots) in probed.into_iter().zip(ranges) {
            let Some(mut master) = master else { continue };
            match (&master.answer, ok) {
                (Ok(_), Some(true)) => state_ok = true,
                (Ok(_), _) => state_fail = Some(master.addr.clone()),
                (Err(_), _) => slots_failing.extend(slots.iter().cloned()),
            }
            master.slots = slots;
            masters.push(master);
        }
        slots_failing.sort_by_key(|r| *r.start());
        let down = if map.masters.is_empty() {
            Some(
                refreshed.err().unwrap_or_else(|| {
                    BackendError::Redis("the cluster serves no slots".to_owned())
                }),
            )
        } else if !state_ok {
            Some(match state_fail {
                Some(addr) => BackendError::Redis(format!(
                    "the cluster refuses commands (cluster_state:fail at {addr}); with cluster-require-full-coverage yes, one master without a replica down stops every slot"
                )),
                None => BackendError::Redis("no master of the cluster answers".to_owned()),
            })
        } else {
            None
        };
        if down.is_some() && map.masters.len() == masters.len() {
            // Every slot fails while the cluster is down.
            slots_failing = vec![0..=u16::try_from(SLOTS.saturating_sub(1)).unwrap_or(u16::MAX)];
        }
        StoreHealth {
            deployment: Deployment::Cluster,
            masters,
            slots_failing,
            sentinel: None,
            down,
        }
    }
}

/// A master's health from `CLUSTER INFO`, and whether it says `cluster_state:ok`.
async fn cluster_state(
    node: &Node,
    timeout: Duration,
    info: redis::Cmd,
    clock: &dyn Clock,
) -> (Option<MasterHealth>, Option<bool>) {
    let Some((master, reply)) = super::probe::probe(node, timeout, info, clock).await else {
        return (None, None);
    };
    let ok = match &reply {
        Some(Value::BulkString(text)) => {
            Some(String::from_utf8_lossy(text).contains("cluster_state:ok"))
        }
        Some(Value::VerbatimString { text, .. }) => Some(text.contains("cluster_state:ok")),
        _ => None,
    };
    (Some(master), ok)
}
