//! A Redis Cluster: which master serves each of the 16384 slots (learned from `CLUSTER
//! SLOTS`), one [`Node`] per master, and keeping that map true. The map is learned at
//! connect, and learned again (in the background, at most every [`REFRESH_GAP`]) when a call
//! meets a redirect or a failing master, and at each health probe; a `MOVED` reply updates
//! its slot at once. A map learned by a refresh that a `MOVED` overtook (read from `CLUSTER
//! SLOTS` before the redirect, installed after it) keeps the redirect's master for that slot, so
//! a refresh never undoes a newer redirect. A master that dies fails only its own slots' calls
//! (a refused connection at once); when its replica is promoted, the next map sends those slots
//! to the new master.
#![deny(clippy::arithmetic_side_effects)]

use core::time::Duration;
use std::collections::{HashMap, VecDeque};
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

/// The most recent `MOVED` redirects remembered for refreshes under way (more during one
/// refresh means the cluster is resharding fast: each slot the refresh then gets wrong is
/// redirected, and set right, once more).
const RECENT_MOVES: usize = 1024;

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

    /// `node`'s index among the masters, adding it if it is new.
    fn index_of(&mut self, node: &Arc<Node>) -> Result<u16, TooManyMasters> {
        let index = match self.masters.iter().position(|m| Arc::ptr_eq(m, node)) {
            Some(index) => index,
            None => {
                self.masters.push(Arc::clone(node));
                self.masters.len().saturating_sub(1)
            }
        };
        u16::try_from(index)
            .ok()
            .filter(|&index| index != NONE)
            .ok_or(TooManyMasters)
    }

    /// Makes `node` the master of `slots`, adding it to the masters if it is new.
    fn assign(
        &mut self,
        slots: core::ops::RangeInclusive<u16>,
        node: &Arc<Node>,
    ) -> Result<(), TooManyMasters> {
        let index = self.index_of(node)?;
        let range = usize::from(*slots.start())..=usize::from(*slots.end());
        if let Some(owners) = self.owner.get_mut(range) {
            owners.fill(index);
        }
        Ok(())
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

/// More masters than a map counts (65,535; a cluster has at most 16,384, one per slot).
#[derive(Debug)]
struct TooManyMasters;

/// The current map and the `MOVED` redirects that updated it, numbered.
struct Mapped {
    map: Arc<SlotMap>,
    /// How many `MOVED` redirects updated the map so far.
    moves: u64,
    /// The last [`RECENT_MOVES`] of them: each one's number and slot.
    recent: VecDeque<(u64, u16)>,
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
    mapped: RwLock<Mapped>,
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
            mapped: RwLock::new(Mapped {
                map: Arc::new(SlotMap::empty()),
                moves: 0,
                recent: VecDeque::new(),
            }),
            refreshing: AtomicBool::new(false),
            last_refresh: Mutex::new(None),
            last_error: Mutex::new(None),
        }
    }

    fn map(&self) -> Arc<SlotMap> {
        // A poisoned lock still holds a whole map: it is replaced in one assignment.
        let mapped = self.mapped.read().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&mapped.map)
    }

    /// How many `MOVED` redirects updated the map so far: a refresh reads it before asking.
    fn moves_so_far(&self) -> u64 {
        self.mapped
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .moves
    }

    /// Installs `map`, learned by a refresh that started after `since` moves: a slot a `MOVED`
    /// updated since then keeps the master the current map names for it (the refresh may
    /// have read `CLUSTER SLOTS` before the redirect; a later refresh already installed is as
    /// new, and names the same master).
    fn install(&self, mut map: SlotMap, since: u64) {
        let mut mapped = self.mapped.write().unwrap_or_else(PoisonError::into_inner);
        let Mapped {
            map: current,
            recent,
            ..
        } = &mut *mapped;
        for &(_, slot) in recent.iter().filter(|(number, _)| *number >= since) {
            if let Some(node) = current.node(slot) {
                // Unreachable: a map has at most one master per slot.
                let _ = map.assign(slot..=slot, node);
            }
        }
        mapped.map = Arc::new(map);
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
            let mut mapped = self.mapped.write().unwrap_or_else(PoisonError::into_inner);
            let mut next = SlotMap {
                owner: mapped.map.owner.clone(),
                masters: mapped.map.masters.clone(),
            };
            if next.assign(slot..=slot, &node).is_ok() {
                mapped.map = Arc::new(next);
                let number = mapped.moves;
                mapped.moves = number.saturating_add(1);
                if mapped.recent.len() == RECENT_MOVES {
                    mapped.recent.pop_front();
                }
                mapped.recent.push_back((number, slot));
            }
            drop(mapped);
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
        let since = self.moves_so_far();
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
                    self.install(map, since);
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
            let (start, end) = (u16::try_from(*start), u16::try_from(*end));
            let (Ok(start), Ok(end)) = (start, end) else {
                return Err(bad());
            };
            if start > end || usize::from(end) >= SLOTS {
                return Err(bad());
            }
            map.assign(start..=end, &node).map_err(|_| bad())?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::BreakerConfig;
    use limiter_core::ManualClock;

    fn cluster() -> Cluster {
        let maker = NodeMaker {
            breaker: BreakerConfig::default(),
            deny_cache: 0,
            refunds: Arc::default(),
            max_in_flight: 1,
        };
        Cluster::new(
            vec![NodeAddr::new("127.0.0.1".to_owned(), 7001)],
            Arc::new(LinkSettings::default()),
            maker,
            Arc::new(ManualClock::new()),
            Duration::from_millis(50),
        )
    }

    /// A `CLUSTER SLOTS` reply: each range served by the master at the port given.
    fn slots(ranges: &[(i64, i64, i64)]) -> Value {
        let entry = |&(start, end, port): &(i64, i64, i64)| {
            Value::Array(vec![
                Value::Int(start),
                Value::Int(end),
                Value::Array(vec![
                    Value::BulkString(b"127.0.0.1".to_vec()),
                    Value::Int(port),
                ]),
            ])
        };
        Value::Array(ranges.iter().map(entry).collect())
    }

    fn port_of(cluster: &Cluster, slot: u16) -> Option<u16> {
        cluster.map().node(slot)?.addr().map(|addr| addr.port())
    }

    /// Learns `reply` as a refresh that started after `since` moves installs it.
    fn learn(cluster: &Cluster, reply: &Value, since: u64) {
        let asked = NodeAddr::new("127.0.0.1".to_owned(), 7001);
        let map = cluster.read_slots(&asked, reply).expect("a valid reply");
        cluster.install(map, since);
    }

    #[test]
    fn a_refresh_overtaken_by_a_moved_keeps_the_redirect() {
        let cluster = Arc::new(cluster());
        let before_resharding = slots(&[(0, 8191, 7001), (8192, 16383, 7002)]);
        learn(&cluster, &before_resharding, cluster.moves_so_far());
        assert_eq!(port_of(&cluster, 5), Some(7001));

        // A refresh reads the map, then slot 5 moves to 7003 and a call meets the `MOVED`,
        // then the refresh installs what it read.
        let since = cluster.moves_so_far();
        cluster.redirected(5, &NodeAddr::new("127.0.0.1".to_owned(), 7003), true);
        assert_eq!(port_of(&cluster, 5), Some(7003));
        learn(&cluster, &before_resharding, since);
        assert_eq!(
            port_of(&cluster, 5),
            Some(7003),
            "the stale read undid the MOVED"
        );
        // Every other slot is as the refresh read it.
        assert_eq!(port_of(&cluster, 4), Some(7001));
        assert_eq!(port_of(&cluster, 6), Some(7001));
        assert_eq!(port_of(&cluster, 9000), Some(7002));

        // A refresh that started after the redirect is newer than it: its map stands (the
        // slot went back, say).
        learn(&cluster, &before_resharding, cluster.moves_so_far());
        assert_eq!(port_of(&cluster, 5), Some(7001));
    }

    #[test]
    fn an_ask_changes_no_slot_and_only_the_newest_moves_are_kept() {
        let cluster = Arc::new(cluster());
        let all_on_one = slots(&[(0, 16383, 7001)]);
        learn(&cluster, &all_on_one, 0);
        let since = cluster.moves_so_far();
        cluster.redirected(7, &NodeAddr::new("127.0.0.1".to_owned(), 7002), false);
        assert_eq!(port_of(&cluster, 7), Some(7001), "an ASK is for one call");
        // More moves during one refresh than are remembered: the newest are kept.
        let to = NodeAddr::new("127.0.0.1".to_owned(), 7002);
        for slot in 0..=u16::try_from(RECENT_MOVES).unwrap() {
            cluster.redirected(slot, &to, true);
        }
        assert_eq!(
            cluster.moves_so_far(),
            u64::try_from(RECENT_MOVES).unwrap() + 1
        );
        learn(&cluster, &all_on_one, since);
        assert_eq!(
            port_of(&cluster, 0),
            Some(7001),
            "the oldest move is forgotten"
        );
        for slot in 1..=u16::try_from(RECENT_MOVES).unwrap() {
            assert_eq!(port_of(&cluster, slot), Some(7002), "slot {slot}");
        }
        let past_moves = u16::try_from(RECENT_MOVES).unwrap() + 1;
        assert_eq!(port_of(&cluster, past_moves), Some(7001));
    }
}
