//! Keyed limiters: every algorithm beside governor's keyed limiter, with one hot key and with
//! 1M distinct warm keys.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use governor::RateLimiter;
use limiter_benches::{allow_quota, group, token_bucket_allow, window_allow};
use limiter_core::{Algorithm, Limit};
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_store::KeyedLimiter;
use limiter_token_bucket::Gcra;

const KEYS: u64 = 1_000_000;

/// Visits every key in an order the hardware prefetcher cannot follow.
fn scattered() -> impl FnMut() -> u64 {
    let mut key = 0u64;
    move || {
        key = (key + 611_953) % KEYS;
        key
    }
}

fn hot_and_warm<A: Algorithm>(c: &mut Criterion, name: &str, limit: Limit) {
    let limiter = KeyedLimiter::<A, u64>::new(limit).expect("valid");
    let mut g = group(c, "keyed_hot_key", 1);
    g.bench_function(name, |b| {
        b.iter(|| black_box(limiter.check_key(&7).expect("valid").is_allowed()))
    });
    g.finish();
    for key in 0..KEYS {
        let _ = limiter.check_key(&key);
    }
    let mut next = scattered();
    let mut g = group(c, "keyed_1M_keys_warm", 1);
    g.bench_function(name, |b| {
        b.iter(|| black_box(limiter.check_key(&next()).expect("valid").is_allowed()))
    });
    g.finish();
}

fn keyed(c: &mut Criterion) {
    hot_and_warm::<Gcra>(c, "token_bucket", token_bucket_allow());
    hot_and_warm::<SlidingCounter>(c, "sliding_window", window_allow());
    hot_and_warm::<FixedCounter>(c, "fixed_window", window_allow());

    let theirs = RateLimiter::dashmap(allow_quota());
    let mut g = group(c, "keyed_hot_key", 1);
    g.bench_function("governor", |b| {
        b.iter(|| black_box(theirs.check_key(&7u64).is_ok()))
    });
    g.finish();
    for key in 0..KEYS {
        let _ = theirs.check_key(&key);
    }
    let mut next = scattered();
    let mut g = group(c, "keyed_1M_keys_warm", 1);
    g.bench_function("governor", |b| {
        b.iter(|| black_box(theirs.check_key(&next()).is_ok()))
    });
    g.finish();
}

criterion_group!(benches, keyed);
criterion_main!(benches);
