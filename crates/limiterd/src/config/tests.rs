//! The configuration's tests: every field parsed, every mistake named with its line, column and fix.
use crate::store::{Lease, Slack};
use limiter_stack::Kind;

use super::*;
use limiter_core::text::parse_percent;

#[test]
fn a_redis_cluster_is_given_by_its_seed_nodes() {
    let config = Config::parse(
            "[store]\nkind = \"redis\"\ncluster = [\"redis://10.0.0.1:6379\", \"redis://10.0.0.2:6379\"]\n\
             [policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1m\" }]\n",
        )
        .unwrap();
    let Store::Redis { connection, .. } = &config.store else {
        panic!("{:?}", config.store);
    };
    let at = &connection.at;
    assert_eq!(
        at,
        &RedisAt::Cluster(vec![
            crate::store::RedisUrl::parse("redis://10.0.0.1:6379").unwrap(),
            crate::store::RedisUrl::parse("redis://10.0.0.2:6379").unwrap()
        ])
    );
    assert_eq!(
        at.to_string(),
        "cluster via redis://10.0.0.1:6379, redis://10.0.0.2:6379"
    );
}

#[test]
fn the_built_in_policies_parse() {
    let config = Config::parse(BUILT_IN).expect("valid");
    assert_eq!(config.listen, SocketAddr::from(([127, 0, 0, 1], 8080)));
    assert_eq!(config.store, Store::Memory { max_keys: None });
    assert_eq!(
        config.policies.keys().collect::<Vec<_>>(),
        ["api", "exports", "global", "login"]
    );
    let exports = config.policies["exports"]
        .concurrency
        .expect("a concurrency limit");
    assert_eq!((exports.count, exports.ttl.as_secs()), (2, 300));
    let api = &config.policies["api"];
    assert_eq!(api.limits[0].limit.limit().burst(), 20);
    assert_eq!(api.limits[1].limit.kind(), Kind::SlidingWindow);
    assert_eq!(config.policies["global"].limits[1].keying, Keying::Global);
}

fn error(text: &str) -> String {
    Config::parse(text).expect_err("refused").to_string()
}

#[test]
fn lease_slack_reads_a_share_or_units_and_refuses_anything_else() {
    let with = |extra: &str| {
        format!(
            "[policies.p]\nlimits = [{{ algorithm = \"token_bucket\", count = 1000, period = \"1s\" }}]\n{extra}\n"
        )
    };
    let lease = |extra: &str| Config::parse(&with(extra)).expect("valid").policies["p"].lease;
    assert_eq!(lease(""), None);
    assert_eq!(
        lease("lease_slack = \"1%\""),
        Some(Lease::new(Slack::PartsPerMillion(10_000)))
    );
    assert_eq!(
        lease("lease_slack = \"0.25%\""),
        Some(Lease::new(Slack::PartsPerMillion(2_500)))
    );
    assert_eq!(
        lease("lease_slack = 40\nlease_ttl = \"2s\""),
        Some(Lease::new(Slack::Units(40)).ttl(Duration::from_secs(2)))
    );
    for (extra, want) in [
        (
            "lease_slack = \"5\"",
            "line 3, column 15: policy `p`: `lease_slack = \"5\"`: write a share",
        ),
        (
            "lease_slack = \"101%\"",
            "`lease_slack = \"101%\"`: write a share",
        ),
        ("lease_slack = \"0.12345%\"", "write a share"),
        ("lease_slack = \"-1%\"", "write a share"),
        ("lease_slack = -3", "`lease_slack = -3` is negative"),
        ("lease_slack = 1.5", "`lease_slack` is a float"),
        (
            "lease_slack = \"1%\"\nlease_ttl = \"1ms\"",
            "line 4, column 13: policy `p`: `lease_ttl = \"1ms\"`: write a period from 10ms to 3600s",
        ),
        ("lease_ttl = \"1s\"", "`lease_ttl` without `lease_slack`"),
        // A share that is no whole unit of the limit, and more units than the limit: each
        // refused with the slack that works, where the slack is written.
        (
            "lease_slack = \"0.05%\"",
            "line 3, column 15: policy `p`, limit 1000 per 1s: a slack of 0.05% is no whole unit of a burst of 1000, so nothing would be leased; use at least 0.1% (one unit)",
        ),
        (
            "lease_slack = 5000",
            "policy `p`, limit 1000 per 1s: a slack of 5000 units is more than the burst of 1000",
        ),
    ] {
        let got = error(&with(extra));
        assert!(got.contains(want), "{extra}: {got}");
    }
    // 1% of 10 rounds to no unit: refused (not silently decided per call).
    let ten = "[policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 10, period = \"1s\" }]\nlease_slack = \"1%\"\n";
    let got = error(ten);
    assert!(got.contains("use at least 10%"), "{got}");
    assert_eq!(parse_percent("100%"), Some(1_000_000));
    assert_eq!(parse_percent(".5%"), Some(5_000));
    assert_eq!(parse_percent("%"), None);
    assert_eq!(parse_percent("1.%"), Some(10_000));
    assert_eq!(parse_percent("99999999999999999999%"), None);
}

