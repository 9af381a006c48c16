//! Stacks of 1, 2 and 3 layers beside one single-layer check, beside our own limiters and
//! governor's checked three times in sequence (no transaction), beside the floor of a 3-layer
//! transaction (also deciding, with static dispatch), a sketch of the stack's lean path typed
//! at compile time, and the parts floors are made of (a clock reading, a compare-exchange, a
//! shard read lock taken and released), in the same group, so one run gives the ratios the
//! stack targets (three layers, two of them on one key, at most 1.5x one keyed check; three
//! layers on different keys at most 2.0x) and what stands in their way.
//!
//! Every subject that takes keys rotates through the same [`PAIRS`] requests (a user and an
//! IP each), all of them warm: with one fixed pair, the run would measure whichever shards
//! those two keys fell in, and in one run out of eight (at 8 shards) both would share one,
//! saving the stack a shard lock. One subject (`stack_2_first_calls`) takes a user never seen
//! on every call instead: what a new identifier costs.

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use criterion::{Bencher, Criterion, criterion_group, criterion_main};
use governor::RateLimiter;
use limiter_benches::{group, token_bucket_warm, warm_quota};
use limiter_core::{Algorithm, Clock, Decision, DefaultClock, DirectLimiter, Limit};
use limiter_stack::Kind;
use limiter_stack::{Layer, Plan, Stack};
use limiter_store::KeyedLimiter;
use limiter_token_bucket::Gcra;

struct Request {
    user: u64,
    ip: u64,
}

/// The requests every keyed subject rotates through (a power of two: rotation is a mask).
const PAIRS: usize = 64;

/// [`PAIRS`] requests: users 0.., each with an IP from 1,000 on, paired out of order.
fn requests() -> Vec<Request> {
    (0..PAIRS as u64)
        .map(|i| Request {
            user: i,
            ip: 1_000 + (i * 29) % PAIRS as u64,
        })
        .collect()
}

/// Measures `call` on each of `items` in turn.
fn rotating<T>(b: &mut Bencher<'_>, items: &[T], mut call: impl FnMut(&T) -> bool) {
    let mut next = 0;
    b.iter(|| {
        next = (next + 1) & (PAIRS - 1);
        call(black_box(&items[next]))
    })
}

type Requests = Stack<Request, u64>;

fn user(limit: Limit) -> Layer<Request, u64> {
    Layer::keyed("user", |r: &Request| Some(r.user)).limit(Kind::TokenBucket, limit)
}

fn ip(limit: Limit) -> Layer<Request, u64> {
    Layer::keyed("ip", |r: &Request| Some(r.ip)).limit(Kind::TokenBucket, limit)
}

fn global(limit: Limit) -> Layer<Request, u64> {
    Layer::global("global").limit(Kind::TokenBucket, limit)
}

fn build(layers: Vec<Layer<Request, u64>>) -> Requests {
    layers
        .into_iter()
        .fold(Stack::builder(), |b, l| b.layer(l))
        .build()
        .expect("valid")
}

/// The floor of a 3-layer transaction (two keyed layers and a global one) that locks each entry:
/// one clock reading, a lookup in each keyed layer's map under its shard's read lock, then lock
/// each of the three entries by a compare-exchange, write it, release it. Nothing is decided, as
/// in the other floors; the two keys are in two shards, as they are in seven stacks out of
/// eight at this machine's shard count. (The stack commits a call with a global layer under
/// that layer's lock alone, one compare-exchange instead of three, so it can beat this floor's
/// commit; the floor still bounds the reading, the lookups and the shard locks.)
struct StackFloor {
    clock: DefaultClock,
    shards: [RwLock<HashMap<u64, FloorEntry, foldhash::fast::RandomState>>; 2],
    global: FloorEntry,
}

#[derive(Default)]
struct FloorEntry {
    lock: AtomicU32,
    word: AtomicU64,
}

impl StackFloor {
    /// The floor with an entry for every user and IP of `requests`.
    fn new(requests: &[Request]) -> Self {
        let shard = |keys: &mut dyn Iterator<Item = u64>| {
            let mut map = HashMap::with_hasher(foldhash::fast::RandomState::default());
            for key in keys {
                map.insert(key, FloorEntry::default());
            }
            RwLock::new(map)
        };
        Self {
            clock: DefaultClock::new(),
            shards: [
                shard(&mut requests.iter().map(|r| r.user)),
                shard(&mut requests.iter().map(|r| r.ip)),
            ],
            global: FloorEntry::default(),
        }
    }

