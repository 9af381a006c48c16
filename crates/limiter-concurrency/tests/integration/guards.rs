//! Permits as guards: an owned permit moved to another thread is released there when dropped,
//! and a key holding none is forgotten.

use std::sync::Arc;

use limiter_concurrency::KeyedConcurrency;

#[test]
fn an_owned_permit_outlives_the_borrow_and_is_released_where_it_is_dropped() {
    let limiter = Arc::new(KeyedConcurrency::<String>::new(3).unwrap());
    let owned = limiter.try_acquire_owned("ann", 2).unwrap();
    assert_eq!(limiter.held("ann"), 2);
    let units = std::thread::spawn(move || owned.units()).join().unwrap();
    assert_eq!(units, 2); // dropped on the thread: released there
    assert_eq!(limiter.held("ann"), 0);
    limiter.reclaim();
    assert!(limiter.is_empty(), "a key holding none is forgotten");
}

#[test]
fn a_permit_dropped_by_a_panic_is_released() {
    let limiter = Arc::new(KeyedConcurrency::<u32>::new(1).unwrap());
    let inside = Arc::clone(&limiter);
    let panicked = std::thread::spawn(move || {
        let _permit = inside.try_acquire_owned(&9, 1).unwrap();
        panic!("the work failed while holding its permit");
    })
    .join();
    assert!(panicked.is_err());
    assert_eq!(limiter.held(&9), 0, "unwinding released the permit");
    assert!(limiter.try_acquire(&9).is_ok());
}
