//! Which concurrent map the default store is built on: DashMap, papaya, scc and our sharded
//! hashbrown table, each with SipHash (std's `RandomState`) and foldhash, all doing the same
//! work per call (hash, lookup, TSC clock read, token-bucket decide, CAS), with one hot key and
//! with 1M warm keys, plus the resident bytes per key at 1M keys.

use std::hash::{BuildHasher, RandomState};
use std::hint::black_box;

use criterion::Criterion;
use dashmap::DashMap;
use limiter_benches::{
    Filler, MEMORY_KEYS, MemorySubject, bytes_per_key, group, scattered, token_bucket_allow,
    token_bucket_sticky,
};
use limiter_core::{Algorithm, Clock, DefaultClock, StateCell};
use limiter_store::{ShardedStore, Store};
use limiter_token_bucket::Gcra;

type Fold = foldhash::fast::RandomState;

/// One map: how to build it empty, add a key, and decide one unit with `gcra` on a key.
trait Candidate: Sized + 'static {
    fn new() -> Self;
    fn insert(&self, gcra: &Gcra, key: u64, now: u64);
    fn check(&self, gcra: &Gcra, key: u64, now: u64) -> bool;
}

fn allowed(cell: &StateCell, gcra: &Gcra, now: u64) -> bool {
    cell.apply(gcra, 1, now).is_ok_and(|d| d.is_allowed())
}

impl<S: BuildHasher + Default + Clone + Send + Sync + 'static> Candidate
    for DashMap<u64, StateCell, S>
{
    fn new() -> Self {
        DashMap::with_hasher(S::default())
    }
    fn insert(&self, gcra: &Gcra, key: u64, now: u64) {
        self.entry(key)
            .or_insert_with(|| StateCell::new(Gcra::FRESH))
            .apply(gcra, 1, now)
            .ok();
    }
    fn check(&self, gcra: &Gcra, key: u64, now: u64) -> bool {
        self.get(&key).is_some_and(|cell| allowed(&cell, gcra, now))
    }
}

impl<S: BuildHasher + Default + Send + Sync + 'static> Candidate
    for papaya::HashMap<u64, StateCell, S>
{
    fn new() -> Self {
        papaya::HashMap::with_hasher(S::default())
    }
    fn insert(&self, gcra: &Gcra, key: u64, now: u64) {
        let map = self.pin();
        map.get_or_insert_with(key, || StateCell::new(Gcra::FRESH))
            .apply(gcra, 1, now)
            .ok();
    }
    fn check(&self, gcra: &Gcra, key: u64, now: u64) -> bool {
        self.pin()
            .get(&key)
            .is_some_and(|cell| allowed(cell, gcra, now))
    }
}

impl<S: BuildHasher + Default + Send + Sync + 'static> Candidate
    for scc::HashMap<u64, StateCell, S>
{
    fn new() -> Self {
        scc::HashMap::with_hasher(S::default())
    }
    fn insert(&self, gcra: &Gcra, key: u64, now: u64) {
        let _ = self.insert_sync(key, StateCell::new(Gcra::FRESH));
        self.check(gcra, key, now);
    }
    fn check(&self, gcra: &Gcra, key: u64, now: u64) -> bool {
        self.read_sync(&key, |_, cell| allowed(cell, gcra, now))
            .unwrap_or(false)
    }
}

impl<S: BuildHasher + Default + Send + Sync + 'static> Candidate for ShardedStore<u64, S> {
    fn new() -> Self {
        ShardedStore::with_hasher(S::default())
    }
    fn insert(&self, gcra: &Gcra, key: u64, now: u64) {
        let _ = self.apply(gcra, &key, 1, now);
    }
    fn check(&self, gcra: &Gcra, key: u64, now: u64) -> bool {
        self.apply(gcra, &key, 1, now).is_ok_and(|d| d.is_allowed())
    }
}

fn sticky() -> Gcra {
    Gcra::new(token_bucket_sticky()).expect("valid")
}

/// A map holding [`MEMORY_KEYS`] keys, each with one unit taken.
fn filled<M: Candidate>() -> M {
    let (gcra, clock) = (sticky(), DefaultClock::new());
    let map = M::new();
    for key in 0..MEMORY_KEYS {
        map.insert(&gcra, key, clock.now());
    }
    map
}

fn boxed<M: Candidate>() -> Filler {
    let (gcra, clock, map) = (sticky(), DefaultClock::new(), M::new());
    Box::new(move || {
        for key in 0..MEMORY_KEYS {
            map.insert(&gcra, key, clock.now());
        }
        Box::new(map)
    })
}

const CANDIDATES: &[MemorySubject] = &[
    (
        "map_dashmap_sip",
        boxed::<DashMap<u64, StateCell, RandomState>>,
    ),
    (
        "map_papaya_sip",
        boxed::<papaya::HashMap<u64, StateCell, RandomState>>,
    ),
    (
        "map_scc_sip",
        boxed::<scc::HashMap<u64, StateCell, RandomState>>,
    ),
    ("map_sharded_sip", boxed::<ShardedStore<u64, RandomState>>),
    ("map_dashmap_fold", boxed::<DashMap<u64, StateCell, Fold>>),
    (
        "map_papaya_fold",
        boxed::<papaya::HashMap<u64, StateCell, Fold>>,
    ),
    ("map_scc_fold", boxed::<scc::HashMap<u64, StateCell, Fold>>),
    ("map_sharded_fold", boxed::<ShardedStore<u64, Fold>>),
];

/// The hot key runs with a limit that never denies; the warm keys with the sticky one.
fn candidate<M: Candidate>(c: &mut Criterion, name: &str) {
    let clock = DefaultClock::new();
    let hot = Gcra::new(token_bucket_allow()).expect("valid");
    let map = filled::<M>();
    // The hot key is one more key, outside the warm set, under the never-denying limit.
    map.insert(&hot, MEMORY_KEYS, clock.now());
    let mut g = group(c, "map_hot_key", 1);
    g.bench_function(name, |b| {
        b.iter(|| black_box(map.check(&hot, black_box(MEMORY_KEYS), clock.now())))
    });
    g.finish();
    let (gcra, mut next) = (sticky(), scattered(MEMORY_KEYS));
    let mut g = group(c, "map_1M_keys_warm", 1);
    g.bench_function(name, |b| {
        b.iter(|| black_box(map.check(&gcra, next(), clock.now())))
    });
    g.finish();
}

fn main() {
    if bytes_per_key(CANDIDATES) {
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    candidate::<DashMap<u64, StateCell, RandomState>>(&mut c, "dashmap_sip");
    candidate::<papaya::HashMap<u64, StateCell, RandomState>>(&mut c, "papaya_sip");
    candidate::<scc::HashMap<u64, StateCell, RandomState>>(&mut c, "scc_sip");
    candidate::<ShardedStore<u64, RandomState>>(&mut c, "sharded_sip");
    candidate::<DashMap<u64, StateCell, Fold>>(&mut c, "dashmap_fold");
    candidate::<papaya::HashMap<u64, StateCell, Fold>>(&mut c, "papaya_fold");
    candidate::<scc::HashMap<u64, StateCell, Fold>>(&mut c, "scc_fold");
    candidate::<ShardedStore<u64, Fold>>(&mut c, "sharded_fold");
    c.final_summary();
}