    /// One transaction: a clock reading, both lookups under their shard read locks, the three
    /// entries locked, then each entry's word replaced by what `write` makes of it (given its
    /// position and the reading) and its lock released. `false` if a key is missing.
    #[inline]
    fn transact(&self, user: u64, ip: u64, mut write: impl FnMut(usize, u64, u64) -> u64) -> bool {
        let now = self.clock.now();
        let (Ok(users), Ok(ips)) = (self.shards[0].read(), self.shards[1].read()) else {
            return false;
        };
        let (Some(a), Some(b)) = (users.get(&user), ips.get(&ip)) else {
            return false;
        };
        let entries = [a, b, &self.global];
        for entry in entries {
            while entry
                .lock
                .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::hint::spin_loop();
            }
        }
        for (position, entry) in entries.into_iter().enumerate() {
            let next = write(position, entry.word.load(Ordering::Relaxed), now);
            entry.word.store(next, Ordering::Relaxed);
            entry.lock.store(0, Ordering::Release);
        }
        true
    }

    /// The floor: each word moved on, nothing decided.
    fn check(&self, user: u64, ip: u64) -> bool {
        self.transact(user, ip, |_, word, now| word.max(now) + 1)
    }
}

/// The floor, deciding: the same transaction with each entry's word decided by the token
/// bucket (statically dispatched, under the entry locks), the three answers returned as they
/// come. What a stack specialised at compile time to these three layers would cost before
/// building its answer; the stack's distance from it is what run-time layers (keyers and
/// algorithms behind `dyn`, plans, the general bookkeeping) and the answer cost.
fn floor_deciding(floor: &StackFloor, gcra: &Gcra, user: u64, ip: u64) -> Option<[Decision; 3]> {
    let mut answers = [Decision::allow(0, 0, 0); 3];
    floor
        .transact(user, ip, |position, word, now| {
            match gcra.decide(word, 1, now) {
                Ok(step) => {
                    answers[position] = step.decision;
                    step.next.unwrap_or(word)
                }
                Err(_) => word,
            }
        })
        .then_some(answers)
}

/// A sketch of the stack's lean path typed at compile time for these three layers, as it was
/// before the commit lock: the same protocol as `Stack` (keys from the keyers, hashed into one
/// sharded table of per-layer entries, each entry's word read under a sequence lock and decided
/// before any entry is locked) but committing with every entry locked in address order and
/// written only if none changed since it was read, with the keyers and the token bucket as type
/// parameters instead of trait objects, and the answers as they come instead of a
/// `StackDecision`. Not a stack users can have: no plans, no inserts, no fall-back. What typing
/// alone buys, against the commit lock `Stack` now takes with a global layer.
mod typed {
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    use limiter_core::{Algorithm, Clock, Decision, DefaultClock};
    use limiter_store::table::ShardedTable;
    use limiter_token_bucket::Gcra;

    use super::Request;

    const LOCKED: u32 = 1 << 31;

    /// An entry's header (version, lock bit) and word, as the stack's `Cells` keep them.
    #[derive(Default)]
    pub(crate) struct Cells {
        header: AtomicU32,
        word: AtomicU64,
    }

    impl Cells {
        /// The header and word, consistent: retried while a writer's version is odd or moved.
        fn read(&self) -> (u32, u64) {
            loop {
                let before = self.header.load(Ordering::Acquire);
                if before & 1 == 0 {
                    let word = self.word.load(Ordering::Acquire);
                    let after = self.header.load(Ordering::Relaxed);
                    if (before & !LOCKED) == (after & !LOCKED) {
                        return (before & !LOCKED, word);
                    }
                }
                std::hint::spin_loop();
            }
        }

        fn lock(&self) -> u32 {
            loop {
                let current = self.header.load(Ordering::Relaxed);
                if current & LOCKED == 0
                    && self
                        .header
                        .compare_exchange_weak(
                            current,
                            current | LOCKED,
                            Ordering::Acquire,
                            Ordering::Relaxed,
                        )
                        .is_ok()
                {
                    return current;
                }
                std::hint::spin_loop();
            }
        }
    }

    pub(crate) struct Entry {
        layer: u32,
        key: u64,
        cells: Cells,
    }

    /// Two keyed layers (`user`, `ip`) and a global one, each one token bucket.
    pub(crate) struct TypedStack<U, I> {
        clock: DefaultClock,
        table: ShardedTable<Entry>,
        global: Cells,
        user: U,
        ip: I,
        limit: Gcra,
    }

    impl<U: Fn(&Request) -> u64, I: Fn(&Request) -> u64> TypedStack<U, I> {
        /// The sketch with the entries of `keys` (layer, key) already in the table.
        pub(crate) fn new(user: U, ip: I, limit: Gcra, keys: &[(u32, u64)]) -> Self {
            let table = ShardedTable::with_hasher(Default::default());
            for &(layer, key) in keys {
                let hash = table.hash_one((layer, &key));
                table.write(table.shard_index(hash)).insert(
                    hash,
                    Entry {
                        layer,
                        key,
                        cells: Cells::default(),
                    },
                    |_| false,
                    |e: &Entry| table.hash_one((e.layer, &e.key)),
                );
            }
            Self {
                clock: DefaultClock::new(),
                table,
                global: Cells::default(),
                user,
                ip,
                limit,
            }
        }

