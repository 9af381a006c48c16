//! Keyed limiters: every store beside governor's keyed limiter and the floor (a dashmap lookup,
//! a clock reading and a compare-exchange), with one hot key, with 1M
//! distinct keys touched for the first time and warm, the resident bytes each key costs, the
//! bounded store beside a bare moka `get_with` plus CAS, and the cost of churn through a bound.
//!
//! Hot keys run under limits that never deny; first-touch and warm runs under "sticky" limits
//! that neither deny nor let a key become full (and so be dropped) while the run lasts.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, measurement::WallTime};
use governor::{DefaultKeyedRateLimiter, RateLimiter};
use limiter_benches::{
    Filler, MEMORY_KEYS, MemorySubject, allow_quota, bytes_per_key, group, scattered, sticky_quota,
    token_bucket_allow, token_bucket_sticky, window_allow, window_sticky,
};
use limiter_core::{Algorithm, Clock, DefaultClock, Limit, MonotonicClock, StateCell};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_store::{BoundedStore, KeyedLimiter, ShardedStore, Store};
use limiter_token_bucket::Gcra;
use moka::policy::EvictionPolicy;

/// Room for every key of the warm runs: the bounded store never evicts there.
const ROOMY: u64 = 2 * MEMORY_KEYS;

type Keyed<A, C, St> = KeyedLimiter<A, u64, C, St>;

fn keyed<A: Algorithm, C: Clock, St: Store<u64>>(
    limit: Limit,
    clock: C,
    store: St,
) -> Keyed<A, C, St> {
    KeyedLimiter::with_store(limit, clock, store).expect("valid")
}

fn sharded<A: Algorithm>(limit: Limit) -> Keyed<A, DefaultClock, ShardedStore<u64>> {
    keyed(limit, DefaultClock::new(), ShardedStore::new())
}

fn bounded(limit: Limit) -> Keyed<Gcra, DefaultClock, BoundedStore<u64>> {
    keyed(
        limit,
        DefaultClock::new(),
        BoundedStore::new(ROOMY).expect("valid"),
    )
}

fn allowed<A: Algorithm, C: Clock, St: Store<u64>>(limiter: &Keyed<A, C, St>, key: u64) -> bool {
    limiter.check_key(&key).is_ok_and(|d| d.is_allowed())
}

/// The bounded store's floor: moka configured the same way, `get_with` and the same CAS.
struct BareMoka {
    cache: moka::sync::Cache<u64, Arc<StateCell>, foldhash::fast::RandomState>,
    gcra: Gcra,
    clock: DefaultClock,
}

impl BareMoka {
    fn new(limit: Limit) -> Self {
        let cache = moka::sync::Cache::builder()
            .max_capacity(ROOMY)
            .eviction_policy(EvictionPolicy::lru())
            .build_with_hasher(foldhash::fast::RandomState::default());
        let gcra = Gcra::new(limit).expect("valid");
        Self {
            cache,
            gcra,
            clock: DefaultClock::new(),
        }
    }

    fn check(&self, key: u64) -> bool {
        self.cache
            .get_with(key, || Arc::new(StateCell::new(Gcra::FRESH)))
            .apply(&self.gcra, 1, self.clock.now())
            .is_ok_and(|d| d.is_allowed())
    }
}

/// The keyed floor: a concurrent-map lookup (dashmap, foldhash as our store hashes), a clock
/// reading and one compare-exchange on the key's word; a missing key is inserted.
struct KeyedFloor {
    map: dashmap::DashMap<u64, std::sync::atomic::AtomicU64, foldhash::fast::RandomState>,
    clock: DefaultClock,
}

impl KeyedFloor {
    fn new() -> Self {
        Self {
            map: dashmap::DashMap::with_hasher(foldhash::fast::RandomState::default()),
            clock: DefaultClock::new(),
        }
    }

    fn check(&self, key: u64) -> bool {
        use std::sync::atomic::{AtomicU64, Ordering};
        let now = self.clock.now();
        let cas = |word: &AtomicU64| {
            let seen = word.load(Ordering::Acquire);
            word.compare_exchange(seen, seen.max(now) + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        };
        if let Some(word) = self.map.get(&key) {
            return cas(&word);
        }
        cas(&self.map.entry(key).or_insert_with(|| AtomicU64::new(0)))
    }
}

/// Times `iters` first touches of new keys on a limiter `new` builds for each sample.
fn first_touch<L>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    new: impl Fn() -> L,
    check: impl Fn(&L, u64) -> bool,
) {
    g.bench_function(name, |b| {
        b.iter_custom(|iters| {
            let limiter = new();
            let began = Instant::now();
            for key in 0..iters {
                black_box(check(&limiter, key));
            }
            let took = began.elapsed();
            drop(limiter);
            took
        })
    });
}

/// Hot key, first touch and 1M warm keys for one keyed limiter. `new(sticky)` builds it with
/// the sticky limit or the never-denying one.
fn subject<L>(
    c: &mut Criterion,
    name: &str,
    new: impl Fn(bool) -> L,
    check: impl Fn(&L, u64) -> bool,
) {
    let hot = new(false);
    let mut g = group(c, "keyed_hot_key", 1);
    g.bench_function(name, |b| b.iter(|| black_box(check(&hot, black_box(7)))));
    g.finish();
    drop(hot);

    let mut g = group(c, "keyed_1M_keys_first_touch", 1);
    first_touch(&mut g, name, || new(true), &check);
    g.finish();

    let warm = new(true);
    for key in 0..MEMORY_KEYS {
        check(&warm, key);
    }
    let mut next = scattered(MEMORY_KEYS);
    let mut g = group(c, "keyed_1M_keys_warm", 1);
    g.bench_function(name, |b| b.iter(|| black_box(check(&warm, next()))));
    g.finish();
}

