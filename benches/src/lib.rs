//! Shared setup for the criterion benchmarks in `benches/`: limits and quotas that always admit,
//! always deny, or keep keys from ever being full again (sticky), the benchmark group settings,
//! a multi-threaded runner, a scattered key order, the resident bytes-per-key
//! measurement run in child processes, and a `redis-server` of the benchmarks' own.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use criterion::{BenchmarkGroup, Criterion, Throughput, measurement::WallTime};
use governor::Quota;
use limiter_core::Limit;

/// One unit per ns: a token bucket never runs out in a bench loop.
pub fn token_bucket_allow() -> Limit {
    Limit::per_second(1_000_000_000)
}

/// 255 per µs: the most a sliding window of 1 µs supports, far above any loop's rate.
pub fn window_allow() -> Limit {
    Limit::from_nanos(255, 1_000)
}

/// One unit per hour in bursts of 1,000: a key visited a few dozen times in a run never runs
/// out, and is never full again (so no store drops it) while the run lasts.
pub fn token_bucket_sticky() -> Limit {
    Limit::per_hour(1).with_burst(1_000)
}

/// Governor's equivalent of [`token_bucket_sticky`].
pub fn sticky_quota() -> Quota {
    Quota::per_hour(NonZeroU32::MIN).allow_burst(NonZeroU32::new(1_000).expect("non-zero"))
}

/// 1,000 per hour-long window: as sticky as [`token_bucket_sticky`], for the window counters.
pub fn window_sticky() -> Limit {
    Limit::per_hour(1_000)
}

/// 1,000 per second in bursts of a billion: a key visited every few microseconds (a few dozen
/// keys in rotation) runs a millisecond further into debt at each visit, so it is never full
/// again (no store drops it) and, at the fastest loop's pace, runs out only after an hour.
pub fn token_bucket_warm() -> Limit {
    Limit::per_second(1_000).with_burst(1_000_000_000)
}

/// Governor's equivalent of [`token_bucket_warm`].
pub fn warm_quota() -> Quota {
    Quota::per_second(NonZeroU32::new(1_000).expect("non-zero"))
        .allow_burst(NonZeroU32::new(1_000_000_000).expect("non-zero"))
}

/// Drained by one call and drained for the rest of the run.
pub fn never_limit() -> Limit {
    Limit::per_hour(1)
}

/// Governor's equivalent of [`token_bucket_allow`].
pub fn allow_quota() -> Quota {
    Quota::per_second(NonZeroU32::new(1_000_000_000).expect("non-zero"))
}

/// Governor's equivalent of [`never_limit`].
pub fn deny_quota() -> Quota {
    Quota::per_hour(NonZeroU32::MIN)
}

/// Set by `cargo xtask bench --quick`: every group measures briefly (the whole run in a few
/// minutes, medians noisier).
pub const QUICK_ENV: &str = "LIMITER_BENCH_QUICK";

/// Whether this is a quick run.
pub fn quick() -> bool {
    std::env::var_os(QUICK_ENV).is_some()
}

/// `full` in a full run, a tenth of it (at least 100 ms) in a quick one.
pub fn measuring(full: Duration) -> Duration {
    if quick() {
        (full / 10).max(Duration::from_millis(100))
    } else {
        full
    }
}

/// A group with `elements` calls per iteration and short, fixed times so a run stays brief.
pub fn group<'a>(c: &'a mut Criterion, name: &str, elements: u64) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group.throughput(Throughput::Elements(elements));
    group.measurement_time(measuring(Duration::from_secs(3)));
    group.warm_up_time(measuring(Duration::from_secs(1)));
    if quick() {
        group.sample_size(10);
    }
    group
}

/// The floor of a direct check: one clock reading, one atomic load and one compare-exchange
/// (what any lock-free limiter must do); [`Floor::read_only`] is a denial's floor (no write).
#[derive(Debug, Default)]
pub struct Floor<C> {
    clock: C,
    state: std::sync::atomic::AtomicU64,
}

