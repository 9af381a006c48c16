//! `target/bench-report.md`: the targets' table, what bounds the stack and Redis targets, each
//! group's subjects against their peer and floor, and the bytes per key.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::results::{Measured, Readings, find, peer_of};
use super::targets::{spread, targets};

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let rustc = std::process::Command::new("rustc")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .unwrap_or_default();
    format!("{cpus} CPUs ({model}), {}", rustc.trim())
}

fn time(ns: f64) -> String {
    if ns >= 1_000_000.0 {
        format!("{:.2} ms", ns / 1_000_000.0)
    } else if ns >= 1_000.0 {
        format!("{:.2} µs", ns / 1_000.0)
    } else {
        format!("{ns:.1} ns")
    }
}

fn rate(per_second: f64) -> String {
    if per_second >= 1e6 {
        format!("{:.1} M/s", per_second / 1e6)
    } else if per_second >= 1e3 {
        format!("{:.1} k/s", per_second / 1e3)
    } else {
        format!("{per_second:.0} /s")
    }
}

/// What a decision costs Redis, from the `redis_server` bench: each subject's µs of server CPU
/// per decision (the median over its passes), against the `GET` + `SET PX` script, and the
/// decisions one Redis core serves at that cost.
fn server_context(readings: &Readings) -> Vec<(String, f64, f64, f64)> {
    let mut subjects: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for pass in &readings.server {
        for (subject, usec) in pass {
            subjects.entry(subject).or_default().push(*usec);
        }
    }
    let floor = subjects
        .get("floor_get_set_px")
        .and_then(|v| spread(v.clone()))
        .map(|(median, ..)| median);
    subjects
        .into_iter()
        // Wall-clock rows are not CPU: the WAIT line reports them.
        .filter(|(subject, _)| !subject.starts_with("wall_"))
        .filter_map(|(subject, values)| {
            let (median, ..) = spread(values)?;
            let ratio = floor.map_or(f64::NAN, |f| median / f);
            Some((subject.to_owned(), median, ratio, 1e6 / median))
        })
        .collect()
}

/// The wall-clock µs of one decision after another without and with waiting for a replica
/// (medians over the `redis_server` passes).
fn wait_cost(readings: &Readings) -> Option<(f64, f64)> {
    let median = |subject: &str| {
        spread(
            readings
                .server
                .iter()
                .filter_map(|p| p.get(subject).copied())
                .collect(),
        )
        .map(|(m, ..)| m)
    };
    Some((median("wall_one_limit")?, median("wall_wait_1_replica")?))
}

/// What explains the stack target: how much of one check and of a 3-layer transaction is
/// synchronisation alone (a clock reading, shard read locks taken and released, uncontended
/// compare-exchanges, each measured on its own in the same group; parts measured alone
/// overlap less than in a call, so their sum can exceed the call), what the target leaves
/// beyond the transaction's measured floor and what the stack spends there, and what the same
/// three checks cost without a transaction. Each row is a label, its value (absent when a row
/// it needs was not measured) and its unit.
fn stack_context(results: &[Measured]) -> Vec<(&'static str, Option<f64>, &'static str)> {
    let mut rows = stack_floors(results);
    rows.extend(stack_ratios(results));
    rows
}

/// What one check and a 3-layer transaction cost at least: their synchronisation, and the
/// floor against what the stacks spend.
fn stack_floors(results: &[Measured]) -> Vec<(&'static str, Option<f64>, &'static str)> {
    let median = |f: &str| Some(find(results, "stack", f)?.median);
    let ratio = |ours: &str, theirs: &str| Some(median(ours)? / median(theirs)?);
    // A clock reading, `locks` shard read locks and `exchanges` compare-exchanges.
    let sync = |locks: f64, exchanges: f64| {
        Some(median("clock")? + locks * median("read_lock")? + exchanges * median("cas")?)
    };
    let one_check = median("one_check");
    let transaction_sync = sync(2.0, 3.0);
    vec![
        (
            "One check / its synchronisation alone (clock, 1 shard read lock, 1 compare-exchange)",
            one_check.zip(sync(1.0, 1.0)).map(|(one, sync)| one / sync),
            "×",
        ),
        (
            "Floor of a 3-layer transaction locking each entry (clock, 2 locked lookups, 3 entry locks) / one check",
            ratio("floor", "one_check"),
            "×",
        ),
        (
            "The floor's synchronisation alone (clock, 2 shard read locks, 3 compare-exchanges) / one check",
            transaction_sync
                .zip(one_check)
                .map(|(sync, one)| sync / one),
            "×",
        ),
        (
            "Left at the target beyond the floor, for deciding three limits and the answer (2.0 × one check − the floor)",
            one_check
                .zip(median("floor"))
                .map(|(one, floor)| 2.0 * one - floor),
            " ns",
        ),
        (
            "What a stack of 3 spends beyond the floor (stack of 3 − the floor)",
            median("stack_3")
                .zip(median("floor"))
                .map(|(stack, floor)| stack - floor),
            " ns",
        ),
    ]
}

