//! What a `cargo xtask bench` run reads back: each benchmark's median from criterion's files,
//! and what the benches write beside them (bytes per key, counts, the `redis_server` passes).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// One benchmark's median.
#[derive(Debug, Clone)]
pub(super) struct Measured {
    pub(super) group: String,
    pub(super) function: String,
    /// Nanoseconds per iteration.
    pub(super) median: f64,
    /// Calls per iteration (2 for the two-thread groups).
    pub(super) elements: u64,
}

fn files_named(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_named(&path, name, out);
        } else if path.file_name().is_some_and(|n| n == name)
            && path
                .parent()
                .and_then(Path::file_name)
                .is_some_and(|p| p == "new")
        {
            out.push(path);
        }
    }
}

/// What the report reads of one benchmark's criterion files: its group and function (from
/// `benchmark.json`), the median's point estimate (from `estimates.json`, in ns) and the
/// elements per iteration (`throughput.Elements`, 1 when absent).
fn parse_criterion(meta: &str, estimates: &str) -> Option<Measured> {
    let meta: serde_json::Value = serde_json::from_str(meta).ok()?;
    let estimates: serde_json::Value = serde_json::from_str(estimates).ok()?;
    Some(Measured {
        group: meta["group_id"].as_str()?.to_owned(),
        function: meta["function_id"].as_str().unwrap_or_default().to_owned(),
        median: estimates["median"]["point_estimate"].as_f64()?,
        elements: meta["throughput"]["Elements"].as_u64().unwrap_or(1),
    })
}

pub(super) fn collect(dir: &Path, since: SystemTime) -> Vec<Measured> {
    let mut found = Vec::new();
    files_named(dir, "estimates.json", &mut found);
    let mut out = Vec::new();
    for estimates in found {
        let fresh = std::fs::metadata(&estimates)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t >= since);
        if !fresh {
            continue;
        }
        let (Ok(est), Ok(meta)) = (
            std::fs::read_to_string(&estimates),
            std::fs::read_to_string(estimates.with_file_name("benchmark.json")),
        ) else {
            continue;
        };
        if let Some(measured) = parse_criterion(&meta, &est) {
            out.push(measured);
        }
    }
    out.sort_by(|a, b| (&a.group, &a.function).cmp(&(&b.group, &b.function)));
    out
}

/// What the benchmarks write beside criterion's results, read from the first pass.
#[derive(Default)]
pub(super) struct Readings {
    /// `name -> resident bytes per key` (`target/bench-bytes-per-key.csv`).
    pub(super) memory: BTreeMap<String, f64>,
    /// `name -> a count per decision`, such as script calls (`target/bench-counts.csv`).
    pub(super) counts: BTreeMap<String, f64>,
    /// Per pass of the `redis_server` bench: `subject -> µs of Redis CPU per decision`
    /// (`target/bench-redis-server.csv`).
    pub(super) server: Vec<BTreeMap<String, f64>>,
}

/// The `redis_server` bench's passes (`subject,pass,µs` lines), if written during this run.
pub(super) fn server_passes(csv: &Path, since: SystemTime) -> Vec<BTreeMap<String, f64>> {
    let fresh = std::fs::metadata(csv)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since);
    let mut passes: BTreeMap<usize, BTreeMap<String, f64>> = BTreeMap::new();
    if !fresh {
        return Vec::new();
    }
    for line in std::fs::read_to_string(csv).unwrap_or_default().lines() {
        let mut fields = line.split(',');
        if let (Some(subject), Some(Ok(pass)), Some(Ok(usec))) = (
            fields.next(),
            fields.next().map(str::parse::<usize>),
            fields.next().map(str::parse::<f64>),
        ) {
            passes
                .entry(pass)
                .or_default()
                .insert(subject.to_owned(), usec);
        }
    }
    passes.into_values().collect()
}

/// `name -> value` (the value is the line's `column`th comma-separated field after the
/// name's), the last line for each name written during this run.
pub(super) fn csv_values(csv: &Path, since: SystemTime, column: usize) -> BTreeMap<String, f64> {
    let fresh = std::fs::metadata(csv)
        .and_then(|m| m.modified())
        .is_ok_and(|t| t >= since);
    let mut out = BTreeMap::new();
    if !fresh {
        return out;
    }
    let text = std::fs::read_to_string(csv).unwrap_or_default();
    for line in text.lines() {
        let mut parts = line.split(',');
        if let (Some(name), Some(value)) = (parts.next(), parts.nth(column - 1))
            && let Ok(value) = value.parse::<f64>()
        {
            out.insert(name.to_owned(), value);
        }
    }
    out
}

/// The subject a group's others are compared with, and its floor.
pub(super) fn peer_of(group: &[&Measured]) -> Option<&'static str> {
    ["governor", "governor_1", "raw_evalsha"]
        .into_iter()
        .find(|p| group.iter().any(|m| m.function == *p))
}

pub(super) fn find<'a>(
    results: &'a [Measured],
    group: &str,
    function: &str,
) -> Option<&'a Measured> {
    results
        .iter()
        .find(|m| m.group == group && m.function == function)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_criterion_json() {
        let meta = r#"{"group_id":"direct_allow_1_thread","function_id":"token_bucket","value_str":null,"throughput":{"Elements":2},"full_id":"x"}"#;
        let est = r#"{"mean":{"point_estimate":99.0},"median":{"confidence_interval":{"lower_bound":1.0},"point_estimate":12.5,"standard_error":0.1}}"#;
        let parsed = parse_criterion(meta, est).expect("criterion's files");
        assert_eq!(parsed.group, "direct_allow_1_thread");
        assert_eq!(parsed.function, "token_bucket");
        assert_eq!((parsed.median, parsed.elements), (12.5, 2));
        // No throughput: one element; a missing median: not measured.
        let plain = parse_criterion(r#"{"group_id":"g","function_id":"f"}"#, est).unwrap();
        assert_eq!(plain.elements, 1);
        assert!(parse_criterion(meta, r#"{"mean":{"point_estimate":1.0}}"#).is_none());
    }
}
