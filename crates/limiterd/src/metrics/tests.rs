//! The metrics' tests: counts by policy and result, the exposition format, denial-log sampling.
use super::*;
use denials::TOP_DENIED_KEY_BYTES;

#[test]
fn counts_by_policy_name_and_failure_policy_with_escaped_labels() {
    let metrics = Metrics::new();
    let api = metrics.policy("api");
    api.count(Counted::Allowed, "u");
    api.count(Counted::Allowed, "u");
    api.count(Counted::Denied { shadow: false }, "u");
    api.count(Counted::Denied { shadow: true }, "u");
    api.count(Counted::Peeked, "u");
    api.count(Counted::BatchRefused, "u");
    // A second registration shares the counters.
    metrics.policy("api").count(Counted::Allowed, "u");
    metrics
        .policy("envoy:a\"b\\c\nd")
        .count(Counted::Denied { shadow: false }, "u");
    metrics.store_full(&"full");
    metrics.failure_policy(FailurePolicy::Closed);
    metrics.invalid();
    metrics.observe(Duration::from_micros(30));
    let text = metrics.render(7);
    for line in [
        "limiterd_decisions_total{policy=\"api\",result=\"allowed\"} 3",
        "limiterd_decisions_total{policy=\"api\",result=\"denied\"} 1",
        "limiterd_decisions_total{policy=\"api\",result=\"shadow_denied\"} 1",
        "limiterd_decisions_total{policy=\"api\",result=\"peeked\"} 1",
        "limiterd_decisions_total{policy=\"api\",result=\"batch_refused\"} 1",
        "limiterd_store_full_total 1",
        "limiterd_decisions_total{policy=\"envoy:a\\\"b\\\\c\\nd\",result=\"denied\"} 1",
        "limiterd_failure_policy_total{policy=\"closed\"} 1",
        "limiterd_failure_policy_total{policy=\"open\"} 0",
        "limiterd_failure_policy_total{policy=\"fallback\"} 0",
        "limiterd_invalid_requests_total 1",
        "limiterd_backend_errors_total 0",
        "limiterd_store_keys 7",
        "limiterd_request_duration_seconds_count 1",
        "limiterd_request_duration_seconds_bucket{le=\"0.00005\"} 1",
        "limiterd_request_duration_seconds_bucket{le=\"0.000025\"} 0",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing from\n{text}"
        );
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
    let totals = metrics.totals();
    assert_eq!(totals["api"].allowed, 3);
    assert_eq!(totals["api"].shadow_denied, 1);
    // Only enforced denials are in the sketch.
    let top = metrics.top_denied();
    assert_eq!(top.len(), 2, "{top:?}");
    assert!(top.iter().all(|h| h.denied == 1 && h.identifier == "u"));
}

#[test]
fn top_denied_finds_the_heavy_hitters_in_bounded_memory() {
    let mut top = TopDenied::default();
    // 3 heavy identifiers among 10,000 one-off ones, interleaved.
    let mut truth = std::collections::HashMap::new();
    for i in 0..10_000u32 {
        top.record("api", &format!("once-{i}"));
        if i % 10 == 0 {
            for heavy in ["h1", "h2", "h3"] {
                top.record("api", heavy);
                *truth.entry(heavy).or_insert(0u64) += 1;
            }
        }
        assert!(top.entries.len() <= TOP_DENIED);
    }
    let found = top.top();
    assert_eq!(found.len(), TOP_DENIED);
    for (rank, hit) in found.iter().take(3).enumerate() {
        assert!(hit.identifier.starts_with('h'), "rank {rank}: {found:?}");
        let exact = truth[hit.identifier.as_str()];
        // Never under the truth, at most `error` over it.
        assert!(
            hit.denied >= exact && hit.denied - hit.error <= exact,
            "{hit:?} vs {exact}"
        );
    }
    // The same identifier under another policy is another entry; long ones are cut and
    // still counted together.
    let long = "x".repeat(1_000);
    let mut top = TopDenied::default();
    top.record("a", "u");
    top.record("b", "u");
    top.record("a", &long);
    top.record("a", &long);
    let found = top.top();
    assert_eq!(found.len(), 3, "{found:?}");
    assert_eq!(found[0].denied, 2);
    assert_eq!(
        found[0].identifier.len(),
        TOP_DENIED_KEY_BYTES + '…'.len_utf8()
    );
}