#[test]
fn every_error_names_the_line_and_the_fix() {
    let policy = |limit: &str| format!("[policies.p]\nlimits = [\n  {limit},\n]\n");
    for (text, want) in [
            ("listen = 8080\n".to_owned(), "line 1, column 10: invalid type: number `8080`, expected a string"),
            ("listen = \"nowhere\"\n".to_owned(), "line 1, column 10: `listen = \"nowhere\"` is not an address"),
            ("colour = 1\n".to_owned(), "line 1, column 1: unknown field `colour`"),
            ("[store]\nkind = \"disk\"\n".to_owned(), "line 2, column 8: store `kind = \"disk\"`: use \"memory\" or \"redis\""),
            ("[store]\nkind = \"redis\"\n".to_owned(), "line 1, column 1: a redis store needs `url"),
            ("[store]\nkind = \"redis\"\nurl = \"redis://a:1\"\ncluster = [\"redis://b:1\"]\n".to_owned(), "line 4, column 11: give one of `url` (one server), `cluster`"),
            ("[store]\nkind = \"redis\"\ncluster = []\n".to_owned(), "line 3, column 11: `cluster = []`: list at least one seed node"),
            ("[store]\nkind = \"redis\"\ncluster = [\"redis://a:1\", \"b:1\"]\n".to_owned(), "line 3, column 27: `cluster`: a Redis URL starts with redis://"),
            ("[store]\nkind = \"memory\"\ncluster = [\"redis://a:1\"]\n".to_owned(), "line 3, column 11: `cluster` applies to `kind = \"redis\"` only"),
            ("[store]\nkind = \"memory\"\ntimeout_ms = 5\n".to_owned(), "line 3, column 14: `timeout_ms` applies to `kind = \"redis\"` only"),
            ("[store]\nkind = \"memory\"\nmax_keys = 0\n".to_owned(), "line 3, column 12: `max_keys = 0`: use 1 to 1000000000"),
            ("[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nfleet_size = 4\n[policies.p]\nlimits = [\n  { algorithm = \"fixed_window\", count = 3, period = \"1m\" },\n]\n".to_owned(), "line 7, column 3: policy `p`: 3 per 60s cannot be shared by `fleet_size = 4` processes"),
            ("[store]\nkind = \"memory\"\nfleet_size = 3\n".to_owned(), "line 3, column 14: `fleet_size` applies to `kind = \"redis\"` only"),
            ("[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nfleet_size = 0\n".to_owned(), "line 4, column 14: `fleet_size = 0`: give the number of limiterd processes"),
            ("".to_owned(), "no policies"),
            (policy("{ algorithm = \"leaky\", count = 1, period = \"1s\" }"), "line 3, column 17: `algorithm = \"leaky\"`"),
            (policy("{ algorithm = \"token_bucket\", count = 0, period = \"1s\" }"), "line 3, column 41: policy `p`: invalid limit: `count` is 0"),
            (policy("{ algorithm = \"token_bucket\", count = 5, period = \"1s\", burst = 0 }"), "line 3, column 67: policy `p`: invalid limit: `burst` is 0"),
            (policy("{ algorithm = \"token_bucket\", count = 1, period = \"1 sec\" }"), "line 3, column 53: `period = \"1 sec\"`: write a whole number with a unit"),
            (policy("{ algorithm = \"token_bucket\", count = -1, period = \"1s\" }"), "line 3, column 41: invalid value: number `-1`, expected a whole number from 0 to 18446744073709551615"),
            (policy("{ algorithm = \"fixed_window\", count = 10, period = \"1s\", burst = 20 }"), "line 3, column 3: policy `p`: invalid limit for the fixed window"),
            (policy("{ algorithm = \"token_bucket\", count = 1, period = \"1s\", key = \"ip\" }"), "line 3, column 65: `key = \"ip\"`: use \"identifier\""),
            ("[policies.\"bad name\"]\nlimits = []\n".to_owned(), "line 1, column 11: policy name \"bad name\""),
            ("[policies.p]\nlimits = []\n".to_owned(), "line 2, column 10: policy `p` has no limits"),
            // A table wherever one belongs: serde alone reads an array of every field by position.
            (policy("[\"fixed_window\", 10, \"1d\", 10, \"identifier\", \"5s\", \"UTC\"]"), "line 3, column 3: invalid type: array, expected a table"),
            ("store = [\"memory\"]\n".to_owned(), "line 1, column 9: invalid type: array, expected a table"),
            ("[policies]\np = [[{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }]]\n".to_owned(), "line 2, column 5: invalid type: array, expected a table"),
            ("[policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }]\non_failure = \"maybe\"\n".to_owned(), "line 3, column 14: `on_failure = \"maybe\"`"),
        ] {
            let got = error(&text);
            assert!(got.starts_with(want), "{text:?}\n got: {got}\nwant: {want}");
        }
}