fn tb(sticky: bool) -> Limit {
    if sticky {
        token_bucket_sticky()
    } else {
        token_bucket_allow()
    }
}

fn window(sticky: bool) -> Limit {
    if sticky {
        window_sticky()
    } else {
        window_allow()
    }
}

fn governor(sticky: bool) -> DefaultKeyedRateLimiter<u64> {
    RateLimiter::dashmap(if sticky {
        sticky_quota()
    } else {
        allow_quota()
    })
}

/// A permit of the keyed concurrency limiter (its defaults) taken and released on one hot key,
/// beside the keyed checks of the same group.
fn permits(c: &mut Criterion) {
    let limiter = limiter_concurrency::KeyedConcurrency::<u64>::new(1_000).expect("valid");
    let mut g = group(c, "keyed_hot_key", 1);
    g.bench_function("concurrency_acquire_release", |b| {
        b.iter(|| black_box(limiter.try_acquire(black_box(&7)).map(|p| p.release())))
    });
    // A calendar quota (a month in Berlin) on the calendar's default clock (the OS's: a
    // calendar needs the wall clock's rate): the window kept by the calendar read on every
    // decision (converted to the zone's calendar once a window).
    let clock = limiter_core::MonotonicClock::new();
    let origin = limiter_core::unix_origin(&clock);
    let month =
        limiter_calendar::Calendar::new(limiter_calendar::CalendarUnit::Month, "Europe/Berlin")
            .expect("known zone");
    let quota: limiter_calendar::KeyedCalendarWindow<u64> = KeyedLimiter::from_algorithm(
        limiter_calendar::CalendarCounter::new(1 << 38, month, origin).expect("valid"),
        clock,
        ShardedStore::new(),
    )
    .expect("the OS clock keeps the wall clock's rate");
    g.bench_function("calendar_month_berlin", |b| {
        b.iter(|| black_box(quota.check_key(black_box(&7)).is_ok()))
    });
    g.finish();
}

/// 1M keys cycling through a 100k-key bound: every call on the bounded store inserts a key and
/// evicts one (the keys never refill within the run, so none goes idle first).
fn churn(c: &mut Criterion) {
    let limiter = keyed::<Gcra, _, _>(
        token_bucket_sticky(),
        DefaultClock::new(),
        BoundedStore::new(MEMORY_KEYS / 10).expect("valid"),
    );
    let mut next = scattered(MEMORY_KEYS);
    let mut g = group(c, "keyed_churn_1M_through_100k", 1);
    g.measurement_time(limiter_benches::measuring(Duration::from_secs(5)));
    g.bench_function("token_bucket_bounded", |b| {
        b.iter(|| black_box(allowed(&limiter, next())))
    });
    g.finish();
    println!("churn: {:?}", limiter.stats());
}

/// Builds `new` with the sticky limit now, and returns what adds [`MEMORY_KEYS`] keys to it.
fn filled<L: 'static>(new: impl Fn(bool) -> L, check: fn(&L, u64) -> bool) -> Filler {
    let limiter = new(true);
    Box::new(move || {
        for key in 0..MEMORY_KEYS {
            check(&limiter, key);
        }
        Box::new(limiter)
    })
}

const MEMORY: &[MemorySubject] = &[
    ("keyed_token_bucket_sharded", || {
        filled(|s| sharded::<Gcra>(tb(s)), allowed)
    }),
    ("keyed_sliding_window_sharded", || {
        filled(|s| sharded::<SlidingCounter>(window(s)), allowed)
    }),
    ("keyed_fixed_window_sharded", || {
        filled(|s| sharded::<FixedCounter>(window(s)), allowed)
    }),
    ("keyed_token_bucket_bounded", || {
        filled(|s| bounded(tb(s)), allowed)
    }),
    ("keyed_governor", || {
        filled(governor, |l, k| l.check_key(&k).is_ok())
    }),
];

fn main() {
    if bytes_per_key(MEMORY) {
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    // What a user gets from `KeyedTokenBucket::new(limit)`: the default clock and store.
    subject(
        &mut c,
        "token_bucket_sharded",
        |s| limiter_token_bucket::KeyedTokenBucket::<u64>::new(tb(s)).expect("valid"),
        allowed,
    );
    subject(
        &mut c,
        "token_bucket_sharded_os_clock",
        |s| keyed::<Gcra, _, _>(tb(s), MonotonicClock::new(), ShardedStore::new()),
        allowed,
    );
    subject(&mut c, "token_bucket_bounded", |s| bounded(tb(s)), allowed);
    subject(
        &mut c,
        "moka_get_with_cas",
        |s| BareMoka::new(tb(s)),
        BareMoka::check,
    );
    subject(
        &mut c,
        "sliding_window_sharded",
        |s| sharded::<SlidingCounter>(window(s)),
        allowed,
    );
    subject(
        &mut c,
        "fixed_window_sharded",
        |s| sharded::<FixedCounter>(window(s)),
        allowed,
    );
    subject(&mut c, "governor", governor, |l, k| l.check_key(&k).is_ok());
    subject(&mut c, "floor", |_| KeyedFloor::new(), KeyedFloor::check);
    permits(&mut c);
    churn(&mut c);
    c.final_summary();
}