        /// One unit for `request` on every layer, all or nothing; `None` if a key is absent,
        /// an entry changed under the call, or the limit cannot decide.
        pub(crate) fn check(&self, request: &Request) -> Option<[Decision; 3]> {
            let now = self.clock.now();
            let (user, ip) = ((self.user)(request), (self.ip)(request));
            let hashes = [
                self.table.hash_one((0_u32, &user)),
                self.table.hash_one((1_u32, &ip)),
            ];
            let shards = hashes.map(|h| self.table.shard_index(h));
            let low = self.table.read(shards[0].min(shards[1]));
            let high = (shards[0] != shards[1]).then(|| self.table.read(shards[0].max(shards[1])));
            let guard = |shard: usize| match &high {
                Some(high) if shard != shards[0].min(shards[1]) => high,
                _ => &low,
            };
            let found = |layer: u32, key: u64| {
                guard(shards[layer as usize])
                    .find(hashes[layer as usize], |e| e.layer == layer && e.key == key)
                    .map(|e| &e.cells)
            };
            let cells = [found(0, user)?, found(1, ip)?, &self.global];
            let mut answers = [Decision::allow(0, 0, 0); 3];
            let mut seen = [(0, 0); 3];
            let mut next = [0; 3];
            for (i, cell) in cells.iter().enumerate() {
                seen[i] = cell.read();
                let step = self.limit.decide(seen[i].1, 1, now).ok()?;
                answers[i] = step.decision;
                next[i] = step.next.unwrap_or(seen[i].1);
            }
            if answers.iter().all(Decision::is_allowed) {
                let mut order = [0, 1, 2];
                order.sort_unstable_by_key(|&i| std::ptr::from_ref(cells[i]) as usize);
                let mut held = [0; 3];
                for i in order {
                    held[i] = cells[i].lock();
                }
                let unchanged = (0..3).all(|i| {
                    held[i] == seen[i].0 && cells[i].word.load(Ordering::Relaxed) == seen[i].1
                });
                for i in 0..3 {
                    if unchanged {
                        cells[i].word.store(next[i], Ordering::Release);
                    }
                    cells[i].header.store(held[i], Ordering::Release);
                }
                if !unchanged {
                    return None;
                }
            }
            Some(answers)
        }
    }
}