#[test]
fn concurrency_limits_take_a_count_and_a_ttl_and_errors_name_the_fix() {
    let policy = |limits: &str| format!("[policies.p]\nlimits = [\n  {limits},\n]\n");
    let config = Config::parse(&policy(
        "{ algorithm = \"concurrency\", count = 3, ttl = \"90s\", key = \"global\" }",
    ))
    .expect("valid");
    let p = &config.policies["p"];
    assert!(p.limits.is_empty(), "no rate limits");
    let limit = p.concurrency.expect("a concurrency limit");
    assert_eq!(
        (limit.count, limit.ttl.as_secs(), limit.keying),
        (3, 90, Keying::Global)
    );
    let default =
        Config::parse(&policy("{ algorithm = \"concurrency\", count = 1 }")).expect("valid");
    assert_eq!(
        default.policies["p"].concurrency.map(|c| c.ttl),
        Some(DEFAULT_PERMIT_TTL)
    );
    for (limits, want) in [
        (
            "{ algorithm = \"concurrency\", count = 1, period = \"1s\" }",
            "line 3, column 52: policy `p`: a concurrency limit has no `period`",
        ),
        (
            "{ algorithm = \"concurrency\", count = 1, burst = 2 }",
            "line 3, column 51: policy `p`: a concurrency limit has no `burst`",
        ),
        (
            "{ algorithm = \"concurrency\", count = 0 }",
            "line 3, column 40: policy `p`: `count = 0` permits: give 1 to 1000000",
        ),
        (
            "{ algorithm = \"concurrency\", count = 1, ttl = \"0s\" }",
            "line 3, column 49: policy `p`: `ttl = \"0s\"`: write a period from 1ms",
        ),
        (
            "{ algorithm = \"concurrency\", count = 1, ttl = \"2d\" }",
            "line 3, column 49: policy `p`: `ttl = \"2d\"`",
        ),
        (
            "{ algorithm = \"concurrency\", count = 1 }, { algorithm = \"concurrency\", count = 2 }",
            "line 3, column 45: policy `p` has two concurrency limits",
        ),
        (
            "{ algorithm = \"token_bucket\", count = 1, period = \"1s\", ttl = \"1s\" }",
            "line 3, column 65: policy `p`: `ttl` belongs to a concurrency limit",
        ),
        (
            "{ algorithm = \"token_bucket\", count = 1 }",
            "line 3, column 3: policy `p`: a token_bucket limit needs a `period`",
        ),
    ] {
        let got = error(&policy(limits));
        assert!(got.starts_with(want), "{limits}\n got: {got}\nwant: {want}");
    }
}

