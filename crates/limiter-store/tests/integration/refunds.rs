//! Refunds by key ([`KeyedLimiter::refund_key_at`]) on every store: the units a call was
//! granted come back to that key only, never more than were taken, none once they came back on
//! their own (a window that passed), and an absent key stays absent.

use std::time::Duration;

use limiter_core::{Clock, Limit, ManualClock};
use limiter_sliding_window::FixedCounter;
use limiter_store::{BoundedStore, KeyedLimiter, ShardedStore, Store};
use limiter_testkit::store::NeverForget;
use limiter_token_bucket::Gcra;

fn refunds_on<St: Store<String>>(store: St) {
    let clock = ManualClock::new();
    let keyed = KeyedLimiter::<FixedCounter, String, _, _>::with_store(
        Limit::per_minute(5),
        clock.clone(),
        store,
    )
    .unwrap();
    let granted_at = clock.now();
    assert_eq!(keyed.check_key_n("ann", 4).unwrap().remaining(), 1);
    assert_eq!(keyed.check_key_n("bob", 2).unwrap().remaining(), 3);
    // Three of ann's four come back to ann alone; her answer after is a peek.
    let after = keyed
        .refund_key_at("ann", 3, granted_at, clock.now())
        .unwrap();
    assert_eq!(after.remaining(), 4);
    assert_eq!(keyed.peek_key("ann").unwrap().remaining(), 4);
    assert_eq!(keyed.peek_key("bob").unwrap().remaining(), 3);
    // Never above full, whatever is asked.
    let after = keyed
        .refund_key_at("bob", 50, granted_at, clock.now())
        .unwrap();
    assert_eq!(after.remaining(), 5);
    // A key nobody took from is not inserted by a refund.
    let before = keyed.len();
    assert_eq!(
        keyed
            .refund_key_at("ghost", 2, granted_at, clock.now())
            .unwrap()
            .remaining(),
        5
    );
    assert_eq!(keyed.len(), before);
    // Units granted in a window that has passed came back with it: none twice.
    assert!(keyed.check_key_n("ann", 1).unwrap().is_allowed());
    clock.advance(Duration::from_secs(60));
    assert_eq!(keyed.check_key_n("ann", 5).unwrap().remaining(), 0);
    let after = keyed
        .refund_key_at("ann", 2, granted_at, clock.now())
        .unwrap();
    assert_eq!(
        after.remaining(),
        0,
        "the old window's units are not this one's"
    );
}

#[test]
fn refunds_return_what_was_taken_to_its_key_on_every_store() {
    refunds_on(ShardedStore::<String>::new());
    refunds_on(BoundedStore::<String>::new(1_000).unwrap());
    refunds_on(NeverForget::<String>::new());
}

#[test]
fn a_token_bucket_refund_returns_the_units_a_denial_needed() {
    let clock = ManualClock::new();
    let keyed =
        KeyedLimiter::<Gcra, String, _>::with_clock(Limit::per_minute(3), clock.clone()).unwrap();
    assert!(keyed.check_key_n("ann", 3).unwrap().is_allowed());
    assert!(keyed.check_key("ann").unwrap().is_denied());
    keyed
        .refund_key_at("ann", 1, clock.now(), clock.now())
        .unwrap();
    assert!(keyed.check_key("ann").unwrap().is_allowed());
    assert!(keyed.check_key("ann").unwrap().is_denied());
}
