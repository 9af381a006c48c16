//! Envoy's service on an in-process decider: all or nothing, over hits counted, shadow mode,
//! replaced, unlimited, blocked and unknown descriptors, overrides, malformed input, quota
//! mode, headers, metadata and the reference's statistics. limiterd runs the same service on
//! its engine (its own tests cover the mounting: metrics, gRPC, JSON).

mod support;

use std::time::Duration;

use limiter_envoy::rules::Unit;
use limiter_envoy::service::{
    Code, Descriptor, EnvoyError, HeaderNames, MAX_DESCRIPTORS, Options, Override, Request,
    Response, Status,
};
use support::Fixture;

const WEB: &str = "\
domain: web
descriptors:
  - key: user
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: tenant
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: ip
    rate_limit: { unit: second, requests_per_unit: 10, algorithm: token_bucket }
  - key: path
    rate_limit: { unit: minute, requests_per_unit: 3, name: path, replaces: [{ name: generic }] }
  - key: generic
    rate_limit: { unit: minute, requests_per_unit: 1, name: generic }
  - key: beta
    shadow_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: blocked
    rate_limit: { unit: hour, requests_per_unit: 0 }
  - key: internal
    rate_limit: { unlimited: true }
";

fn fixture() -> Fixture {
    fixture_of(WEB, Options::default())
}

fn fixture_of(file: &str, options: Options) -> Fixture {
    Fixture::new(file, options)
}

fn descriptor(pairs: &[(&str, &str)]) -> Descriptor {
    Descriptor {
        entries: pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Descriptor::default()
    }
}

fn request(descriptors: Vec<Descriptor>) -> Request {
    Request {
        domain: "web".into(),
        descriptors,
        hits_addend: 0,
    }
}

/// What the tests ask of the service, beside the fixture's own calls.
trait Ask {
    fn decide(&self, descriptors: Vec<Descriptor>) -> Response;
    fn remaining(&self, pairs: &[(&str, &str)]) -> u32;
    fn remaining_status(&self, pairs: &[(&str, &str)]) -> Status;
}

impl Ask for Fixture {
    fn decide(&self, descriptors: Vec<Descriptor>) -> Response {
        self.answer(&request(descriptors)).expect("valid")
    }

    /// What `pairs` has left, without taking anything.
    fn remaining(&self, pairs: &[(&str, &str)]) -> u32 {
        self.remaining_status(pairs).limit_remaining
    }

    /// A check (`hits_addend: 0`) of `pairs`: its status.
    fn remaining_status(&self, pairs: &[(&str, &str)]) -> Status {
        let mut d = descriptor(pairs);
        d.hits_addend = Some(0);
        self.decide(vec![d]).statuses.remove(0)
    }
}

fn codes(response: &Response) -> Vec<Code> {
    response.statuses.iter().map(|s| s.code).collect()
}

#[test]
fn a_request_over_one_limit_moves_no_other_counter() {
    let f = fixture();
    let pair = || {
        vec![
            descriptor(&[("user", "alice")]),
            descriptor(&[("tenant", "acme")]),
        ]
    };
    let first = f.decide(pair());
    assert_eq!(first.overall, Code::Ok);
    assert_eq!(first.statuses[1].limit_remaining, 9);
    for _ in 0..5 {
        let over = f.decide(pair());
        assert_eq!(over.overall, Code::OverLimit);
        assert_eq!(codes(&over), [Code::OverLimit, Code::Ok]);
    }
    // envoy's reference server would have counted the tenant six times (4 left); the
    // denied requests took nothing here.
    assert_eq!(f.remaining(&[("tenant", "acme")]), 9);
    // Another user of the tenant still gets in.
    assert_eq!(
        f.decide(vec![
            descriptor(&[("user", "bob")]),
            descriptor(&[("tenant", "acme")])
        ])
        .overall,
        Code::Ok
    );
    assert_eq!(f.remaining(&[("tenant", "acme")]), 8);
}