#[test]
fn calendar_windows_name_a_zone_and_a_unit_and_errors_name_the_fix() {
    let policy = |limits: &str| format!("[policies.p]\nlimits = [\n  {limits},\n]\n");
    let config = Config::parse(&policy(
        "{ algorithm = \"fixed_window\", count = 1000, period = \"1mo\", calendar = \"Europe/Berlin\" }",
    ))
    .expect("valid");
    let spec = config.policies["p"].limits[0]
        .limit
        .calendar()
        .expect("a calendar");
    assert_eq!(
        (spec.unit, spec.zone),
        (limiter_calendar::CalendarUnit::Month, "Europe/Berlin")
    );
    for (limits, want) in [
        (
            "{ algorithm = \"fixed_window\", count = 1, period = \"1d\", calendar = \"Mars/Olympus\" }",
            "line 3, column 70: policy `p`: unknown time zone \"Mars/Olympus\"",
        ),
        (
            "{ algorithm = \"token_bucket\", count = 1, period = \"1d\", calendar = \"UTC\" }",
            "line 3, column 17: policy `p`: a `calendar` window is a fixed window",
        ),
        (
            "{ algorithm = \"fixed_window\", count = 1, period = \"30d\", calendar = \"UTC\" }",
            "line 3, column 53: policy `p`: a calendar period is \"1d\"",
        ),
        (
            "{ algorithm = \"fixed_window\", count = 1, period = \"1mo\" }",
            "line 3, column 53: `period = \"1mo\"`: write a whole number with a unit",
        ),
    ] {
        let got = error(&policy(limits));
        assert!(got.starts_with(want), "{limits}\n got: {got}\nwant: {want}");
    }
    let on_redis = format!(
        "[store]\nkind = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n{}",
        policy("{ algorithm = \"fixed_window\", count = 5, period = \"1d\", calendar = \"UTC\" }")
    );
    let on_redis = Config::parse(&on_redis).expect("valid on Redis too");
    assert!(
        on_redis.policies["p"].limits[0]
            .limit
            .is_quota_beside_stack()
    );
}

#[test]
fn too_many_limits_on_one_keying_are_refused() {
    let limit = "{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }";
    let text = format!("[policies.p]\nlimits = [\n{}\n]\n", [limit; 5].join(",\n"));
    assert!(error(&text).starts_with("line 7, column 1: policy `p` has more than 4 limits"));
}

#[test]
fn periods_have_units() {
    assert_eq!(parse_period("500ms"), Some(Duration::from_millis(500)));
    assert_eq!(parse_period("2h"), Some(Duration::from_secs(7200)));
    for bad in [
        "",
        "s",
        "1",
        "1.5s",
        "1 s",
        "-1s",
        "99999999999999999999d",
        "1w",
    ] {
        assert_eq!(parse_period(bad), None, "{bad}");
    }
}

#[test]
fn envoy_switches_come_from_the_table_or_the_references_environment() {
    let text = "[envoy]\nfiles = [\"a.yaml\"]\nresponse_headers = true\nlimit_header = \"X-RateLimit-Limit\"\nshadow_mode = false\n";
    let mut envoy = Config::parse(text).expect("valid").envoy.expect("envoy");
    let names = envoy.options.headers.clone().expect("enabled");
    assert_eq!(
        (names.limit.as_str(), names.remaining.as_str()),
        ("X-RateLimit-Limit", "RateLimit-Remaining")
    );
    let env = |name: &str| match name {
        "SHADOW_MODE" | "MERGE_DOMAIN_CONFIG" | "RESPONSE_DYNAMIC_METADATA" => {
            Some("true".to_owned())
        }
        "NEAR_LIMIT_RATIO" => Some("0.5".to_owned()),
        "LIMIT_LIMIT_HEADER" => Some("From-Env".to_owned()),
        _ => None,
    };
    envoy.apply_reference_env(env).expect("valid");
    // The file said shadow_mode and the header names; the environment fills in the rest.
    assert!(!envoy.options.shadow_mode);
    assert!(envoy.merge_domains && envoy.options.dynamic_metadata);
    assert!((envoy.options.near_limit_ratio - 0.5).abs() < f64::EPSILON);
    assert_eq!(
        envoy.options.headers.as_ref().map(|h| h.limit.as_str()),
        Some("X-RateLimit-Limit")
    );
    envoy.set_in_file = EnvoySwitches::default();
    let err = envoy
        .apply_reference_env(|n| (n == "NEAR_LIMIT_RATIO").then(|| "2".to_owned()))
        .expect_err("out of range");
    assert!(err.starts_with("NEAR_LIMIT_RATIO=\"2\""), "{err}");
    let err = Config::parse(
        "[envoy]\nfiles = [\"a.yaml\"]\nresponse_headers = true\nreset_header = \"bad header\"\n",
    )
    .expect_err("not a header name");
    assert!(err.to_string().contains("`reset_header`"), "{err}");
}

