//! Loom models of the stores' protocols: first inserts racing on one key, reclamation racing a
//! write (the sharded store's locks), and the retirement that lets the bounded store remove a
//! cell callers may still hold. Run with `cargo xtask loom`.
#![cfg(limiter_loom)]

use limiter_core::{Algorithm, Limit, ManualClock, StateCell};
use limiter_store::{DefaultHasher, KeyedLimiter, ShardedStore};
use limiter_token_bucket::Gcra;
use loom::sync::Arc;
use loom::thread;

type Keyed = KeyedLimiter<Gcra, u64, ManualClock, ShardedStore<u64>>;

/// One unit per second, burst 1: full again one second after each admission.
fn one_per_second() -> Limit {
    Limit::per_second(1)
}

fn keyed(clock: &ManualClock) -> Arc<Keyed> {
    let store = ShardedStore::with_shards_and_hasher(1, DefaultHasher::default());
    Arc::new(KeyedLimiter::with_store(one_per_second(), clock.clone(), store).unwrap())
}

#[test]
fn first_inserts_racing_on_one_key_admit_exactly_once() {
    loom::model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(&clock);
        let other = Arc::clone(&limiter);
        let racer = thread::spawn(move || other.check_key(&7).unwrap().is_allowed());
        let here = limiter.check_key(&7).unwrap().is_allowed();
        let there = racer.join().unwrap();
        assert!(here ^ there, "admitted {here} and {there}");
        assert_eq!(limiter.len(), 1);
    });
}

#[test]
fn reclaiming_a_full_key_never_loses_a_racing_write() {
    loom::model(|| {
        let clock = ManualClock::new();
        let limiter = keyed(&clock);
        assert!(limiter.check_key(&7).unwrap().is_allowed());
        clock.advance_nanos(1_000_000_000); // key 7 is full again
        let other = Arc::clone(&limiter);
        let writer = thread::spawn(move || other.check_key(&7).unwrap().is_allowed());
        limiter.reclaim_full();
        assert!(writer.join().unwrap(), "a full key denied its unit");
        // Whichever came first, the unit just taken is still taken.
        assert!(
            limiter.check_key(&7).unwrap().is_denied(),
            "the write was lost"
        );
    });
}

#[test]
fn a_write_and_a_retirement_never_both_succeed() {
    loom::model(|| {
        let gcra = Gcra::new(one_per_second()).unwrap();
        let now = 1_000_000_000;
        let cell = Arc::new(StateCell::new(Gcra::FRESH));
        let writer_cell = Arc::clone(&cell);
        let writer = thread::spawn(move || {
            let gcra = Gcra::new(one_per_second()).unwrap();
            writer_cell.apply_live(&gcra, 1, now).unwrap()
        });
        let retired = cell.retire_if_full(&gcra, now);
        let written = writer.join().unwrap();
        match (written, retired) {
            (Some(decision), false) => {
                assert!(decision.is_allowed());
                assert!(!gcra.is_full(cell.load(), now));
            }
            (None, true) => assert!(cell.is_retired()),
            other => panic!("write and retirement: {other:?}"),
        }
    });
}
