//! The descriptor model's tests: matching as the reference matches, loading and refusing as it does, every mistake named.
use super::*;

const WEB: &str = "\
domain: web
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
      algorithm: token_bucket
  - key: path
    value: /login
    rate_limit: { unit: minute, requests_per_unit: 5, name: login }
    descriptors:
      - key: user
        rate_limit: { unit: hour, requests_per_unit: 50 }
  - key: path
    value: /api/*
    rate_limit: { unit: second, requests_per_unit: 100 }
  - key: path
    rate_limit: { unit: second, requests_per_unit: 1000 }
  - key: internal
    rate_limit: { unlimited: true }
";

fn entries(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn limit_of<'a>(domain: &'a Domain, pairs: &[(&str, &str)]) -> Option<&'a RateLimit> {
    match domain.rule(&entries(pairs)) {
        Some(Rule::Limited(l)) => Some(l),
        _ => None,
    }
}

#[test]
fn the_most_specific_node_wins_and_only_at_the_last_entry() {
    let web = parse("web.yaml", WEB).expect("valid");
    let by_ip = limit_of(&web, &[("remote_address", "10.0.0.1")]).expect("matched");
    assert_eq!(
        (by_ip.requests_per_unit, by_ip.kind),
        (10, Kind::TokenBucket)
    );
    assert_eq!(by_ip.full_key, "web.remote_address");

    let login = limit_of(&web, &[("path", "/login")]).expect("exact value");
    assert_eq!((login.requests_per_unit, login.name.as_str()), (5, "login"));
    assert_eq!(login.unit, Unit::Minute);
    assert_eq!(
        login.kind,
        Kind::FixedWindow,
        "the reference server's default"
    );

    let api = limit_of(&web, &[("path", "/api/users")]).expect("prefix");
    assert_eq!(api.requests_per_unit, 100);
    let other = limit_of(&web, &[("path", "/home")]).expect("key only");
    assert_eq!(other.requests_per_unit, 1000);

    let user = limit_of(&web, &[("path", "/login"), ("user", "alice")]).expect("nested");
    assert_eq!(user.requests_per_unit, 50);
    assert_eq!(user.full_key, "web.path_/login.user");
    // A request deeper than the tree, or a nested key under the wrong parent: no limit.
    assert_eq!(
        web.rule(&entries(&[("remote_address", "1"), ("user", "a")])),
        None
    );
    assert_eq!(
        web.rule(&entries(&[("path", "/home"), ("user", "a")])),
        None
    );
    assert_eq!(web.rule(&entries(&[("nothing", "x")])), None);
    assert_eq!(
        web.rule(&entries(&[("internal", "yes")])),
        Some(&Rule::Unlimited {
            name: String::new(),
            replaces: Vec::new()
        })
    );
    assert_eq!(web.limits().count(), 5);
}

fn error(text: &str) -> RulesError {
    parse("f.yaml", text).expect_err(text)
}

#[test]
fn every_mistake_names_the_file_line_field_and_fix() {
    let cases: &[(&str, &str, usize, &str)] = &[
        (
            "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: fortnight, requests_per_unit: 1 }\n",
            "descriptors[0].rate_limit.unit",
            4,
            "`fortnight` is not a unit",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n    rate_limt: { unit: second }\n",
            "descriptors[0].rate_limt",
            4,
            "unknown field",
        ),
        (
            "domain: web\ndescriptors:\n  - value: x\n",
            "descriptors[0].key",
            3,
            "missing",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: year, requests_per_unit: 1, unit_multiplier: 4294967295 }\n",
            "descriptors[0].rate_limit.unit_multiplier",
            4,
            "use a smaller unit_multiplier",
        ),
        (
            "domain: web\ndescriptors:\n  - key: \"\"\n",
            "descriptors[0].key",
            3,
            "is empty",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: -3 }\n",
            "descriptors[0].rate_limit.requests_per_unit",
            4,
            "not a whole number",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 99999999999 }\n",
            "descriptors[0].rate_limit.requests_per_unit",
            4,
            "more than 4294967295",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n  - key: b\n  - key: a\n",
            "descriptors[2]",
            5,
            "already configured at line 3",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unlimited: true, unit: second }\n",
            "descriptors[0].rate_limit.unit",
            4,
            "unlimited",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, name: x, replaces: [{ name: x }] }\n",
            "descriptors[0].rate_limit.replaces[0].name",
            4,
            "cannot replace itself",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, algorithm: leaky }\n",
            "descriptors[0].rate_limit.algorithm",
            4,
            "not an algorithm",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n    shadow_mode: maybe\n",
            "descriptors[0].shadow_mode",
            4,
            "true or false",
        ),
        ("descriptors: []\n", "domain", 1, "missing"),
        (
            "domain: web\ndescriptors: {key: a}\n",
            "descriptors",
            2,
            "not a list",
        ),
        (
            "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1, unit_multiplier: 0 }\n",
            "descriptors[0].rate_limit.unit_multiplier",
            4,
            "is 0",
        ),
    ];
    for (text, field, line, message) in cases {
        let e = error(text);
        assert_eq!(e.field, *field, "{e}");
        assert_eq!(e.mark.map(|m| m.line), Some(*line), "{e}");
        assert!(e.message.contains(message), "{e}");
        assert!(e.to_string().starts_with(&format!("f.yaml:{line}:")), "{e}");
    }
    let e = error("domain: web\ndescriptors:\n  - key: a\n    value: [1, 2]\n");
    assert_eq!(
        e.mark,
        Some(Mark {
            line: 4,
            column: 12
        }),
        "{e}"
    );
    assert!(error("").message.contains("empty"));
    assert!(error("domain: [web\n").message.contains("not valid YAML"));
}

#[test]
fn a_domain_lives_in_one_file_and_units_round_trip() {
    let err = Domains::load([("a.yaml", "domain: web\n"), ("b.yaml", "domain: web\n")])
        .expect_err("duplicate");
    assert_eq!(err.file, "b.yaml");
    assert!(err.message.contains("already defined in a.yaml"), "{err}");
    for unit in Unit::ALL {
        assert_eq!(Unit::from_number(unit.number()), Some(unit));
        assert_eq!(Unit::parse(&unit.name().to_lowercase()), Some(unit));
    }
    assert_eq!(Unit::from_number(0), None);
    // The protocol's numbering: MONTH is 5, YEAR 6, WEEK 7.
    assert_eq!(
        (
            Unit::Month.number(),
            Unit::Year.number(),
            Unit::Week.number()
        ),
        (5, 6, 7)
    );
}

#[test]
fn loads_and_refuses_as_the_reference_does_at_every_level() {
    // A field the reference knows, where it means nothing: loaded, ignored, with a warning
    // naming it (the reference checks every key against one list, whatever the level).
    let text = "domain: web\nkey: stray\ndescriptors:\n  - key: a\n    unit: second\n    rate_limit: { unit: minute, requests_per_unit: 2, shadow_mode: true }\n    descriptors:\n      - key: b\n        requests_per_unit: 9\n        rate_limit:\n          unit: hour\n          requests_per_unit: 3\n          replaces: [{ name: x, value: y }]\n";
    let domain = parse("web.yaml", text).expect("the reference loads it");
    let a = limit_of(&domain, &[("a", "1")]).expect("a's limit");
    assert_eq!(
        (a.requests_per_unit, a.unit, a.shadow),
        (2, Unit::Minute, false)
    );
    let b = limit_of(&domain, &[("a", "1"), ("b", "2")]).expect("b's limit");
    assert_eq!((b.requests_per_unit, b.unit), (3, Unit::Hour));
    let warned: Vec<String> = domain.warnings.iter().map(ToString::to_string).collect();
    for (field, line) in [
        ("key", 2),
        ("descriptors[0].unit", 5),
        ("descriptors[0].rate_limit.shadow_mode", 6),
        ("descriptors[0].descriptors[0].requests_per_unit", 9),
        (
            "descriptors[0].descriptors[0].rate_limit.replaces[0].value",
            13,
        ),
    ] {
        assert!(
            warned
                .iter()
                .any(|w| w.contains(&format!("web.yaml:{line}:"))
                    && w.contains(&format!(": {field}: means nothing here and is ignored"))),
            "{field} at line {line}: {warned:#?}"
        );
    }
    assert_eq!(warned.len(), 5, "{warned:#?}");
    // A field nobody knows is still refused.
    let err = parse(
        "web.yaml",
        "domain: web\ndescriptors:\n  - key: a\n    units: second\n",
    )
    .expect_err("refused");
    assert!(err.to_string().contains("unknown field"), "{err}");

    // What the reference refuses: share_threshold on a value with no wildcard, and two
    // descriptors whose key and value join to one composite key (`a_b` + `c`, `a` + `b_c`).
    let err = parse(
            "web.yaml",
            "domain: web\ndescriptors:\n  - key: files\n    value: report.pdf\n    share_threshold: true\n    rate_limit: { unit: day, requests_per_unit: 1 }\n",
        )
        .expect_err("refused")
        .to_string();
    assert!(err.starts_with("web.yaml:5:"), "{err}");
    assert!(
        err.contains("share_threshold: applies only to a wildcard value"),
        "{err}"
    );
    // On a wildcard, or switched off, it loads.
    for ok in [
        "value: report*\n    share_threshold: true",
        "value: report.pdf\n    share_threshold: false",
    ] {
        let text = format!(
            "domain: web\ndescriptors:\n  - key: files\n    {ok}\n    rate_limit: {{ unit: day, requests_per_unit: 1 }}\n"
        );
        assert!(parse("web.yaml", &text).is_ok(), "{ok}");
    }
    for (first, second) in [
        ("key: a_b\n    value: c", "key: a\n    value: b_c"),
        ("key: a_b", "key: a\n    value: b"),
    ] {
        let text = format!("domain: web\ndescriptors:\n  - {first}\n  - {second}\n");
        let err = parse("web.yaml", &text).expect_err("refused").to_string();
        assert!(err.contains("joins to the composite key"), "{err}");
        assert!(err.contains("rename one"), "{err}");
    }
    // Across files merged into one domain, too.
    let first = "domain: web\ndescriptors:\n  - key: a_b\n    value: c\n";
    let second = "domain: web\ndescriptors:\n  - key: a\n    value: b_c\n";
    assert!(Domains::load_merging([("1.yaml", first), ("2.yaml", second)], true).is_err());
}

#[test]
fn loads_what_the_reference_loads() {
    let deep = {
        let mut text = String::from("domain: deep\ndescriptors:\n");
        for level in 0..20 {
            let pad = "  ".repeat(level * 2);
            text.push_str(&format!("{pad}  - key: k{level}\n"));
            if level == 19 {
                text.push_str(&format!(
                    "{pad}    rate_limit: {{ unit: second, requests_per_unit: 1 }}\n"
                ));
            } else {
                text.push_str(&format!("{pad}    descriptors:\n"));
            }
        }
        text
    };
    let deep = parse("deep.yaml", &deep).expect("20 levels load");
    let path: Vec<(String, String)> = (0..20).map(|l| (format!("k{l}"), "v".to_owned())).collect();
    assert!(matches!(deep.rule(&path), Some(Rule::Limited(_))));

    let text = format!(
        "domain: web
descriptors:
  - key: a
    value: \"\"
    metadata: {{ service_with_quota: {{ name: s }} }}
    share_threshold: false
    value_to_metric: true
    quota_mode: true
    rate_limit: {{ unit: hour }}
  - key: b
    rate_limit:
  - key: c
    rate_limit: {{ unlimited: true, requests_per_unit: 5, name: c, replaces: [{{ name: x }}] }}
  - key: d
    value: {long}
    rate_limit: {{ unit: minute, requests_per_unit: 20, unit_multiplier: 5 }}
",
        long = "v".repeat(300)
    );
    let web = parse("web.yaml", &text).expect("loads");
    let a = limit_of(&web, &[("a", "anything")]).expect("an empty value is the key alone");
    assert_eq!((a.requests_per_unit, a.quota_mode), (0, true));
    assert_eq!(web.rule(&entries(&[("b", "x")])), None, "no rate limit");
    assert_eq!(
        web.rule(&entries(&[("c", "x")])).map(Rule::replaces),
        Some(&["x".to_owned()][..])
    );
    let d = limit_of(&web, &[("d", &"v".repeat(300))]).expect("a long value");
    assert_eq!(d.window(), Duration::from_secs(300));
    let described = web.matched(&entries(&[("a", "z")])).expect("matched");
    assert_eq!(
        described.path[0].metadata.as_deref(),
        Some("{service_with_quota: {name: s}}")
    );
    assert_eq!(
        described
            .metric_key("web", &entries(&[("a", "z")]))
            .as_deref(),
        Some("web.a_z")
    );
}

/// A descriptor value with `*`s matches as the reference's wildcards do (each `*` any run of
/// characters, anywhere in the value), through a loaded domain; a value it does not match
/// falls to the key alone.
#[test]
fn wildcards_match_anywhere_in_the_value() {
    for (pattern, value, matches) in [
        ("foo*", "foobar", true),
        ("foo*", "fo", false),
        ("bar*b", "bar-x-b", true),
        ("bar*b", "bab", false),
        ("foo*bar*baz", "foo1bar2baz", true),
        ("foo*bar*baz", "foobazbar", false),
        ("*x*", "axb", true),
        ("a*a", "a", false),
        ("/api/*/action", "/api/v1/action", true),
        ("/api/*/action", "/api/action", false),
    ] {
        let yaml = format!(
            "domain: web\ndescriptors:\n  - key: path\n    value: \"{pattern}\"\n    \
             rate_limit: {{ unit: second, requests_per_unit: 1 }}\n  - key: path\n    \
             rate_limit: {{ unit: second, requests_per_unit: 2 }}\n"
        );
        let web = parse("web.yaml", &yaml).expect("valid");
        let limit = limit_of(&web, &[("path", value)]).expect("the pattern or the key");
        let want = if matches { 1 } else { 2 };
        assert_eq!(limit.requests_per_unit, want, "{pattern} against {value}");
    }
}

#[test]
fn domains_merge_across_files_only_when_asked() {
    let one = "domain: web\ndescriptors:\n  - key: a\n    rate_limit: { unit: second, requests_per_unit: 1 }\n";
    let two = "domain: web\ndescriptors:\n  - key: b\n    rate_limit: { unit: second, requests_per_unit: 2 }\n";
    assert!(Domains::load([("1.yaml", one), ("2.yaml", two)]).is_err());
    let merged = Domains::load_merging([("1.yaml", one), ("2.yaml", two)], true).expect("merged");
    let web = merged.get("web").expect("web");
    let ids: Vec<usize> = web.limits().map(|l| l.id).collect();
    assert_eq!(ids, [0, 1]);
    assert!(web.rule(&entries(&[("b", "x")])).is_some());
    let err = Domains::load_merging([("1.yaml", one), ("3.yaml", one)], true)
        .expect_err("the same descriptor twice");
    assert!(
        err.message.contains("already configured in 1.yaml"),
        "{err}"
    );
}
