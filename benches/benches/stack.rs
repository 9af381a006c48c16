//! Stacks of 1, 2 and 3 layers beside one single-layer check and beside governor checked three
//! times in sequence (no transaction), in the same group, so one run gives the ratios the
//! stack issue targets: three layers at most 2.0x one check; a denied stacked call writes
//! nothing.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::RateLimiter;
use limiter_benches::{allow_quota, group, never_limit, token_bucket_allow};
use limiter_core::Limit;
use limiter_stack::{Layer, Stack};
use limiter_store::KeyedLimiter;
use limiter_token_bucket::Gcra;

struct Request {
    user: u64,
    ip: u64,
}

type Requests = Stack<Request, u64>;

fn user(limit: Limit) -> Layer<Request, u64> {
    Layer::keyed("user", |r: &Request| Some(r.user))
        .limit::<Gcra>(limit)
        .expect("valid")
}

fn ip(limit: Limit) -> Layer<Request, u64> {
    Layer::keyed("ip", |r: &Request| Some(r.ip))
        .limit::<Gcra>(limit)
        .expect("valid")
}

fn global(limit: Limit) -> Layer<Request, u64> {
    Layer::global("global").limit::<Gcra>(limit).expect("valid")
}

fn build(layers: Vec<Layer<Request, u64>>) -> Requests {
    layers
        .into_iter()
        .fold(Stack::builder(), |b, l| b.layer(l))
        .build()
        .expect("valid")
}

fn stacks(c: &mut Criterion) {
    let allow = token_bucket_allow();
    let request = Request { user: 7, ip: 9 };
    let mut g = group(c, "stack", 1);

    let single = KeyedLimiter::<Gcra, u64>::new(allow).expect("valid");
    g.bench_function("one_check", |b| {
        b.iter(|| single.check_key(black_box(&7)).expect("valid").is_allowed())
    });
    let cases: [(&str, Requests); 4] = [
        ("stack_1", build(vec![user(allow)])),
        ("stack_2", build(vec![user(allow), global(allow)])),
        (
            "stack_3",
            build(vec![user(allow), ip(allow), global(allow)]),
        ),
        (
            // Two limits on the user's key (one lookup) and a global cap.
            "stack_3_limits_2_keys",
            build(vec![
                user(allow).limit::<Gcra>(allow).expect("valid"),
                global(allow),
            ]),
        ),
    ];
    for (name, stack) in &cases {
        g.bench_function(*name, |b| {
            b.iter(|| {
                stack
                    .check(black_box(&request))
                    .expect("valid")
                    .is_allowed()
            })
        });
    }
    let denied = build(vec![user(allow), ip(allow), global(never_limit())]);
    let _ = denied.check(&request);
    g.bench_function("stack_3_denied", |b| {
        b.iter(|| {
            denied
                .check(black_box(&request))
                .expect("valid")
                .is_denied()
        })
    });

    let per_user = RateLimiter::keyed(allow_quota());
    let per_ip = RateLimiter::keyed(allow_quota());
    let all = RateLimiter::direct(allow_quota());
    g.bench_function("governor_1", |b| {
        b.iter(|| per_user.check_key(black_box(&7u64)).is_ok())
    });
    g.bench_function("governor_3_in_sequence", |b| {
        b.iter(|| {
            per_user.check_key(black_box(&7u64)).is_ok()
                && per_ip.check_key(black_box(&9u64)).is_ok()
                && all.check().is_ok()
        })
    });
    g.finish();
}

criterion_group!(benches, stacks);
criterion_main!(benches);
