//! The Lua script against the Rust algorithms: on the same state, time and cost, every decision
//! and every state written must be identical, for proptest-generated limits and sequences of
//! checks and records of usage (records past the limit leave a debt, up to the cap).
//!
//! Each sequence starts from a state the test writes (fresh, or an arbitrary valid one) and
//! steps the clock forward (and sometimes back) between calls of random cost. Redis decides at
//! the injected time; the Rust algorithm is built on [`RedisLimit::in_micros`].

use limiter_testkit::redis_server as common;

use limiter_core::{Decision, Limit, ManualClock};
use limiter_redis::{Kind, OnFailure, Origin, RedisBackend, RedisLimit, RedisLimiter};
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
    /// Record this cost of usage (never refused; it may leave a debt).
    Record(u64),
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
    let record = prop_oneof![
        2 => Just(1_u64),
        2 => 0..=burst.saturating_mul(3),
        1 => Just(u64::MAX),
    ]
    .prop_map(Op::Record);
    prop::collection::vec(prop_oneof![3 => step, 3 => call, 1 => record], 1..60)
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

    fn record(&self, state: u64, cost: u64, now_us: u64) -> (Decision, Option<u64>) {
        let step = self.0.record(state, cost, now_us).unwrap();
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
            Op::Call(cost) | Op::Record(cost) => {
                shared.clock.set(now * 1_000);
                let recorded = matches!(op, Op::Record(_));
                let got = shared
                    .runtime
                    .block_on(async {
                        if recorded {
                            limiter.record(&key, cost).await
                        } else {
                            limiter.check_n(&key, cost).await
                        }
                    })
                    .unwrap();
                if !spec.decidable_at(state, now) {
                    // The clock went back so far that the debt passes what the script counts:
                    // it refuses, naming the key and the clock, the failure policy (closed
                    // here) answers, and nothing is written on either side.
                    let why = got.backend_error().map(ToString::to_string);
                    prop_assert!(got.failed_closed(), "{:?}", got);
                    prop_assert!(
                        why.as_deref().is_some_and(
                            |w| w.contains(&redis_key) && w.contains("clock is behind")
                        ),
                        "{:?}",
                        why
                    );
                    continue;
                }
                let (want, next) = if recorded {
                    rust.record(state, cost, now)
                } else {
                    rust.decide(state, cost, now)
                };
                prop_assert_eq!(got.origin(), Some(Origin::Remote), "{:?}", got);
                let got = got.layers().iter().next().unwrap().decision;
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
                // The state seeded before any call is the twin's word itself (the format of
                // earlier versions, which the script reads); the script's writes are its own
                // format, naming the limit that wrote them: each is the twin's word.
                let stored = common::stored_state(&mut conn, &redis_key).unwrap_or_default();
                prop_assert_eq!(
                    spec.twin_state(&stored),
                    Some(state),
                    "state after cost {} at {}: {:?}",
                    cost,
                    now,
                    stored
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

/// A deep bucket recorded to its debt cap, then Redis's clock going back: the debt passes
/// 2^52 ticks, so the script refuses by name (the failure policy answers) rather than count
/// inexactly, and decides exactly as the Rust algorithm again once the clock has caught up.
/// (Proptest found it: the script's refusal was taken for a divergence.)
#[test]
fn a_clock_gone_back_past_what_the_script_counts_is_refused_until_it_catches_up() {
    let limit = (Kind::TokenBucket, 1_000_000, 17_082_420_800_139, 1_000_000);
    let spec = RedisLimit::new(
        limit.0,
        Limit::from_nanos(limit.1, limit.2 * 1_000).with_burst(limit.3),
    )
    .expect("in range");
    let start = 1_780_674_765_690_577;
    // After the record the debt is at its cap, twice the depth: 4,373,099,726,000,000 ticks of
    // 1/128 us, 130,499,901,370,496 ticks (11.8 days) below 2^52. A clock read that much
    // earlier owes 2^52 exactly: refused; one read a microsecond later is decided.
    let recorded = Rust::new(&spec)
        .record(0, u64::MAX, start)
        .1
        .expect("written");
    let edge: u64 = 1_019_530_479_457;
    assert!(spec.decidable_at(recorded, start));
    assert!(spec.decidable_at(recorded, start - (edge - 1)));
    assert!(!spec.decidable_at(recorded, start - edge));
    let step = |us: u64| i64::try_from(us).expect("fits");
    let ops = vec![
        Op::Record(u64::MAX),
        Op::Step(-step(edge - 1)),
        Op::Call(1),
        Op::Step(-1),
        Op::Call(1),
        Op::Record(3),
        Op::Call(0),
        Op::Step(step(edge + 1)),
        Op::Call(1),
        Op::Record(1),
    ];
    let seed = 1_593_101_638_813_079_604;
    run_case(&Shared::start(), limit, start, seed, ops, 1).unwrap();
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

/// What the limiter answered, in the Rust twin's units (nanoseconds read back as microseconds,
/// rounded down as the script's answers are whole microseconds).
fn decision_of(
    shared: &Shared,
    limiter: &RedisLimiter,
    key: &str,
    cost: u64,
) -> Result<Decision, TestCaseError> {
    let got = shared.runtime.block_on(limiter.check_n(key, cost)).unwrap();
    prop_assert_eq!(got.origin(), Some(Origin::Remote), "{:?}", got);
    Ok(got.layers().iter().next().unwrap().decision)
}

/// One key named by callers under several limits (a caller changes the limit it sends): each
/// call under a limit other than the one that wrote the key rescales it first, exactly as the
/// Rust algorithms' `usage` and `with_usage` do, so the budget carries over as the same
/// fraction (rounded up) and changing the limit never resets it.
#[test]
fn a_changed_limit_rescales_the_state_as_in_rust() {
    let shared = Shared::start();
    let case = std::cell::Cell::new(0);
    let config = ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let calls = prop::collection::vec(
        (
            0_usize..3,
            prop_oneof![3 => Just(1_u64), 1 => 0_u64..40],
            0_u64..2_000_000,
            prop::bool::weighted(0.2),
        ),
        1..50,
    );
    proptest!(config, |(
        specs in prop::collection::vec(limits(), 3),
        calls in calls,
        start in prop_oneof![0_u64..10_000_000, 1_700_000_000_000_000_u64..1_800_000_000_000_000],
    )| {
        case.set(case.get() + 1);
        let key = format!("rescale-{}", case.get());
        let mut limiters = Vec::new();
        for &(kind, count, period_us, burst) in &specs {
            let limit = Limit::from_nanos(count, period_us * 1_000).with_burst(burst);
            let spec = RedisLimit::new(kind, limit).unwrap();
            // One name and one layer: every limiter names the same Redis key.
            let limiter = RedisLimiter::builder(&shared.backend, "rescale")
                .limit(kind, limit)
                .on_failure(OnFailure::Closed)
                .build()
                .unwrap();
            limiters.push((spec, limiter));
        }
        let redis_key = limiters[0].1.redis_keys(&key).remove(0);
        prop_assert!(limiters.iter().all(|(_, l)| l.redis_keys(&key)[0] == redis_key));
        let mut conn = shared.server.client();
        // The model: the word and the limit that wrote it (none yet).
        let mut state = 0_u64;
        let mut writer: Option<usize> = None;
        let mut now = start;
        for (which, cost, step, recorded) in calls {
            now += step;
            shared.clock.set(now * 1_000);
            let (spec, limiter) = &limiters[which];
            let current = match writer {
                Some(w) if limiters[w].0.script_fields() != spec.script_fields() => {
                    spec.rescale(&limiters[w].0, state, now).unwrap()
                }
                _ => state,
            };
            let (step, got) = if recorded {
                // A record past the limit leaves a debt, which a changed limit carries over.
                let got = shared.runtime.block_on(limiter.record(&key, cost)).unwrap();
                prop_assert_eq!(got.origin(), Some(Origin::Remote), "{:?}", got);
                let got = got.layers().iter().next().unwrap().decision;
                (spec.record(current, cost, now).unwrap(), got)
            } else {
                let cost = cost.min(spec.burst());
                let got = decision_of(&shared, limiter, &key, cost)?;
                (spec.decide(current, cost, now).unwrap(), got)
            };
            let want = common::micros_as_nanos(step.decision);
            prop_assert_eq!(
                (got.is_allowed(), got.limit(), got.remaining()),
                (want.is_allowed(), want.limit(), want.remaining()),
                "{} (was {:?}) at {} us, cost {} (record: {})",
                spec.limit(),
                writer.map(|w| limiters[w].0.limit()),
                now,
                cost,
                recorded
            );
            if let Some(next) = step.next {
                state = next;
                writer = Some(which);
            }
            let stored = common::stored_state(&mut conn, &redis_key);
            match writer {
                // Written by the limit that last wrote, as the twin's word.
                Some(w) => prop_assert_eq!(
                    stored.as_deref().and_then(|raw| limiters[w].0.twin_state(raw)),
                    Some(state)
                ),
                None => prop_assert_eq!(stored, None),
            }
        }
    });
}

/// The example: a key with 5 of 10 taken keeps half its budget when the caller raises
/// the limit to 20 (10 left, not 20), and a fresh-looking limit never resets it.
#[test]
fn raising_a_limit_keeps_the_consumption() {
    let shared = Shared::start();
    shared.clock.set(1_000_000_000);
    let build = |count: u64| {
        RedisLimiter::builder(&shared.backend, "raise")
            .limit(Kind::FixedWindow, Limit::per_minute(count))
            .on_failure(OnFailure::Closed)
            .build()
            .unwrap()
    };
    let (ten, twenty) = (build(10), build(20));
    for _ in 0..5 {
        assert!(
            shared
                .runtime
                .block_on(ten.check("u"))
                .unwrap()
                .is_allowed()
        );
    }
    let raised = shared.runtime.block_on(twenty.check_n("u", 0)).unwrap();
    let raised = raised.layers().iter().next().unwrap().decision;
    assert_eq!((raised.limit(), raised.remaining()), (20, 10));
    // Back to 10: still 5 taken, and the 11th unit under 20 is counted too.
    assert!(
        shared
            .runtime
            .block_on(twenty.check("u"))
            .unwrap()
            .is_allowed()
    );
    let back = shared.runtime.block_on(ten.check_n("u", 0)).unwrap();
    let back = back.layers().iter().next().unwrap().decision;
    assert_eq!(
        (back.limit(), back.remaining()),
        (10, 4),
        "11 of 20 is 6 of 10, rounded up"
    );
}
