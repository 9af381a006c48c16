//! The Lua script against the Rust algorithms: on the same state, time and cost, every decision
//! and every state written must be identical, for proptest-generated limits and sequences.
//!
//! Each sequence starts from a state the test writes (fresh, or an arbitrary valid one) and
//! steps the clock forward (and sometimes back) between calls of random cost. Redis decides at
//! the injected time; the Rust algorithm is built on [`RedisLimit::in_micros`].

use limiter_testkit::redis_server as common;

use limiter_core::{Decision, Limit, ManualClock};
use limiter_redis::{Kind, OnFailure, RedisBackend, RedisLimit, RedisLimiter, Source};
use proptest::prelude::*;
use redis::Commands;

struct Shared {
    server: common::RedisServer,
    runtime: tokio::runtime::Runtime,
    clock: ManualClock,
    backend: RedisBackend,
}

impl Shared {
    fn start() -> Self {
        let server = common::RedisServer::start();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let clock = ManualClock::new();
        let backend = runtime.block_on(async {
            RedisBackend::builder(server.url())
                .time_from(clock.clone())
                .timeout(std::time::Duration::from_secs(5))
                // Injected time does not move with Redis's own: keep keys until the test is done.
                .expiry_slack(std::time::Duration::from_secs(3_600))
                .deny_cache(0)
                .connect()
                .await
                .unwrap()
        });
        Shared {
            server,
            runtime,
            clock,
            backend,
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    /// Move the clock by this many microseconds (negative: backwards).
    Step(i64),
    /// Decide this cost (0 peeks).
    Call(u64),
}

fn limits() -> impl Strategy<Value = (Kind, u64, u64, u64)> {
    let kind = prop_oneof![
        Just(Kind::TokenBucket),
        Just(Kind::SlidingWindow),
        Just(Kind::FixedWindow)
    ];
    let period_us = prop_oneof![
        Just(1_000_000_u64),
        Just(60_000_000),
        Just(3_600_000_000),
        Just(7),
        Just(999_983),
        1_u64..20_000_000,
    ];
    (kind, 1_u64..2_000, period_us, 0_u64..3).prop_map(|(kind, count, period_us, burst_scale)| {
        let count = count.min(period_us.max(1));
        let burst = if kind == Kind::TokenBucket {
            (count * burst_scale / 2).max(1)
        } else {
            count
        };
        (kind, count, period_us, burst)
    })
}

fn ops(period_us: u64, burst: u64) -> impl Strategy<Value = Vec<Op>> {
    let step = prop_oneof![
        4 => 0..=(period_us as i64 / 3).max(1),
        2 => 0..=(period_us as i64 * 3),
        1 => -(period_us as i64 / 2).max(1)..0,
    ]
    .prop_map(Op::Step);
    let call = prop_oneof![3 => Just(1_u64), 2 => 0..=burst].prop_map(Op::Call);
    prop::collection::vec(prop_oneof![step, call], 1..60)
}

/// The Rust side: the script's twin, the algorithm built on the limit in microseconds.
struct Rust(RedisLimit);

impl Rust {
    fn new(spec: &RedisLimit) -> Self {
        Rust(spec.clone())
    }

    fn decide(&self, state: u64, cost: u64, now_us: u64) -> (Decision, Option<u64>) {
        let step = self.0.decide(state, cost, now_us).unwrap();
        (step.decision, step.next)
    }
}

/// A valid state the algorithm could have written near `now_us`, from `seed`.
fn state_near(spec: &RedisLimit, rust: &Rust, now_us: u64, seed: u64) -> u64 {
    // Run a few calls of the algorithm itself from fresh, at times before `now_us`.
    let mut state = 0;
    let period = spec.in_micros().period_nanos();
    let mut at = now_us.saturating_sub(period.saturating_mul(2));
    let mut s = seed;
    for _ in 0..(seed % 7) {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        at = at.saturating_add((s >> 33) % (period / 2 + 1));
        let cost = (s >> 20) % (spec.burst() + 1);
        if let (_, Some(next)) = rust.decide(state, cost, at.min(now_us)) {
            state = next;
        }
    }
    state
}

fn run_case(
    shared: &Shared,
    (kind, count, period_us, burst): (Kind, u64, u64, u64),
    start_us: u64,
    seed: u64,
    ops: Vec<Op>,
    case: u64,
) -> Result<(), TestCaseError> {
    let limit = Limit::from_nanos(count, period_us * 1_000).with_burst(burst);
    let spec = RedisLimit::new(kind, limit).expect("every limit in range is accepted");
    let rust = Rust::new(&spec);
    let limiter = RedisLimiter::builder(&shared.backend, "diff")
        .limit(kind, limit)
        .on_failure(OnFailure::Closed)
        .build()
        .unwrap();
    let key = format!("case-{case}");
    let redis_key = limiter.redis_keys(&key).remove(0);
    let mut conn = shared.server.client();

    let mut now = start_us;
    let mut state = state_near(&spec, &rust, now, seed);
    let _: () = conn.set(&redis_key, state.to_string()).unwrap();
    for op in ops {
        match op {
            Op::Step(us) => now = now.saturating_add_signed(us).max(1),
            Op::Call(cost) => {
                shared.clock.set(now * 1_000);
                let (want, next) = rust.decide(state, cost, now);
                let got = shared
                    .runtime
                    .block_on(limiter.check_n(&key, cost))
                    .unwrap();
                prop_assert_eq!(got.source(), &Source::Redis, "{:?}", got);
                let got = got.stack().layers().next().unwrap().decision;
                // Microseconds to the nanoseconds a decision reports (saturating, as the
                // limiter does); waits past 2^53 us (285 years) are the script's doubles.
                let ns = |us: u64| us.min(1 << 53).saturating_mul(1_000);
                let scaled = if want.is_allowed() {
                    Decision::allow(want.limit(), want.remaining(), ns(want.reset_after_nanos()))
                } else {
                    Decision::deny(
                        want.limit(),
                        want.remaining(),
                        ns(want.retry_after_nanos()),
                        ns(want.reset_after_nanos()),
                    )
                };
                let got = if got.is_allowed() {
                    Decision::allow(
                        got.limit(),
                        got.remaining(),
                        got.reset_after_nanos().min(ns(1 << 53)),
                    )
                } else {
                    Decision::deny(
                        got.limit(),
                        got.remaining(),
                        got.retry_after_nanos().min(ns(1 << 53)),
                        got.reset_after_nanos().min(ns(1 << 53)),
                    )
                };
                prop_assert_eq!(
                    got,
                    scaled,
                    "{} {} at {} us, state {}, cost {}",
                    kind,
                    limit,
                    now,
                    state,
                    cost
                );
                if let Some(next) = next {
                    state = next;
                }
                let stored: Option<String> = conn.get(&redis_key).unwrap();
                prop_assert_eq!(
                    stored,
                    Some(state.to_string()),
                    "state after cost {} at {}",
                    cost,
                    now
                );
            }
        }
    }
    Ok(())
}

#[test]
fn lua_and_rust_decide_identically() {
    let shared = Shared::start();
    let case = std::cell::Cell::new(0);
    let config = ProptestConfig {
        cases: 384,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(
        (limit, ops) in limits().prop_flat_map(|l| (Just(l), ops(l.2, l.3))),
        start in prop_oneof![0_u64..10_000_000, 1_700_000_000_000_000_u64..1_800_000_000_000_000],
        seed in any::<u64>(),
    )| {
        case.set(case.get() + 1);
        run_case(&shared, limit, start, seed, ops, case.get())?;
    });
}

/// The u64 word crosses 2^53 (where doubles stop being exact) for a token bucket whose tick is
/// a seventh of a microsecond, at today's time: the script must still match exactly.
#[test]
fn words_above_two_to_the_53_match() {
    let now = 1_763_800_000_000_000; // Nov 2025 in us; now * 7 > 2^53
    let ops = (0..40)
        .map(|i| {
            if i % 3 == 0 {
                Op::Step(90_001)
            } else {
                Op::Call(1 + i % 4)
            }
        })
        .collect();
    run_case(
        &Shared::start(),
        (Kind::TokenBucket, 7, 1_000_000, 20),
        now,
        3,
        ops,
        0,
    )
    .unwrap();
    assert!(now * 7 > 1 << 53);
}

/// Limits over the whole supported range (counts and bursts to `u32::MAX`, periods from 1 us
/// to 366 days), at today's time: where the token bucket counts in coarse or fine ticks, where
/// the window counters round their previous count or wrap their window number, and where the
/// script's products of a count and a window pass 2^53.
#[test]
fn the_whole_range_of_limits_decides_identically() {
    let shared = Shared::start();
    let case = std::cell::Cell::new(10_000);
    let config = ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let max = u64::from(u32::MAX);
    let kind = prop_oneof![
        Just(Kind::TokenBucket),
        Just(Kind::SlidingWindow),
        Just(Kind::FixedWindow)
    ];
    let units = prop_oneof![
        1_u64..=max,
        Just(max),
        Just(1_000_000),
        Just(100_000_000),
        Just(1009)
    ];
    let period_us = prop_oneof![
        1_u64..=366 * 86_400_000_000,
        prop::sample::select(vec![
            1_u64,
            1_000,
            1_000_000,
            60_000_000,
            86_400_000_000,
            366 * 86_400_000_000
        ]),
    ];
    let limits = (kind, units.clone(), period_us, prop::option::of(units)).prop_map(
        |(kind, count, period_us, burst)| {
            let burst = match (kind, burst) {
                (Kind::TokenBucket, Some(burst)) => burst,
                _ => count,
            };
            (kind, count, period_us, burst)
        },
    );
    proptest!(config, |(
        (limit, ops) in limits.prop_flat_map(|l| (Just(l), ops(l.2.min(1 << 40), l.3))),
        start in 1_700_000_000_000_000_u64..1_800_000_000_000_000,
        seed in any::<u64>(),
    )| {
        case.set(case.get() + 1);
        run_case(&shared, limit, start, seed, ops, case.get())?;
    });
}