/// The stacks against the floor, a sketch typed at compile time, our limiters in sequence
/// and each other.
fn stack_ratios(results: &[Measured]) -> Vec<(&'static str, Option<f64>, &'static str)> {
    let median = |f: &str| Some(find(results, "stack", f)?.median);
    let ratio = |ours: &str, theirs: &str| Some(median(ours)? / median(theirs)?);
    vec![
        (
            "The floor deciding every limit (static dispatch), answers as they come / one check",
            ratio("floor_deciding", "one_check"),
            "×",
        ),
        ("Stack of 3 / the floor", ratio("stack_3", "floor"), "×"),
        (
            "A sketch of the stack's lean path typed at compile time (each entry locked; keyers and limits as type parameters; answers as they come) / one check",
            ratio("typed_sketch", "one_check"),
            "×",
        ),
        (
            "Stack of 3 / the typed sketch (run-time layers and the answer, less what the commit lock saves)",
            ratio("stack_3", "typed_sketch"),
            "×",
        ),
        (
            "Stack of 3 / our three limiters checked in sequence, no transaction",
            ratio("stack_3", "ours_3_in_sequence"),
            "×",
        ),
        (
            "Stack of 3 / a stack of 1",
            ratio("stack_3", "stack_1"),
            "×",
        ),
        (
            "One check with its whole answer read / one check (the target's subject reads only the admission, and an inlined check computes only that)",
            ratio("one_check_answer", "one_check"),
            "×",
        ),
        (
            "Stack of 3 on one key (one lookup) / one check with its whole answer read",
            ratio("stack_3_one_key", "one_check_answer"),
            "×",
        ),
        (
            "Stack of 3 on one key / a stack of 1",
            ratio("stack_3_one_key", "stack_1"),
            "×",
        ),
    ]
}

/// limiterd over loopback, from the `limiterd` group: each way of asking for a decision
/// against the HTTP floor (`GET /healthz` on the same kind of connection), and envoy's gRPC
/// decisions per second on one connection.
fn service_context(results: &[Measured]) -> Vec<(&'static str, Option<f64>, &'static str)> {
    let median = |f: &str| Some(find(results, "limiterd", f)?.median);
    let ratio = |ours: &str| Some(median(ours)? / median("floor")?);
    vec![
        (
            "gRPC `ShouldRateLimit` (one descriptor) / the HTTP floor",
            ratio("grpc_should_rate_limit"),
            "×",
        ),
        (
            "`POST /json` (the same request as JSON) / the HTTP floor",
            ratio("json_decision"),
            "×",
        ),
        (
            "`POST /v1/ratelimit` / the HTTP floor",
            ratio("http_decision"),
            "×",
        ),
        (
            "gRPC `ShouldRateLimit` decisions per second, one connection, one at a time",
            median("grpc_should_rate_limit").map(|ns| 1e9 / ns),
            " /s",
        ),
        (
            "The HTTP floor: `GET /healthz` per second, one connection, one at a time",
            median("floor").map(|ns| 1e9 / ns),
            " /s",
        ),
    ]
}