#[test]
fn algorithms_follow_the_clock_and_report_their_reset() {
    let f = fixture();
    for _ in 0..10 {
        assert_eq!(
            f.decide(vec![descriptor(&[("ip", "10.0.0.1")])]).overall,
            Code::Ok
        );
    }
    let over = f.decide(vec![descriptor(&[("ip", "10.0.0.1")])]);
    assert_eq!(over.overall, Code::OverLimit);
    // The hit over the limit is counted, as the reference counts it: a token every
    // 100 ms pays it back, and the next one is admitted: 200 ms.
    assert_eq!(
        over.statuses[0].duration_until_reset,
        Some(Duration::from_millis(200))
    );
    f.clock.advance(Duration::from_millis(99));
    let check = f.remaining_status(&[("ip", "10.0.0.1")]);
    assert_eq!(check.code, Code::OverLimit, "a check in debt is over");
    f.clock.advance(Duration::from_millis(1));
    let check = f.remaining_status(&[("ip", "10.0.0.1")]);
    assert_eq!(
        (check.code, check.limit_remaining),
        (Code::Ok, 0),
        "a check exactly at the limit is OK"
    );
    // A request before its wait is over, and its hit is counted too: the wait grows by a
    // token (a caller that honours the wait it is given is admitted when it ends).
    f.clock.advance(Duration::from_millis(99));
    let early = f.decide(vec![descriptor(&[("ip", "10.0.0.1")])]);
    assert_eq!(early.overall, Code::OverLimit);
    let wait = early.statuses[0].duration_until_reset.expect("a wait");
    assert_eq!(wait, Duration::from_millis(101));
    f.clock.advance(wait);
    let ok = f.decide(vec![descriptor(&[("ip", "10.0.0.1")])]);
    assert_eq!((ok.overall, ok.statuses[0].limit_remaining), (Code::Ok, 0));
    let shown = ok.statuses[0].current_limit.clone().expect("a limit");
    assert_eq!((shown.requests_per_unit, shown.unit), (10, Unit::Second));

    // The fixed window (the default) resets at the end of its minute.
    f.clock.advance(Duration::from_secs(20));
    let user = f.decide(vec![descriptor(&[("user", "carol")])]);
    let reset = user.statuses[0].duration_until_reset.expect("a reset");
    assert!(
        reset <= Duration::from_secs(60) && reset > Duration::ZERO,
        "{reset:?}"
    );
    let over = f.decide(vec![descriptor(&[("user", "carol")])]);
    assert_eq!(over.statuses[0].duration_until_reset, Some(reset));
    f.clock.advance(reset);
    assert_eq!(
        f.decide(vec![descriptor(&[("user", "carol")])]).overall,
        Code::Ok
    );
}

