//! Keys are looked up by borrowed forms (`&str` for `String`, as `HashMap::get` allows): on
//! every store a borrowed and an owned lookup of one key share one state, a denial or a peek by
//! a borrowed key inserts nothing, and a key is turned into an owned one only when inserted.

use std::sync::Arc;

use limiter_core::{Limit, ManualClock};
use limiter_store::{BoundedStore, KeyedLimiter, ShardedStore, Store};
use limiter_testkit::store::NeverForget;
use limiter_token_bucket::Gcra;

fn check_on<St: Store<String>>(store: St) {
    let keyed = KeyedLimiter::<Gcra, String, _, _>::with_store(
        Limit::per_minute(3),
        ManualClock::new(),
        store,
    )
    .unwrap();
    // A peek and a denial by a borrowed key insert nothing.
    assert_eq!(keyed.peek_key("ghost").unwrap().remaining(), 3);
    assert!(
        keyed.check_key_n("ghost", 4).is_err(),
        "cost above the burst"
    );
    assert_eq!(keyed.len(), 0);

    // Borrowed and owned lookups of one key share its state, whatever form wrote it first.
    assert_eq!(keyed.check_key("api-key-1").unwrap().remaining(), 2);
    assert_eq!(
        keyed
            .check_key(&"api-key-1".to_owned())
            .unwrap()
            .remaining(),
        1
    );
    let owned: &String = &"api-key-1".to_owned();
    assert_eq!(keyed.check_key(owned.as_str()).unwrap().remaining(), 0);
    assert!(keyed.check_key("api-key-1").unwrap().is_denied());
    assert_eq!(
        keyed.peek_key(&"api-key-1".to_owned()).unwrap().remaining(),
        0
    );
    assert_eq!(keyed.len(), 1);

    // Another key, borrowed, is its own state.
    assert_eq!(keyed.check_key("api-key-2").unwrap().remaining(), 2);
    assert_eq!(keyed.len(), 2);
}

#[test]
fn borrowed_and_owned_lookups_share_one_state_on_every_store() {
    check_on(ShardedStore::<String>::new());
    check_on(BoundedStore::<String>::new(1_000).unwrap());
    check_on(NeverForget::<String>::new());
}

/// Keys that are themselves borrowed-from types (`Arc<str>`) are looked up as they are.
#[test]
fn shared_string_keys_work_unchanged() {
    let keyed =
        KeyedLimiter::<Gcra, Arc<str>, _>::with_clock(Limit::per_second(1), ManualClock::new())
            .unwrap();
    let key: Arc<str> = Arc::from("tenant");
    assert!(keyed.check_key(&key).unwrap().is_allowed());
    assert!(keyed.check_key(&Arc::clone(&key)).unwrap().is_denied());
}