fn stacks(c: &mut Criterion) {
    // Warm, not merely admitting: with an always-full limit, rotating keys would be dropped
    // as full and inserted again on every visit.
    let allow = token_bucket_warm();
    let requests = requests();
    let mut g = group(c, "stack", 1);

    let single = KeyedLimiter::<Gcra, u64>::new(allow).expect("valid");
    g.bench_function("one_check", |b| {
        rotating(b, &requests, |r| {
            single.check_key(&r.user).expect("valid").is_allowed()
        })
    });
    // Per user a per-second and a per-minute limit (two layers on one key: one entry) and a
    // global cap: the stack users compose most.
    let per_user = user(allow);
    let per_user_minute = per_user
        .same_key("user_minute")
        .limit(Kind::TokenBucket, allow);
    // The same check with its whole answer read (what a stack builds for every layer): the
    // target's subject reads only the admission, and an inlined check computes only that.
    g.bench_function("one_check_answer", |b| {
        rotating(b, &requests, |r| {
            black_box(single.check_key(&r.user).expect("valid")).is_allowed()
        })
    });
    // Per user a plan chosen per call (by the user's parity: two tiers of one limit each) and
    // a global cap: a stack with a plan function, as limiterd's policies all are.
    let tiers = Layer::keyed("user", |r: &Request| Some(r.user)).plans(
        [
            Plan::new("free").limit(Kind::TokenBucket, allow),
            Plan::new("pro").limit(Kind::TokenBucket, allow),
        ],
        |r: &Request| usize::from(r.user % 2 == 1),
    );
    let cases: [(&str, Requests); 6] = [
        ("stack_1", build(vec![user(allow)])),
        (
            "stack_3_one_key",
            build(vec![per_user, per_user_minute, global(allow)]),
        ),
        ("stack_2", build(vec![user(allow), global(allow)])),
        (
            "stack_3",
            build(vec![user(allow), ip(allow), global(allow)]),
        ),
        (
            // Two limits on the user's key (one lookup) and a global cap.
            "stack_3_limits_2_keys",
            build(vec![
                user(allow).limit(Kind::TokenBucket, allow),
                global(allow),
            ]),
        ),
        ("stack_2_tiers", build(vec![tiers, global(allow)])),
    ];
    for (name, stack) in &cases {
        g.bench_function(*name, |b| {
            rotating(b, &requests, |r| {
                stack.check(r).expect("valid").is_allowed()
            })
        });
    }
    // Every call a user never seen (with `stack_2`'s layers, the user's limit always full again
    // at once, so the table keeps sweeping): each is its key's first call, which builds and
    // inserts the key's entry. Against `stack_2`, what a new identifier costs.
    let first_calls = build(vec![user(Limit::per_second(1_000_000_000)), global(allow)]);
    let mut new_user = 1_u64 << 40;
    g.bench_function("stack_2_first_calls", |b| {
        b.iter(|| {
            new_user += 1;
            let request = Request {
                user: new_user,
                ip: 0,
            };
            first_calls
                .check(black_box(&request))
                .expect("valid")
                .is_allowed()
        })
    });
    // A permit per user beside the user's rate layer (taken and released by each call), beside
    // `stack_2`: a second rate layer.
    let permitted = limiter_concurrency::PermitStack::new(
        build(vec![user(allow)]),
        1_000_000,
        |r: &Request| Some(r.user),
    )
    .expect("valid");
    g.bench_function("stack_1_and_permit", |b| {
        rotating(b, &requests, |r| {
            matches!(
                permitted.check(r).expect("valid"),
                limiter_concurrency::Admission::Admitted { .. }
            )
        })
    });
    // The global layer admits each pair once, so every key is in the table, then denies for
    // the rest of the run (its next unit comes back after 56 s, longer than this subject runs).
    let once_each = Limit::per_hour(PAIRS as u64);
    let denied = build(vec![user(allow), ip(allow), global(once_each)]);
    for request in &requests {
        assert!(denied.check(request).expect("valid").is_allowed());
    }
    g.bench_function("stack_3_denied", |b| {
        rotating(b, &requests, |r| {
            denied.check(r).expect("valid").is_denied()
        })
    });

    let floor = StackFloor::new(&requests);
    g.bench_function("floor", |b| {
        rotating(b, &requests, |r| floor.check(r.user, r.ip))
    });
    let gcra = Gcra::new(allow).expect("valid");
    g.bench_function("floor_deciding", |b| {
        rotating(b, &requests, |r| {
            floor_deciding(&floor, &gcra, r.user, r.ip)
                .is_some_and(|d| black_box(d).iter().all(Decision::is_allowed))
        })
    });
    let keys: Vec<(u32, u64)> = requests
        .iter()
        .flat_map(|r| [(0, r.user), (1, r.ip)])
        .collect();
    let typed = typed::TypedStack::new(
        |r: &Request| r.user,
        |r: &Request| r.ip,
        Gcra::new(allow).expect("valid"),
        &keys,
    );
    g.bench_function("typed_sketch", |b| {
        rotating(b, &requests, |r| {
            typed
                .check(r)
                .is_some_and(|d| black_box(d).iter().all(Decision::is_allowed))
        })
    });
    // What the floors are made of, alone: a transaction's cost is mostly these, and the
    // processor runs no other work beside a locked instruction.
    let clock = DefaultClock::new();
    g.bench_function("clock", |b| b.iter(|| black_box(&clock).now()));
    let word = AtomicU64::new(0);
    g.bench_function("cas", |b| {
        b.iter(|| {
            let current = word.load(Ordering::Relaxed);
            word.compare_exchange(current, current + 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        })
    });
    let shard = RwLock::new(0_u64);
    g.bench_function("read_lock", |b| {
        b.iter(|| black_box(&shard).read().map(|held| *held).unwrap_or(0))
    });
    let users = KeyedLimiter::<Gcra, u64>::new(allow).expect("valid");
    let ips = KeyedLimiter::<Gcra, u64>::new(allow).expect("valid");
    let everyone = DirectLimiter::<Gcra>::new(allow).expect("valid");
    g.bench_function("ours_3_in_sequence", |b| {
        rotating(b, &requests, |r| {
            users.check_key(&r.user).expect("valid").is_allowed()
                && ips.check_key(&r.ip).expect("valid").is_allowed()
                && everyone.check().expect("valid").is_allowed()
        })
    });

    let per_user = RateLimiter::keyed(warm_quota());
    let per_ip = RateLimiter::keyed(warm_quota());
    let all = RateLimiter::direct(warm_quota());
    g.bench_function("governor_1", |b| {
        rotating(b, &requests, |r| per_user.check_key(&r.user).is_ok())
    });
    g.bench_function("governor_3_in_sequence", |b| {
        rotating(b, &requests, |r| {
            per_user.check_key(&r.user).is_ok()
                && per_ip.check_key(&r.ip).is_ok()
                && all.check().is_ok()
        })
    });
    g.finish();
}

criterion_group!(benches, stacks);
criterion_main!(benches);
