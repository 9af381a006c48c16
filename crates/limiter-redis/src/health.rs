//! [`StoreHealth`]: what a probe of every master found, for readiness checks and status pages:
//! which masters answer, which cluster slots fail, whether the store can decide at all, and
//! why not in words an operator acts on.

use core::fmt::Write as _;
use core::ops::RangeInclusive;
use core::time::Duration;

use crate::error::BackendError;

/// How a backend reaches Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Deployment {
    /// One server.
    Server,
    /// The master a set of sentinels names.
    Sentinel,
    /// A Redis Cluster's masters.
    Cluster,
}

impl Deployment {
    /// `server`, `sentinel` or `cluster`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Server => "server",
            Self::Sentinel => "sentinel",
            Self::Cluster => "cluster",
        }
    }
}

/// One master as a probe found it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MasterHealth {
    /// `host:port`.
    pub addr: String,
    /// The cluster slots it serves (empty on one server or Sentinel).
    pub slots: Vec<RangeInclusive<u16>>,
    /// How long it took to answer, or why it did not.
    pub answer: Result<Duration, BackendError>,
    /// Whether its circuit breaker is open (its calls go to the failure policy).
    pub breaker_open: bool,
}

/// Sentinel's part of a probe.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SentinelHealth {
    /// The master's name the sentinels monitor.
    pub master_name: String,
    /// Sentinels that answered the probe.
    pub answering: usize,
    /// Sentinels configured.
    pub configured: usize,
}

/// What a probe of the store found ([`RedisBackend::health`](crate::RedisBackend::health)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreHealth {
    /// How the backend reaches Redis.
    pub deployment: Deployment,
    /// Every master, in slot order on a cluster.
    pub masters: Vec<MasterHealth>,
    /// On a cluster, the slots whose calls fail now (their master does not answer, or no
    /// master serves them); their keys follow the failure policy while every other slot's are
    /// decided on Redis.
    pub slots_failing: Vec<RangeInclusive<u16>>,
    /// Sentinel's part, on Sentinel.
    pub sentinel: Option<SentinelHealth>,
    /// Why the store cannot decide at all, if it cannot: no master answers, the cluster
    /// refuses commands (`cluster_state:fail`), or no sentinel names the master.
    pub down: Option<BackendError>,
}

impl StoreHealth {
    /// Whether the store can decide: `down` is `None`. A cluster with some slots failing is
    /// ready (its other slots decide on Redis); [`problem`](Self::problem) says which fail.
    pub fn is_ready(&self) -> bool {
        self.down.is_none()
    }

    /// Masters that answered.
    pub fn masters_answering(&self) -> usize {
        self.masters.iter().filter(|m| m.answer.is_ok()).count()
    }

    /// What is wrong, in words, if anything: why the store is down, or which masters and
    /// slots fail.
    pub fn problem(&self) -> Option<String> {
        let mut text = String::new();
        if let Some(down) = &self.down {
            text.push_str(&down.to_string());
        }
        let failing: Vec<&MasterHealth> =
            self.masters.iter().filter(|m| m.answer.is_err()).collect();
        if self.down.is_none() && !failing.is_empty() {
            let _ = write!(
                text,
                "{} of {} masters do not answer",
                failing.len(),
                self.masters.len()
            );
        }
        if !self.slots_failing.is_empty() {
            let sep = if text.is_empty() { "" } else { "; " };
            let _ = write!(
                text,
                "{sep}slots {} follow the failure policy",
                slot_ranges(&self.slots_failing)
            );
        }
        if self.down.is_none() {
            for master in failing {
                if let Err(e) = &master.answer {
                    let _ = write!(text, "; {}: {e}", master.addr);
                }
            }
        }
        (!text.is_empty()).then_some(text)
    }
}

/// `0-5460, 10923-16383`.
pub fn slot_ranges(ranges: &[RangeInclusive<u16>]) -> String {
    let mut text = String::new();
    for (i, range) in ranges.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        if range.start() == range.end() {
            let _ = write!(text, "{sep}{}", range.start());
        } else {
            let _ = write!(text, "{sep}{}-{}", range.start(), range.end());
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_problem_names_the_failing_masters_and_slots() {
        let health = StoreHealth {
            deployment: Deployment::Cluster,
            masters: vec![
                MasterHealth {
                    addr: "127.0.0.1:7000".into(),
                    slots: vec![0..=5460],
                    answer: Ok(Duration::from_micros(80)),
                    breaker_open: false,
                },
                MasterHealth {
                    addr: "127.0.0.1:7001".into(),
                    slots: vec![5461..=16383],
                    answer: Err(BackendError::Redis("connection refused".into())),
                    breaker_open: true,
                },
            ],
            slots_failing: vec![5461..=16383],
            sentinel: None,
            down: None,
        };
        assert!(health.is_ready());
        assert_eq!(health.masters_answering(), 1);
        let problem = health.problem().unwrap();
        assert!(
            problem.contains("1 of 2 masters do not answer"),
            "{problem}"
        );
        assert!(problem.contains("slots 5461-16383"), "{problem}");
        assert!(problem.contains("127.0.0.1:7001"), "{problem}");
        assert_eq!(slot_ranges(&[3..=3, 5..=9]), "3, 5-9");
    }
}