#[test]
fn store_health_gauges_follow_the_last_probe_and_drop_masters_no_longer_known() {
    let metrics = Metrics::new();
    let master = |addr, slots, answering, breaker_open| MasterReading {
        addr,
        slots,
        answering,
        breaker_open,
    };
    // In memory: ready, reachable, no masters.
    metrics.set_store(&StoreReading {
        ready: true,
        reachable: true,
        ..StoreReading::default()
    });
    let text = metrics.render(0);
    for line in [
        "limiterd_ready 1",
        "limiterd_store_reachable 1",
        "limiterd_store_masters 0",
        "limiterd_store_masters_answering 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(!text.contains("limiterd_store_master_up{"), "{text}");

    // A cluster with its third master down and its breaker open: still ready.
    metrics.set_store(&StoreReading {
        ready: true,
        reachable: true,
        masters: vec![
            master("10.0.0.1:6379", "0-5460", true, false),
            master("10.0.0.2:6379", "5461-10922", true, false),
            master("10.0.0.3:6379", "10923-16383", false, true),
        ],
        sentinels: None,
    });
    let text = metrics.render(0);
    for line in [
        "limiterd_store_masters 3",
        "limiterd_store_masters_answering 2",
        "limiterd_store_master_up{master=\"10.0.0.1:6379\",slots=\"0-5460\"} 1",
        "limiterd_store_master_up{master=\"10.0.0.3:6379\",slots=\"10923-16383\"} 0",
        "limiterd_store_master_breaker_open{master=\"10.0.0.3:6379\"} 1",
        "limiterd_store_master_breaker_open{master=\"10.0.0.1:6379\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }

    // Sentinel named a new master, and a shutdown began: the old master's series are gone.
    metrics.set_store(&StoreReading {
        ready: false,
        reachable: true,
        masters: vec![master("10.0.0.9:6379", "", true, false)],
        sentinels: Some((2, 3)),
    });
    let text = metrics.render(0);
    for line in [
        "limiterd_ready 0",
        "limiterd_store_masters 1",
        "limiterd_store_master_up{master=\"10.0.0.9:6379\",slots=\"\"} 1",
        "limiterd_store_sentinels 3",
        "limiterd_store_sentinels_answering 2",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(!text.contains("10.0.0.3:6379"), "{text}");
}

/// The request duration histogram, kept without a lock: each observation in the bucket of the
/// least bound at or above it (cumulative in the exposition), the count the buckets' sum, the
/// sum exact; and observed from several threads at once, none is lost.
#[test]
fn request_durations_are_bucketed_summed_and_never_lost_across_threads() {
    let metrics = Arc::new(Metrics::new());
    for took in [
        Duration::from_micros(25),    // at a bound: in it
        Duration::from_nanos(25_001), // just above: the next
        Duration::from_millis(3),
        Duration::from_secs(2), // above every bound: +Inf only
    ] {
        metrics.observe(took);
    }
    let text = metrics.render(0);
    for line in [
        "limiterd_request_duration_seconds_bucket{le=\"0.000025\"} 1",
        "limiterd_request_duration_seconds_bucket{le=\"0.00005\"} 2",
        "limiterd_request_duration_seconds_bucket{le=\"0.0025\"} 2",
        "limiterd_request_duration_seconds_bucket{le=\"0.005\"} 3",
        "limiterd_request_duration_seconds_bucket{le=\"1.0\"} 3",
        "limiterd_request_duration_seconds_bucket{le=\"+Inf\"} 4",
        "limiterd_request_duration_seconds_count 4",
        "limiterd_request_duration_seconds_sum 2.003050001",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "{line:?} missing from\n{text}"
        );
    }

    let metrics = Arc::new(Metrics::new());
    let (threads, each) = (4_u64, 10_000_u64);
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let metrics = Arc::clone(&metrics);
            std::thread::spawn(move || {
                for i in 0..each {
                    metrics.observe(Duration::from_nanos(t * 1_000_000 + i));
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("no panic");
    }
    let text = metrics.render(0);
    let count = threads * each;
    let sum_nanos: u64 = (0..threads)
        .map(|t| t * 1_000_000 * each + each * (each - 1) / 2)
        .sum();
    assert!(
        text.lines()
            .any(|l| l == format!("limiterd_request_duration_seconds_count {count}")),
        "{text}"
    );
    let sum_line = text
        .lines()
        .find(|l| l.starts_with("limiterd_request_duration_seconds_sum "))
        .expect("a sum");
    let sum: f64 = sum_line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        (sum - sum_nanos as f64 / 1e9).abs() < 1e-9,
        "{sum_line} vs {sum_nanos} ns"
    );
}
