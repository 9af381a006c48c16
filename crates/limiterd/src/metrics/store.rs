//! The store's health as gauges, for alerting on what `/readyz` says: whether the service is
//! ready, whether its store can decide, and on Redis its masters (known, answering), each
//! master's health (answering, its circuit breaker) and Sentinel's sentinels. Set from the
//! last probe of the store at each scrape ([`StoreReading`]); a master no longer known (after a
//! failover or a slot map change) is dropped from the labels, not left at its last value.

use std::sync::atomic::AtomicI64;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

type Flag = Gauge<i64, AtomicI64>;

/// What the last probe found, as the gauges report it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreReading<'a> {
    /// Ready for traffic (the store can decide and no shutdown has begun).
    pub ready: bool,
    /// The store can decide (always in memory; on a cluster, while any master answers).
    pub reachable: bool,
    /// On Redis, each master: `host:port`, its cluster slots (empty off a cluster), whether
    /// it answered, whether its circuit breaker is open. Empty in memory.
    pub masters: Vec<MasterReading<'a>>,
    /// Under Sentinel: sentinels answering, and configured.
    pub sentinels: Option<(usize, usize)>,
}

/// One master in a [`StoreReading`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterReading<'a> {
    /// `host:port`.
    pub addr: &'a str,
    /// Its cluster slots (`0-5460`), empty off a cluster.
    pub slots: &'a str,
    /// Whether it answered the probe.
    pub answering: bool,
    /// Whether its circuit breaker is open.
    pub breaker_open: bool,
}

/// The gauges, registered once.
#[derive(Debug)]
pub(super) struct StoreGauges {
    ready: Flag,
    reachable: Flag,
    masters: Flag,
    masters_answering: Flag,
    master_up: Family<[(&'static str, String); 2], Flag>,
    breaker_open: Family<[(&'static str, String); 1], Flag>,
    sentinels: Flag,
    sentinels_answering: Flag,
}

impl StoreGauges {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let mut gauge = |name: &str, help: &str| {
            let gauge = Flag::default();
            registry.register(name, help, gauge.clone());
            gauge
        };
        let ready = gauge(
            "limiterd_ready",
            "1 when ready for traffic (as /readyz answers 200): the store can decide and no shutdown has begun",
        );
        let reachable = gauge(
            "limiterd_store_reachable",
            "1 when the store can decide (always in memory; on a cluster, while any master answers)",
        );
        let masters = gauge(
            "limiterd_store_masters",
            "Redis masters known (0 in memory)",
        );
        let masters_answering = gauge(
            "limiterd_store_masters_answering",
            "Redis masters that answered the last probe",
        );
        let sentinels = gauge(
            "limiterd_store_sentinels",
            "Sentinels configured (0 off Sentinel)",
        );
        let sentinels_answering = gauge(
            "limiterd_store_sentinels_answering",
            "Sentinels that answered the last probe",
        );
        let master_up = Family::default();
        registry.register(
            "limiterd_store_master_up",
            "1 when this Redis master answered the last probe, by master (host:port) and its cluster slots; its slots follow the failure policy while 0",
            master_up.clone(),
        );
        let breaker_open = Family::default();
        registry.register(
            "limiterd_store_master_breaker_open",
            "1 while this Redis master's circuit breaker is open (its calls skip Redis and follow the failure policy), by master",
            breaker_open.clone(),
        );
        Self {
            ready,
            reachable,
            masters,
            masters_answering,
            master_up,
            breaker_open,
            sentinels,
            sentinels_answering,
        }
    }

    /// Sets every gauge from `reading`, dropping masters it does not name.
    pub(super) fn set(&self, reading: &StoreReading<'_>) {
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.ready.set(i64::from(reading.ready));
        self.reachable.set(i64::from(reading.reachable));
        self.masters.set(count(reading.masters.len()));
        let answering = reading.masters.iter().filter(|m| m.answering).count();
        self.masters_answering.set(count(answering));
        self.master_up.clear();
        self.breaker_open.clear();
        for master in &reading.masters {
            let node = ("master", master.addr.to_owned());
            self.master_up
                .get_or_create(&[node.clone(), ("slots", master.slots.to_owned())])
                .set(i64::from(master.answering));
            self.breaker_open
                .get_or_create(&[node])
                .set(i64::from(master.breaker_open));
        }
        let (answering, configured) = reading.sentinels.unwrap_or_default();
        self.sentinels.set(count(configured));
        self.sentinels_answering.set(count(answering));
    }
}
