//! Loom models of the lease word (`LeaseCell`): callers spending a lease race the renewer
//! closing it or topping it up ahead, and no unit is ever both spent and refunded, spent
//! twice, or spent beyond what was granted and kept.
//! Run with `cargo xtask loom` (`RUSTFLAGS="--cfg limiter_loom"`, release, 2 preemptions).
#![cfg(limiter_loom)]

use limiter_core::{LeaseCell, LeaseSpend};
use loom::sync::Arc;
use loom::thread;

const DEADLINE: u64 = 1 << 40;

fn spender(cell: &Arc<LeaseCell>, cost: u64) -> thread::JoinHandle<u64> {
    let cell = Arc::clone(cell);
    thread::spawn(move || match cell.spend(cost, 0) {
        LeaseSpend::Spent { .. } => cost,
        _ => 0,
    })
}

#[test]
fn spenders_and_a_closer_share_the_units_exactly() {
    loom::model(|| {
        let cell = Arc::new(LeaseCell::new());
        assert!(cell.grant(3, DEADLINE));
        let a = spender(&cell, 1);
        let b = spender(&cell, 2);
        let closer = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || LeaseCell::units_of(cell.close()))
        };
        let spent = a.join().unwrap() + b.join().unwrap();
        let handed_back = closer.join().unwrap();
        assert_eq!(spent + handed_back, 3, "every unit spent or refunded, once");
        assert_eq!(LeaseCell::units_of(cell.close()), 0);
    });
}

#[test]
fn two_spenders_never_take_more_than_the_lease() {
    loom::model(|| {
        let cell = Arc::new(LeaseCell::new());
        assert!(cell.grant(2, DEADLINE));
        let a = spender(&cell, 2);
        let b = spender(&cell, 1);
        let spent = a.join().unwrap() + b.join().unwrap();
        let left = LeaseCell::units_of(cell.close());
        assert!(spent <= 2);
        assert_eq!(spent + left, 2);
    });
}

#[test]
fn a_spender_takes_from_the_old_lease_or_the_new_never_from_both() {
    loom::model(|| {
        let cell = Arc::new(LeaseCell::new());
        assert!(cell.grant(1, DEADLINE));
        let a = spender(&cell, 1);
        let renewer = {
            let cell = Arc::clone(&cell);
            thread::spawn(move || {
                let old = LeaseCell::units_of(cell.close());
                assert!(cell.grant(2, DEADLINE));
                old
            })
        };
        let spent = a.join().unwrap();
        let old = renewer.join().unwrap();
        let left = LeaseCell::units_of(cell.close());
        // The old lease's one unit went to the spender or to the close; the new lease's two
        // are what is left, less the spender's unit if it came after the grant.
        assert_eq!(spent + old + left, 3);
    });
}

#[test]
fn a_top_up_ahead_adds_to_what_spenders_leave_never_to_what_they_took() {
    loom::model(|| {
        let cell = Arc::new(LeaseCell::new());
        assert!(cell.grant(2, DEADLINE));
        let a = spender(&cell, 1);
        let b = spender(&cell, 1);
        let renewer = {
            let cell = Arc::clone(&cell);
            // Keeps whatever is left of the 2 (the store counts both), adds 3.
            thread::spawn(move || assert!(cell.top_up(2, 3, DEADLINE, 0)))
        };
        let spent = a.join().unwrap() + b.join().unwrap();
        renewer.join().unwrap();
        let left = LeaseCell::units_of(cell.close());
        // Every unit of the 2 granted and the 3 added is spent once or left, whatever the order.
        assert_eq!(
            spent, 2,
            "two units were there for both spenders in every order"
        );
        assert_eq!(spent + left, 5);
    });
}

#[test]
fn a_top_up_keeping_less_never_lets_more_than_it_keeps_be_spent() {
    loom::model(|| {
        let cell = Arc::new(LeaseCell::new());
        assert!(cell.grant(2, DEADLINE));
        let a = spender(&cell, 2);
        let renewer = {
            let cell = Arc::clone(&cell);
            // The store counts 1 of the 2 as still held: at most that one survives, beside 1.
            thread::spawn(move || assert!(cell.top_up(1, 1, DEADLINE, 0)))
        };
        let spent = a.join().unwrap();
        renewer.join().unwrap();
        let left = LeaseCell::units_of(cell.close());
        // Spent before the top-up: 2, then only the 1 added is left; after it: the 2 kept
        // (1) and added (1) are there, and the spender of 2 takes both.
        assert!(
            (spent, left) == (2, 1) || (spent, left) == (2, 0),
            "{spent} {left}"
        );
    });
}