#[test]
fn auth_keys_are_digests_with_permissions_and_errors_name_their_place() {
    let head =
        "[policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }]\n";
    let digest = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";
    let ok = Config::parse(&format!(
        "{head}[auth]\nkeys = [{{ name = \"ci\", sha256 = \"{digest}\", permissions = [\"decide\", \"write_overrides\"] }}]\n"
    ))
    .expect("valid");
    assert_eq!(ok.auth.keys.len(), 1);
    assert!(ok.auth.keys[0].permissions.decide && !ok.auth.keys[0].permissions.read_overrides);
    // Protection follows the listener unless the file says.
    assert!(!ok.protects_native(true), "loopback: off by default");
    let public = Config::parse(&format!(
        "listen = \"0.0.0.0:8080\"\n{head}[auth]\nkeys = [{{ name = \"ci\", sha256 = \"{digest}\", permissions = [\"decide\"] }}]\n"
    ))
    .expect("valid");
    assert!(public.protects_native(true) && !public.protects_native(false));
    for (auth, line, needle) in [
        (
            "keys = [{ name = \"ci\", sha256 = \"test\", permissions = [] }]",
            4,
            "64 hex",
        ),
        (
            &format!(
                "keys = [{{ name = \"ci\", sha256 = \"{digest}\", permissions = [\"admin\"] }}]"
            ),
            4,
            "unknown permission",
        ),
        (
            &format!(
                "keys = [{{ name = \"ci\", sha256 = \"{digest}\", permissions = [] }}, {{ name = \"ci\", sha256 = \"{digest}\", permissions = [] }}]"
            ),
            4,
            "twice",
        ),
        ("colour = 1", 4, "colour"),
    ] {
        let err = Config::parse(&format!("{head}[auth]\n{auth}\n")).expect_err(auth);
        assert_eq!(err.line, Some(line), "{auth}: {err}");
        assert!(err.message.contains(needle), "{auth}: {err}");
    }
}

#[test]
fn overrides_per_namespace_are_bounded_by_the_file() {
    let head =
        "[policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 1, period = \"1s\" }]\n";
    let default = Config::parse(head).expect("valid");
    assert_eq!(default.overrides.max_per_namespace, DEFAULT_MAX_OVERRIDES);
    let set = Config::parse(&format!("{head}[overrides]\nmax_per_namespace = 3\n")).expect("valid");
    assert_eq!(set.overrides.max_per_namespace, 3);
    let zero =
        Config::parse(&format!("{head}[overrides]\nmax_per_namespace = 0\n")).expect_err("0");
    assert_eq!(zero.line, Some(4), "{zero}");
}

const POLICY: &str =
    "[policies.p]\nlimits = [{ algorithm = \"token_bucket\", count = 10, period = \"1m\" }]\n";

