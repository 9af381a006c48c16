//! Real threads on a few keys: each holds a permit while it counts itself in flight, so a key
//! ever holding more than `count` shows as more than `count` in flight at once.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

use limiter_concurrency::KeyedConcurrency;

const THREADS: u64 = 8;
const ROUNDS: u64 = 20_000;
const KEYS: u64 = 3;
const COUNT: u64 = 2;

#[test]
fn threads_racing_on_a_few_keys_never_hold_more_than_the_count() {
    let limiter = Arc::new(KeyedConcurrency::<u64>::new(COUNT).unwrap());
    let in_flight: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let most: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
    let admitted = Arc::new(AtomicU64::new(0));
    let workers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (limiter, in_flight, most, admitted) = (
                Arc::clone(&limiter),
                Arc::clone(&in_flight),
                Arc::clone(&most),
                Arc::clone(&admitted),
            );
            thread::spawn(move || {
                for round in 0..ROUNDS {
                    let key = (t + round) % KEYS;
                    let Ok(permit) = limiter.try_acquire(&key) else {
                        continue;
                    };
                    admitted.fetch_add(1, Ordering::Relaxed);
                    // SeqCst: the counter must order with the permit's own compare-and-swap
                    // so a breach shows; statistics would not need it.
                    let now = in_flight[key as usize].fetch_add(1, Ordering::SeqCst) + 1;
                    most[key as usize].fetch_max(now, Ordering::SeqCst);
                    std::hint::spin_loop();
                    in_flight[key as usize].fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    for key in 0..KEYS {
        let most = most[key as usize].load(Ordering::SeqCst);
        assert!(
            most <= COUNT,
            "key {key} had {most} in flight, over {COUNT}"
        );
        assert_eq!(limiter.held(&key), 0, "every permit released");
    }
    assert!(admitted.load(Ordering::Relaxed) > 0);
    limiter.reclaim();
    assert!(limiter.is_empty());
}