#[test]
fn shadow_mode_reports_but_never_denies() {
    let f = fixture();
    for round in 0..3 {
        let r = f.decide(vec![
            descriptor(&[("beta", "x")]),
            descriptor(&[("tenant", "t")]),
        ]);
        assert_eq!(r.overall, Code::Ok, "round {round}");
        assert_eq!(codes(&r), [Code::Ok, Code::Ok]);
        // Admitted once (0 left), then over: a shadow denial reports 0 left, code OK.
        assert_eq!(r.statuses[0].limit_remaining, 0);
    }
    assert_eq!(
        f.remaining(&[("tenant", "t")]),
        7,
        "the enforced limit counted all three"
    );
    // Reported as the reference reports it: three hits, two of them over and so in shadow
    // mode (counted over the limit too, though answered OK).
    assert_eq!(f.stat("web.beta", "total_hits"), 3);
    assert_eq!(f.stat("web.beta", "over_limit"), 2);
    assert_eq!(f.stat("web.beta", "shadow_mode"), 2);
    assert_eq!(f.stat("web.beta", "within_limit"), 1);
    // A shadow limit does not shield an enforced one.
    let r = f.decide(vec![
        descriptor(&[("beta", "x")]),
        descriptor(&[("user", "u")]),
    ]);
    assert_eq!(r.overall, Code::Ok);
    let r = f.decide(vec![
        descriptor(&[("beta", "x")]),
        descriptor(&[("user", "u")]),
    ]);
    assert_eq!(
        (r.overall, codes(&r)),
        (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
    );
}

#[test]
fn replaced_unlimited_blocked_and_unknown_descriptors() {
    let f = fixture();
    // `path` replaces `generic` when both match: generic (1/min) is not applied.
    for _ in 0..3 {
        let r = f.decide(vec![
            descriptor(&[("path", "/a")]),
            descriptor(&[("generic", "g")]),
        ]);
        assert_eq!(r.overall, Code::Ok);
        assert_eq!(r.statuses[1].current_limit, None);
    }
    assert_eq!(f.remaining(&[("generic", "g")]), 1, "never counted");
    // Alone, generic applies.
    assert_eq!(
        f.decide(vec![descriptor(&[("generic", "g")])]).overall,
        Code::Ok
    );
    assert_eq!(
        f.decide(vec![descriptor(&[("generic", "g")])]).overall,
        Code::OverLimit
    );

    let r = f.decide(vec![
        descriptor(&[("internal", "x")]),
        descriptor(&[("nothing", "x")]),
    ]);
    assert_eq!(r.overall, Code::Ok);
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(r.statuses[1].current_limit, None);

    // `requests_per_unit: 0` refuses, and the request takes nothing elsewhere.
    let r = f.decide(vec![
        descriptor(&[("tenant", "z")]),
        descriptor(&[("blocked", "x")]),
    ]);
    assert_eq!(
        (r.overall, codes(&r)),
        (Code::OverLimit, vec![Code::Ok, Code::OverLimit])
    );
    assert_eq!(f.remaining(&[("tenant", "z")]), 10);

    let unknown = f
        .answer(&Request {
            domain: "elsewhere".into(),
            descriptors: vec![descriptor(&[("user", "a")])],
            hits_addend: 0,
        })
        .expect("valid");
    assert_eq!(unknown.overall, Code::Ok);
    assert_eq!(unknown.statuses[0].current_limit, None);
}

#[test]
fn hits_overrides_and_refusals() {
    let f = fixture();
    // Request-level hits (0 means 1) and a descriptor's own.
    let mut r = request(vec![descriptor(&[("tenant", "h")])]);
    r.hits_addend = 4;
    let answer = f.answer(&r).expect("valid");
    assert_eq!(answer.statuses[0].limit_remaining, 6);
    let mut d = descriptor(&[("tenant", "h")]);
    d.hits_addend = Some(7);
    let over = f.decide(vec![d.clone()]);
    assert_eq!(over.overall, Code::OverLimit);
    // Counted, as the reference counts hits over a limit: 11 of 10, so a check is over.
    assert_eq!(f.remaining_status(&[("tenant", "h")]).code, Code::OverLimit);
    // More hits than the limit could ever hold: over, not an error, and counted too.
    d.hits_addend = Some(11);
    assert_eq!(f.decide(vec![d]).overall, Code::OverLimit);
    assert_eq!(f.remaining(&[("tenant", "h")]), 0);
    let mut fresh = descriptor(&[("tenant", "i")]);
    fresh.hits_addend = Some(11);
    assert_eq!(f.decide(vec![fresh]).overall, Code::OverLimit);
    assert_eq!(f.remaining_status(&[("tenant", "i")]).code, Code::OverLimit);

    // An override replaces the configured limit, with its own counter.
    let mut o = descriptor(&[("tenant", "h")]);
    o.limit = Some(Override {
        requests_per_unit: 2,
        unit: Unit::Hour.number(),
    });
    for expected in [Code::Ok, Code::Ok, Code::OverLimit] {
        let r = f.decide(vec![o.clone()]);
        assert_eq!(r.overall, expected);
        let shown = r.statuses[0].current_limit.clone().expect("shown");
        assert_eq!((shown.requests_per_unit, shown.unit), (2, Unit::Hour));
    }
    // Another unit is another counter (as the reference keys counters by the unit's
    // window): 10 a day starts afresh beside 2 an hour.
    o.limit = Some(Override {
        requests_per_unit: 10,
        unit: Unit::Day.number(),
    });
    let day = f.decide(vec![o.clone()]);
    assert_eq!(
        (day.overall, day.statuses[0].limit_remaining),
        (Code::Ok, 9)
    );

    // Only an empty domain or descriptor list is an error (gRPC UNKNOWN, as the
    // reference answers).
    for (req, field) in [
        (Request::default(), "domain"),
        (request(Vec::new()), "descriptors"),
    ] {
        let EnvoyError::Empty(message) = f.answer(&req).expect_err(field) else {
            panic!("empty")
        };
        assert!(message.starts_with(field), "{field}: {message}");
    }
}

#[test]
fn malformed_descriptors_never_pass_a_limit_they_would_meet() {
    let f = fixture();
    // No entries, or an empty key: no limit matches them, and the rest is counted.
    let r = f.decide(vec![
        descriptor(&[]),
        descriptor(&[("", "v")]),
        descriptor(&[("user", "mal")]),
    ]);
    assert_eq!(r.overall, Code::Ok);
    assert_eq!(r.statuses[2].limit_remaining, 0);
    assert_eq!(
        f.decide(vec![descriptor(&[]), descriptor(&[("user", "mal")])])
            .overall,
        Code::OverLimit
    );
    // An override with no known unit is ignored: the configured limit applies.
    let junk = Descriptor {
        limit: Some(Override {
            requests_per_unit: 1_000,
            unit: 0,
        }),
        ..descriptor(&[("user", "mal")])
    };
    assert_eq!(f.decide(vec![junk]).overall, Code::OverLimit);
    // A long value is counted (under its digest), exactly like a short one.
    let long = "v".repeat(100_000);
    assert_eq!(
        f.decide(vec![descriptor(&[("user", &long)])]).overall,
        Code::Ok
    );
    assert_eq!(
        f.decide(vec![descriptor(&[("user", &long)])]).overall,
        Code::OverLimit
    );
    let longer = format!("{long}w");
    assert_eq!(
        f.decide(vec![descriptor(&[("user", &longer)])]).overall,
        Code::Ok,
        "another long value has its own counter"
    );
    // Many descriptors (past what the reference was ever sent): each is decided.
    let many: Vec<Descriptor> = (0..200)
        .map(|i| descriptor(&[("tenant", &format!("t{i}"))]))
        .chain(std::iter::once(descriptor(&[("user", "mal")])))
        .collect();
    let r = f.decide(many);
    assert_eq!(r.overall, Code::OverLimit);
    assert_eq!(r.statuses.len(), 201);
    // Past MAX_DESCRIPTORS: over, counting nothing.
    let flood: Vec<Descriptor> = (0..=MAX_DESCRIPTORS)
        .map(|_| descriptor(&[("tenant", "flood")]))
        .collect();
    let r = f.decide(flood);
    assert_eq!(r.overall, Code::OverLimit);
    assert_eq!(f.remaining(&[("tenant", "flood")]), 10);
}

const SWITCHES: &str = "\
domain: web
descriptors:
  - key: soft
    quota_mode: true
    rate_limit: { unit: minute, requests_per_unit: 1 }
  - key: user
    value_to_metric: true
    rate_limit: { unit: minute, requests_per_unit: 10 }
  - key: tenant
    rate_limit: { unit: hour, requests_per_unit: 5 }
";

fn with_options(options: Options) -> Fixture {
    fixture_of(SWITCHES, options)
}

#[test]
fn quota_mode_admits_and_names_the_descriptors_over_in_the_metadata() {
    let f = with_options(Options::default());
    let r = f.decide(vec![
        descriptor(&[("soft", "a")]),
        descriptor(&[("tenant", "t")]),
    ]);
    assert_eq!(r.overall, Code::Ok);
    let metadata = r.dynamic_metadata.expect("quota mode matched");
    assert_eq!(metadata["quotaModeEnabled"], serde_json::json!(true));
    assert_eq!(metadata["quotaModeViolations"], serde_json::json!([]));
    let r = f.decide(vec![
        descriptor(&[("tenant", "t")]),
        descriptor(&[("soft", "a")]),
    ]);
    assert_eq!((r.overall, codes(&r)), (Code::Ok, vec![Code::Ok, Code::Ok]));
    let metadata = r.dynamic_metadata.expect("quota mode matched");
    assert_eq!(metadata["quotaModeViolations"], serde_json::json!([1]));
    assert_eq!(f.remaining(&[("tenant", "t")]), 3, "the rest was counted");
    // No quota-mode limit matched: no metadata.
    assert_eq!(
        f.decide(vec![descriptor(&[("tenant", "t")])])
            .dynamic_metadata,
        None
    );
}

#[test]
fn headers_metadata_and_global_shadow_mode_follow_the_options() {
    let f = with_options(Options {
        shadow_mode: true,
        headers: Some(HeaderNames::default()),
        dynamic_metadata: true,
        ..Options::default()
    });
    for round in 1..=7_u32 {
        let r = f.decide(vec![
            descriptor(&[("tenant", "t")]),
            descriptor(&[("user", "u")]),
        ]);
        // Global shadow mode: always OK overall, while the statuses say what was over.
        assert_eq!(r.overall, Code::Ok, "round {round}");
        let over = round > 5;
        assert_eq!(r.statuses[0].code == Code::OverLimit, over, "round {round}");
        // The headers follow the descriptor closest to its limit: the tenant's.
        let remaining = 5_u32.saturating_sub(round);
        assert_eq!(
            r.headers,
            vec![
                ("RateLimit-Limit".to_owned(), "5".to_owned()),
                ("RateLimit-Remaining".to_owned(), remaining.to_string()),
                ("RateLimit-Reset".to_owned(), "3600".to_owned()),
            ],
            "round {round}"
        );
        let metadata = r.dynamic_metadata.expect("enabled");
        assert_eq!(metadata["domain"], serde_json::json!("web"));
        assert_eq!(
            metadata["descriptors"][1]["entries"],
            serde_json::json!(["user=u"])
        );
    }
    assert_eq!(f.remaining(&[("user", "u")]), 3, "what fitted was counted");
    // A limit envoy sends with the descriptor is still enforced.
    let sent = Descriptor {
        limit: Some(Override {
            requests_per_unit: 1,
            unit: Unit::Hour.number(),
        }),
        ..descriptor(&[("user", "sent")])
    };
    assert_eq!(f.decide(vec![sent.clone()]).overall, Code::Ok);
    assert_eq!(f.decide(vec![sent]).overall, Code::OverLimit);
    for (key, stat, n) in [
        ("", "global_shadow_mode", 2),
        ("web.tenant", "over_limit", 2),
        ("web.tenant", "within_limit", 5),
        // 80% of 5 is 4: the 5th hit is near the limit.
        ("web.tenant", "near_limit", 1),
        // value_to_metric: one series per value besides the rule's own.
        ("web.user_u", "total_hits", 7),
        ("web.user", "total_hits", 7),
    ] {
        assert_eq!(f.stat(key, stat), n, "{key} {stat}");
    }
}