/// The report: the targets over every pass; the rest from the first.
pub(super) fn render(passes: &[Vec<Measured>], readings: &Readings, quick: bool) -> String {
    let results: &[Measured] = passes.first().map_or(&[], Vec::as_slice);
    let mut out = String::new();
    let _ = writeln!(out, "# Benchmark report\n");
    let _ = writeln!(
        out,
        "`cargo xtask bench{}` on {}. {}\n",
        if quick { " --quick" } else { "" },
        machine(),
        if quick {
            "Quick mode: short samples, noisier medians."
        } else {
            "Full mode."
        }
    );
    let _ = writeln!(
        out,
        "Medians per iteration. An iteration is one call, except in the `2_threads` groups, \
         where it is one call on each of two threads (the slower thread's time), so throughput \
         there is the aggregate. Ratios divide this subject's time by the peer's or the floor's \
         from the same group and run: below 1 is faster. The peer is governor (or the raw \
         `EVALSHA` for Redis); the floor is the least any implementation must do (a clock \
         reading, an atomic load and a compare-exchange; a map lookup first when keyed; for the \
         3-layer stack, a clock reading, two lookups under shard read locks and three entry \
         locks, each released after a write: the floor of a commit that locks each entry, where \
         a stack with a global layer takes that layer's lock alone).\n"
    );
    let _ = writeln!(
        out,
        "## Targets\n\nOn the defaults a user gets (default clock, store and features). Each \
         ratio is the median over the passes that measured it, with its spread (min–max); a \
         target is met only when the whole spread is within it.\n\n\
         | target | median | spread | passes | met |\n| --- | --- | --- | --- | --- |"
    );
    write_targets(&mut out, passes, readings);
    write_stack_context(&mut out, results);
    write_server_context(&mut out, readings);
    write_service_context(&mut out, results);
    write_groups(&mut out, results);
    write_memory(&mut out, &readings.memory);
    out
}

/// Each target's row: its median and spread over the passes, met or not.
fn write_targets(out: &mut String, passes: &[Vec<Measured>], readings: &Readings) {
    for t in targets() {
        let line = match spread(t.values(passes, readings)) {
            Some((median, low, high, n)) => {
                let met = if (t.holds)(low) && (t.holds)(high) {
                    "yes"
                } else {
                    "**no**"
                };
                format!(
                    "| {} | {median:.2}{u} | {low:.2}–{high:.2}{u} | {n} | {met} |",
                    t.what,
                    u = t.unit
                )
            }
            None => format!("| {} | not measured in this run | — | 0 | — |", t.what),
        };
        let _ = writeln!(out, "{line}");
    }
}

/// What bounds the stack target (the rows measured in this run).
fn write_stack_context(out: &mut String, results: &[Measured]) {
    let context: Vec<_> = stack_context(results)
        .into_iter()
        .filter_map(|(what, value, unit)| Some((what, value?, unit)))
        .collect();
    if !context.is_empty() {
        out.push_str("\nWhat bounds the stack target:\n\n| quantity | measured |\n| --- | --- |\n");
        for (what, value, unit) in context {
            let _ = writeln!(out, "| {what} | {value:.2}{unit} |");
        }
    }
}

/// What a decision costs Redis, and waiting for a replica.
fn write_server_context(out: &mut String, readings: &Readings) {
    let server = server_context(readings);
    if !server.is_empty() {
        out.push_str(
            "\nWhat a decision costs Redis (`redis_server`: µs of server CPU per decision from \
             `INFO commandstats`, median over its passes; 2,000 keys; the floors beside ours):\n\n\
             | subject | µs per decision | × `GET` + `SET PX` | decisions/s per Redis core |\n\
             | --- | --- | --- | --- |\n",
        );
        for (subject, usec, ratio, per_core) in server {
            let _ = writeln!(
                out,
                "| {subject} | {usec:.2} | {ratio:.2} | {} |",
                rate(per_core)
            );
        }
        if let Some((plain, waiting)) = wait_cost(readings) {
            let _ = writeln!(
                out,
                "\nWaiting for one replica (`wait_for_replicas`, one decision after another): \
                 {waiting:.1} µs a decision against {plain:.1} without, +{:.1} µs of wall-clock \
                 time (`wait_1_replica` above is its Redis CPU).",
                waiting - plain
            );
        }
    }
}

/// limiterd against its HTTP floor.
fn write_service_context(out: &mut String, results: &[Measured]) {
    let service: Vec<_> = service_context(results)
        .into_iter()
        .filter_map(|(what, value, unit)| Some((what, value?, unit)))
        .collect();
    if !service.is_empty() {
        out.push_str(
            "\nlimiterd over loopback sockets (one connection, one request at a time; the \
             floor is `GET /healthz`):\n\n| quantity | measured |\n| --- | --- |\n",
        );
        for (what, value, unit) in service {
            let _ = writeln!(out, "| {what} | {value:.2}{unit} |");
        }
    }
}

