//! Stacks on the fixed-plan path (at most four layers, every layer one plan and no plan function,
//! or plans of several limits chosen per call), for the reference model: on one key, and on
//! several keys with and without a global layer (the commit lock, or each key's lead locked), of
//! one limit a layer or several, and on one key with a layer whose plan function chooses.

use limiter_calendar::CalendarUnit;
use limiter_core::Algorithm;
use limiter_sliding_window::{FixedCounter, SlidingCounter};
use limiter_token_bucket::Gcra;

use super::{Alg, Request, Spec, calendar, limit};

/// The layers of a stack on the fixed-plan path on one key: per user one token bucket and, on the same key,
/// a sliding window, a global token bucket, and on the user's key a day's calendar quota;
/// every layer one plan of one limit.
pub(crate) fn one_key_specs() -> Vec<Spec> {
    let one = |name, shares, key: fn(&Request) -> Option<u64>, alg| Spec {
        name,
        shares,
        key,
        choose: |_| 0,
        plans: vec![vec![alg]],
    };
    vec![
        one(
            "user",
            None,
            |r| Some(r.user),
            Alg::Bucket(Gcra::new(limit(3, 1_000)).unwrap()),
        ),
        one(
            "user-window",
            Some(0),
            |r| Some(r.user),
            Alg::Sliding(SlidingCounter::new(limit(5, 2_000)).unwrap()),
        ),
        one(
            "global",
            None,
            |_| None,
            Alg::Bucket(Gcra::new(limit(6, 1_000).with_burst(4)).unwrap()),
        ),
        // A calendar quota on the user's key: an algorithm the stack holds boxed.
        one(
            "user-day",
            Some(0),
            |r| Some(r.user),
            calendar(8, CalendarUnit::Day),
        ),
    ]
}

/// The layers of a stack on the fixed-plan path on one key whose layers hold several limits each: per user a
/// token bucket and a sliding window in one layer, on the same key a fixed window and a token
/// bucket, and a global layer of two (every layer one plan).
pub(crate) fn one_key_several_limits_specs() -> Vec<Spec> {
    let spec = |name, shares, key: fn(&Request) -> Option<u64>, limits| Spec {
        name,
        shares,
        key,
        choose: |_| 0,
        plans: vec![limits],
    };
    vec![
        spec(
            "user",
            None,
            |r| Some(r.user),
            vec![
                Alg::Bucket(Gcra::new(limit(3, 1_000)).unwrap()),
                Alg::Sliding(SlidingCounter::new(limit(5, 2_000)).unwrap()),
            ],
        ),
        spec(
            "user-more",
            Some(0),
            |r| Some(r.user),
            vec![
                Alg::Fixed(FixedCounter::new(limit(4, 1_500)).unwrap()),
                Alg::Bucket(Gcra::new(limit(2, 500).with_burst(3)).unwrap()),
            ],
        ),
        spec(
            "global",
            None,
            |_| None,
            vec![
                Alg::Bucket(Gcra::new(limit(6, 1_000).with_burst(4)).unwrap()),
                Alg::Fixed(FixedCounter::new(limit(9, 2_000)).unwrap()),
            ],
        ),
    ]
}

/// [`one_key_several_limits_specs`] with the same-key layer's limits in two plans its plan
/// function chooses per call (free: a fixed window and a token bucket; pro: a token bucket and
/// a sliding window, in other terms): the one-key path reads that layer under the sequence lock,
/// and a call in another plan than its entry's goes to the general path, which changes it.
pub(crate) fn one_key_chosen_plans_specs() -> Vec<Spec> {
    let mut specs = one_key_several_limits_specs();
    specs[1].choose = |r| usize::from(r.pro);
    specs[1].plans.push(vec![
        Alg::Bucket(Gcra::new(limit(5, 1_000).with_burst(6)).unwrap()),
        Alg::Sliding(SlidingCounter::new(limit(3, 500)).unwrap()),
    ]);
    specs
}

/// The layers of a stack on the fixed-plan path on several keys: per user (a token bucket, and
/// a sliding window with `several_limits`), on the user's key a second layer (one entry for
/// both; a fixed window, and a year's calendar quota with `several_limits`), per pair of users
/// (another key: two users share it) and, with `global`, a global layer (the commit lock);
/// without it, on the user's writes only (a key a request may skip), and each key's lead is
/// locked.
pub(crate) fn several_keys_specs(global: bool, several_limits: bool) -> Vec<Spec> {
    let spec = |name, shares, key: fn(&Request) -> Option<u64>, limits| Spec {
        name,
        shares,
        key,
        choose: |_| 0,
        plans: vec![limits],
    };
    let mut user = vec![Alg::Bucket(Gcra::new(limit(3, 1_000)).unwrap())];
    if several_limits {
        user.push(Alg::Sliding(SlidingCounter::new(limit(5, 2_000)).unwrap()));
    }
    vec![
        spec("user", None, |r| Some(r.user), user),
        spec("user-more", Some(0), |r| Some(r.user), {
            let mut more = vec![Alg::Fixed(FixedCounter::new(limit(4, 1_500)).unwrap())];
            if several_limits {
                more.push(calendar(10, CalendarUnit::Year));
            }
            more
        }),
        spec(
            "pair",
            None,
            |r| Some(r.user % 2),
            vec![Alg::Fixed(FixedCounter::new(limit(4, 1_000)).unwrap())],
        ),
        if global {
            spec(
                "global",
                None,
                |_| None,
                vec![Alg::Bucket(
                    Gcra::new(limit(6, 1_000).with_burst(4)).unwrap(),
                )],
            )
        } else {
            spec(
                "writes",
                None,
                |r| r.write.then_some(r.user),
                vec![Alg::Sliding(SlidingCounter::new(limit(2, 1_000)).unwrap())],
            )
        },
    ]
}