fn redis_store(store: &str) -> Result<RedisConnection, ConfigError> {
    let config = Config::parse(&format!("[store]\nkind = \"redis\"\n{store}{POLICY}"))?;
    match config.store {
        Store::Redis { connection, .. } => Ok(*connection),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_redis_store_takes_sentinel_logins_breakers_and_replicas() {
    let dir = std::env::temp_dir().join(format!("limiterd-store-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let secret = dir.join("password");
    std::fs::write(&secret, "from-a-file\n").unwrap();
    let connection = redis_store(&format!(
        "username = \"limiterd\"\npassword_file = {secret:?}\ntimeout_ms = 40\n\
         breaker_failures = 3\nbreaker_open_ms = 500\nwait_replicas = 1\n\
         [store.sentinel]\nmaster = \"mymaster\"\nsentinels = [\"redis://:sentinel-pw@10.0.0.1:26379\", \"redis://10.0.0.2\"]\n"
    ))
    .unwrap();
    let RedisAt::Sentinel(at) = &connection.at else {
        panic!("{connection:?}");
    };
    assert_eq!(at.master, "mymaster");
    assert_eq!(at.sentinels[1].addr().port(), 6379);
    assert_eq!(connection.login.username.as_deref(), Some("limiterd"));
    assert_eq!(connection.login.password, Some(PasswordFrom::File(secret)));
    assert_eq!(connection.breaker.failures_to_open, 3);
    assert_eq!(connection.breaker.open_for, Duration::from_millis(500));
    assert_eq!(
        connection.wait,
        Some(WaitFor {
            replicas: 1,
            timeout: Duration::from_millis(20)
        })
    );
    let shown = connection.at.to_string();
    assert_eq!(
        shown,
        "sentinel master `mymaster` via redis://:<redacted>@10.0.0.1:26379, redis://10.0.0.2:6379"
    );
    assert!(connection.builder().is_ok());
    // `--redis` names every topology.
    for (flag, shown) in [
        ("redis://u:pw@h:1", "redis://u:<redacted>@h:1"),
        (
            "cluster:redis://a:1,redis://b:2",
            "cluster via redis://a:1, redis://b:2",
        ),
        (
            "sentinel:m@redis://s:26379",
            "sentinel master `m` via redis://s:26379",
        ),
    ] {
        assert_eq!(RedisAt::from_flag(flag).unwrap().to_string(), shown);
    }
    let wrong = RedisAt::from_flag("10.0.0.1:6379").unwrap_err();
    assert!(
        wrong.contains("cluster:") && wrong.contains("sentinel:") && wrong.contains("[store]"),
        "{wrong}"
    );
}

#[test]
fn redis_settings_that_cannot_work_are_named_and_never_print_a_password() {
    let url = "url = \"redis://127.0.0.1:6379\"\n";
    for (store, want) in [
        (
            format!("{url}password = \"hunter2\"\npassword_env = \"X\"\n"),
            "line 5, column 16: give one of `password` and `password_env`, not both",
        ),
        (
            format!("{url}password = 12345\n"),
            "line 4, column 12: `password` must be a non-empty string",
        ),
        (
            format!("{url}password_env = \"LIMITERD_SURELY_UNSET\"\n"),
            "`password_env`: cannot read the secret in the environment variable `LIMITERD_SURELY_UNSET`: it is not set",
        ),
        (
            format!("{url}password_file = \"/surely/absent\"\n"),
            "`password_file`: cannot read the secret in /surely/absent",
        ),
        (
            format!("{url}breaker_failures = 5000\n"),
            "`breaker_failures`: outages in a row",
        ),
        (
            format!("{url}breaker_open_ms = 0\n"),
            "`breaker_open_ms`: how long an open breaker waits",
        ),
        (
            format!("{url}wait_replicas = 0\n"),
            "`wait_replicas`: replicas that must acknowledge each write, 1 to 16",
        ),
        (
            format!("{url}timeout_ms = 20\nwait_replicas = 1\nwait_timeout_ms = 20\n"),
            "`wait_timeout_ms = 20`: wait less than the call timeout",
        ),
        (
            format!("{url}wait_timeout_ms = 5\n"),
            "`wait_timeout_ms` applies with `wait_replicas` only",
        ),
        (
            format!("{url}[store.tls]\nca_file = \"ca.pem\"\n"),
            "`[store.tls]` is given but the URL says redis://",
        ),
        (
            "url = \"rediss://h:1\"\n[store.tls]\ncert_file = \"c.pem\"\n".to_owned(),
            "`[store.tls] cert_file` needs `key_file`",
        ),
        (
            "url = \"rediss://h:1\"\n[store.tls]\nca_file = \"/surely/absent.pem\"\n".to_owned(),
            "cannot read the TLS CA file /surely/absent.pem",
        ),
        (
            "url = \"redis://u:hunter2@h:notaport\"\n".to_owned(),
            "`url`: the Redis URL's port `notaport`",
        ),
        (
            "url = \"h:1\"\n".to_owned(),
            "`url`: a Redis URL starts with redis://",
        ),
        (
            "[store.sentinel]\nmaster = \"\"\nsentinels = [\"redis://s:1\"]\n".to_owned(),
            "`master` names the master the sentinels monitor",
        ),
        (
            "[store.sentinel]\nmaster = \"m\"\nsentinels = []\n".to_owned(),
            "`sentinels = []`: list at least one sentinel",
        ),
        (
            format!("{url}[store.sentinel]\nmaster = \"m\"\nsentinels = [\"redis://s:1\"]\n"),
            "give one of `url` (one server), `cluster` (a Redis Cluster's seed nodes) or `[store.sentinel]`, not several",
        ),
    ] {
        let got = redis_store(&store).unwrap_err().to_string();
        assert!(got.contains(want), "{store}: {got}");
        assert!(!got.contains("hunter2") && !got.contains("12345"), "{got}");
    }
    let memory = Config::parse(&format!(
        "[store]\nkind = \"memory\"\npassword_file = \"x\"\n{POLICY}"
    ))
    .unwrap_err()
    .to_string();
    assert!(
        memory.contains("`password_file` applies to `kind = \"redis\"` only"),
        "{memory}"
    );
    // A password written in the file is kept, and never printed.
    let inline = redis_store(&format!("{url}password = \"hunter2\"\n")).unwrap();
    assert!(!format!("{inline:?}").contains("hunter2"));
    assert_eq!(
        inline
            .login
            .password
            .as_ref()
            .map(PasswordFrom::describe)
            .as_deref(),
        Some("written in the configuration file")
    );
}