/// Each group's subjects against the group's peer and floor.
fn write_groups(out: &mut String, results: &[Measured]) {
    let mut groups: BTreeMap<&str, Vec<&Measured>> = BTreeMap::new();
    for m in results {
        groups.entry(m.group.as_str()).or_default().push(m);
    }
    for (name, members) in &groups {
        let peer = peer_of(members);
        let median_of = |f: &str| members.iter().find(|m| m.function == f).map(|m| m.median);
        let peer_median = peer.and_then(median_of);
        let floor_median = median_of("floor");
        let _ = writeln!(
            out,
            "\n## {name}\n\n| subject | median | throughput | × {} | × floor |\n| --- | --- | --- | --- | --- |",
            peer.unwrap_or("peer")
        );
        for m in members {
            let per_second = m.elements as f64 / m.median * 1e9;
            let vs =
                |other: Option<f64>| other.map_or("—".into(), |o| format!("{:.2}", m.median / o));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} |",
                m.function,
                time(m.median),
                rate(per_second),
                vs(peer_median),
                vs(floor_median)
            );
        }
    }
}

/// Resident bytes per key, against governor's.
fn write_memory(out: &mut String, memory: &BTreeMap<String, f64>) {
    if !memory.is_empty() {
        out.push_str("\n## Resident bytes per key at 1M keys\n\n| subject | B/key | × governor |\n| --- | --- | --- |\n");
        let governor = memory.get("keyed_governor").copied();
        for (name, per_key) in memory {
            let vs = governor.map_or("—".into(), |g| format!("{:.2}", per_key / g));
            let _ = writeln!(out, "| {name} | {per_key:.1} | {vs} |");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_rows_compare_with_the_http_floor() {
        let measured = |function: &str, median: f64| Measured {
            group: "limiterd".into(),
            function: function.into(),
            median,
            elements: 1,
        };
        let results = vec![
            measured("floor", 20_000.0),
            measured("grpc_should_rate_limit", 50_000.0),
        ];
        let report = render(&[results], &Readings::default(), true);
        assert!(
            report.contains("| gRPC `ShouldRateLimit` (one descriptor) / the HTTP floor | 2.50× |"),
            "{report}"
        );
        assert!(
            report.contains("one connection, one at a time | 20000.00 /s |"),
            "{report}"
        );
        // Rows whose subject was not measured are left out.
        assert!(!report.contains("`POST /json`"), "{report}");
    }

    #[test]
    fn server_targets_take_their_spread_from_the_redis_server_passes() {
        let pass = |bucket: f64| {
            [
                ("floor_get_set_px", 4.0),
                ("one_limit_token_bucket", bucket),
                ("coalesced_16", 1.0),
            ]
            .into_iter()
            .map(|(s, v)| (s.to_owned(), v))
            .collect()
        };
        let readings = Readings {
            server: vec![pass(5.0), pass(6.4), pass(5.6)],
            ..Readings::default()
        };
        let report = render(&[], &readings, false);
        // 5.6 / 4 is the median; 6.4 / 4 = 1.6 is past 1.5 in one pass: not met.
        assert!(
            report.contains("token bucket: ≤ 1.5× a `GET` + `SET PX` script's | 1.40× | 1.25–1.60× | 3 | **no** |"),
            "{report}"
        );
        assert!(
            report.contains("16 callers coalesced: ≤ 0.5× a `GET` + `SET PX` script's | 0.25× | 0.25–0.25× | 3 | yes |"),
            "{report}"
        );
        assert!(
            report.contains("| one_limit_token_bucket | 5.60 | 1.40 | 178.6 k/s |"),
            "{report}"
        );
        assert!(
            report.contains(
                "a policy of three limits: ≤ 3× a `GET` + `SET PX` script's | not measured"
            )
        );
    }

    #[test]
    fn renders_each_group_against_its_peer_and_floor_and_the_targets() {
        let measured = |group: &str, function: &str, median: f64| Measured {
            group: group.into(),
            function: function.into(),
            median,
            elements: 1,
        };
        let m = |f: &str, median: f64| measured("direct_allow_1_thread", f, median);
        let results = [
            m("floor", 10.0),
            m("governor", 40.0),
            m("token_bucket", 30.0),
        ];
        let report = render(&[results.to_vec()], &Readings::default(), true);
        assert!(
            report.contains("| token_bucket | 30.0 ns | 33.3 M/s | 0.75 | 3.00 |"),
            "{report}"
        );
        assert!(
            report.contains(
                "| Direct allow, 1 thread: token bucket time ≤ 1.0× governor's | 0.75× | 0.75–0.75× | 1 | yes |"
            ),
            "{report}"
        );
        assert!(report.contains(
            "Stack of 3 layers on different keys (two keys and a global one): time ≤ 2.0× one keyed check | not measured"
        ));
        assert!(
            report.contains(
                "| Direct allow, 1 thread: token bucket time ≤ 1.05× the floor in the same group (clock, load, compare-exchange) | 3.00× | 3.00–3.00× | 1 | **no** |"
            ),
            "{report}"
        );
        assert!(!report.contains("What bounds the stack target"), "{report}");
        assert_eq!(rate(5_236.0), "5.2 k/s");

        let s = |f: &str, median: f64| measured("stack", f, median);
        let stacked = [
            s("one_check", 60.0),
            s("floor", 90.0),
            s("stack_1", 100.0),
            s("stack_3", 180.0),
        ];
        let report = render(&[stacked.to_vec()], &Readings::default(), false);
        assert!(
            report.contains(
                "| Stack of 3 layers on different keys (two keys and a global one): time ≤ 2.0× one keyed check | 3.00× | 3.00–3.00× | 1 | **no** |"
            ),
            "{report}"
        );
        // Over three passes: the median of 0.9, 1.1 and 0.95, and not met, as one pass is out.
        let passes: Vec<Vec<Measured>> = [36.0, 44.0, 38.0]
            .into_iter()
            .map(|ours| vec![m("governor", 40.0), m("token_bucket", ours)])
            .collect();
        let repeated = render(&passes, &Readings::default(), false);
        assert!(
            repeated.contains("governor's | 0.95× | 0.90–1.10× | 3 | **no** |"),
            "{repeated}"
        );
        assert!(report.contains("/ one check | 1.50× |"), "{report}");
        assert!(
            report.contains("| Stack of 3 / the floor | 2.00× |"),
            "{report}"
        );
        assert!(
            report.contains("| Stack of 3 / a stack of 1 | 1.80× |"),
            "{report}"
        );
        // Not measured in this run: left out rather than shown empty.
        assert!(!report.contains("in sequence, no transaction"), "{report}");
        assert!(!report.contains("synchronisation"), "{report}");

        // 2 × 60 − 90 = 30 ns left at the target beyond the floor; the stack spends 180 − 90.
        assert!(report.contains("− the floor) | 30.00 ns |"), "{report}");
        assert!(
            report.contains("(stack of 3 − the floor) | 90.00 ns |"),
            "{report}"
        );

        // With the parts measured: 20 + 10 + 5 = 35 ns of one check's 60 is synchronisation,
        // and 20 + 2 × 10 + 3 × 5 = 55 ns of a transaction's.
        let parts = [s("clock", 20.0), s("read_lock", 10.0), s("cas", 5.0)];
        let report = render(
            &[[&stacked[..], &parts[..]].concat()],
            &Readings::default(),
            false,
        );
        assert!(report.contains("1 compare-exchange) | 1.71× |"), "{report}");
        assert!(
            report.contains("3 compare-exchanges) / one check | 0.92× |"),
            "{report}"
        );
        assert!(!report.contains("floor deciding"), "{report}");

        // With the deciding floor and the typed sketch measured: 72 / 60, 75 / 60, 180 / 75.
        let deciding = [s("floor_deciding", 72.0), s("typed_sketch", 75.0)];
        let report = render(
            &[[&stacked[..], &deciding[..]].concat()],
            &Readings::default(),
            false,
        );
        assert!(
            report.contains("as they come / one check | 1.20× |"),
            "{report}"
        );
        assert!(
            report.contains("answers as they come) / one check | 1.25× |"),
            "{report}"
        );
        assert!(
            report.contains(
                "(run-time layers and the answer, less what the commit lock saves) | 2.40× |"
            ),
            "{report}"
        );
    }
}
