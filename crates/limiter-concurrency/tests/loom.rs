//! Loom models of the permit protocol: acquires racing for the last permit, a release racing an
//! acquire, and a release to none racing the store's reclamation and a new acquire. Run with
//! `cargo xtask loom`.
#![cfg(limiter_loom)]

use limiter_concurrency::KeyedConcurrency;
use limiter_store::{DefaultHasher, ShardedStore};
// The limiter is shared by a std `Arc`: the atomics under test are the store's (loom's under
// `limiter_loom`); the handle's count is not part of the protocol.
use std::sync::Arc;

use loom::thread;

fn limiter(count: u64) -> Arc<KeyedConcurrency<u64>> {
    let store = ShardedStore::with_shards_and_hasher(1, DefaultHasher::default());
    Arc::new(KeyedConcurrency::with_store(count, store).unwrap())
}

#[test]
fn two_acquires_racing_for_the_last_permit_take_it_once() {
    loom::model(|| {
        let permits = limiter(2);
        let first = permits.try_acquire_owned(&7, 1).unwrap();
        let other = Arc::clone(&permits);
        let racer = thread::spawn(move || other.try_acquire_owned(&7, 1).ok());
        let here = permits.try_acquire_owned(&7, 1).ok();
        let there = racer.join().unwrap();
        assert!(
            here.is_some() ^ there.is_some(),
            "the last permit went to both or neither"
        );
        assert_eq!(permits.held(&7), 2);
        drop((first, here, there));
        assert_eq!(permits.held(&7), 0);
    });
}

#[test]
fn a_release_racing_an_acquire_never_lets_both_hold_past_the_count() {
    loom::model(|| {
        let permits = limiter(1);
        let held = permits.try_acquire_owned(&7, 1).unwrap();
        let releaser = thread::spawn(move || drop(held));
        let acquired = permits.try_acquire_owned(&7, 1).ok();
        releaser.join().unwrap();
        // Admitted only after the release: the key holds at most the one it admitted.
        assert_eq!(permits.held(&7), u64::from(acquired.is_some()));
        drop(acquired);
        assert_eq!(permits.held(&7), 0);
    });
}

#[test]
fn a_release_to_none_racing_reclamation_loses_no_new_permit() {
    loom::model(|| {
        let permits = limiter(1);
        let held = permits.try_acquire_owned(&7, 1).unwrap();
        drop(held); // the key holds none: reclaimable
        let other = Arc::clone(&permits);
        let acquirer = thread::spawn(move || other.try_acquire_owned(&7, 1).ok());
        permits.reclaim();
        let acquired = acquirer.join().unwrap().expect("a key holding none admits");
        // Whichever came first, the permit just taken is still counted.
        assert_eq!(permits.held(&7), 1, "the new permit was lost");
        assert!(permits.try_acquire(&7).is_err());
        drop(acquired);
        assert_eq!(permits.held(&7), 0);
    });
}