impl<C: limiter_core::Clock> Floor<C> {
    /// A floor on `clock`.
    pub fn new(clock: C) -> Self {
        Self {
            clock,
            state: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Clock, load, compare-exchange.
    pub fn check(&self) -> bool {
        use std::sync::atomic::Ordering;
        let now = self.clock.now();
        let seen = self.state.load(Ordering::Acquire);
        self.state
            .compare_exchange(seen, seen.max(now) + 1, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Clock and load only.
    pub fn read_only(&self) -> bool {
        let now = self.clock.now();
        self.state.load(std::sync::atomic::Ordering::Acquire) > now
    }
}

/// The plain peer: a token bucket (GCRA) behind a `std::sync::Mutex`.
#[derive(Debug)]
pub struct MutexBucket<C> {
    clock: C,
    interval: u64,
    tolerance: u64,
    tat: std::sync::Mutex<u64>,
}

impl<C: limiter_core::Clock> MutexBucket<C> {
    /// `per_second` units a second in bursts of `burst`.
    pub fn new(clock: C, per_second: u64, burst: u64) -> Self {
        let interval = (1_000_000_000 / per_second.max(1)).max(1);
        Self {
            clock,
            interval,
            tolerance: interval * burst.saturating_sub(1),
            tat: std::sync::Mutex::new(0),
        }
    }

    /// One unit, if there is one.
    pub fn check(&self) -> bool {
        let now = self.clock.now();
        let Ok(mut tat) = self.tat.lock() else {
            return false;
        };
        let start = (*tat).max(now);
        if start - now > self.tolerance {
            return false;
        }
        *tat = start + self.interval;
        true
    }
}

/// Runs `call` on `threads` threads, `iters` times each, and returns the slowest thread's wall
/// time: one criterion iteration is one call on every thread.
pub fn on_threads(threads: usize, iters: u64, call: impl Fn() -> bool + Sync) -> Duration {
    let start = Barrier::new(threads);
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    start.wait();
                    let began = Instant::now();
                    for _ in 0..iters {
                        black_box(call());
                    }
                    began.elapsed()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("bench thread"))
            .max()
            .unwrap_or_default()
    })
}

/// Visits every key below `keys` once per cycle, in an order the hardware prefetcher cannot
/// follow (611,953 is prime and does not divide any power-of-ten key count used here).
pub fn scattered(keys: u64) -> impl FnMut() -> u64 {
    let mut key = 0u64;
    move || {
        key = (key + 611_953) % keys;
        key
    }
}

/// The process's resident memory in bytes, from `/proc/self/statm` (0 where that is missing).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|statm| statm.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// A structure to measure: its name, and a setup that builds it empty (clock, hasher, limiter)
/// and returns what then adds [`MEMORY_KEYS`] keys to it. Only that second step is measured.
pub type MemorySubject = (&'static str, fn() -> Filler);

/// Adds the keys to a structure built empty, and returns it to keep its memory alive.
pub type Filler = Box<dyn FnOnce() -> Box<dyn std::any::Any>>;

/// How many keys each memory subject holds.
pub const MEMORY_KEYS: u64 = 1_000_000;

const MEMORY_ENV: &str = "LIMITER_BENCH_MEMORY";

/// Resident bytes per key, each subject measured in a fresh child process of this bench binary
/// (within one process, memory freed by an earlier subject is reused and hides the next one's
/// cost). Call first thing in `main`: in the child it builds the named subject, prints its
/// resident-memory delta and returns `true`, and `main` must then return. In the parent it
/// measures every subject, prints `bytes_per_key/NAME` lines, appends them to
/// `target/bench-bytes-per-key.csv` and returns `false`.
pub fn bytes_per_key(subjects: &[MemorySubject]) -> bool {
    if let Ok(name) = std::env::var(MEMORY_ENV) {
        if let Some((_, setup)) = subjects.iter().find(|(n, _)| *n == name) {
            let fill = setup();
            let before = resident_bytes();
            let built = fill();
            println!("{}", resident_bytes().saturating_sub(before));
            drop(built);
        }
        return true;
    }
    let Ok(me) = std::env::current_exe() else {
        return false;
    };
    let csv = target_dir().join("bench-bytes-per-key.csv");
    for (name, _) in subjects {
        let measured = std::process::Command::new(&me)
            .env(MEMORY_ENV, name)
            .output()
            .ok()
            .and_then(|out| {
                String::from_utf8(out.stdout)
                    .ok()?
                    .trim()
                    .parse::<u64>()
                    .ok()
            });
        let Some(bytes) = measured else {
            println!("bytes_per_key/{name}: measurement failed");
            continue;
        };
        let per_key = bytes as f64 / MEMORY_KEYS as f64;
        println!("bytes_per_key/{name}: {per_key:.1} B/key at {MEMORY_KEYS} keys (resident)");
        let line = format!("{name},{MEMORY_KEYS},{per_key:.1}\n");
        let _ = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&csv)
            .and_then(|mut file| std::io::Write::write_all(&mut file, line.as_bytes()));
    }
    false
}

/// Where the benches write what they measure beside criterion's results: the target directory
/// `cargo xtask bench` names (`LIMITER_BENCH_TARGET`), else `CARGO_TARGET_DIR`, else the
/// workspace's `target/`.
pub fn target_dir() -> std::path::PathBuf {
    let workspace = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    ["LIMITER_BENCH_TARGET", "CARGO_TARGET_DIR"]
        .iter()
        .find_map(|name| std::env::var_os(name).filter(|v| !v.is_empty()))
        .map_or_else(|| workspace.join("target"), |dir| workspace.join(dir))
}

/// A `redis-server` the Redis benchmarks start on a free loopback port (`$REDIS_SERVER` if set),
/// without persistence, killed on drop.
#[derive(Debug)]
pub struct RedisProcess {
    child: std::process::Child,
    /// Its port.
    pub port: u16,
}

impl RedisProcess {
    /// Starts one and waits until it accepts connections; `None` if there is no
    /// `redis-server` to start.
    pub fn start() -> Option<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .ok()?
            .local_addr()
            .ok()?
            .port();
        let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        let child = std::process::Command::new(binary)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .ok()?;
        let server = Self { child, port };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(server);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
