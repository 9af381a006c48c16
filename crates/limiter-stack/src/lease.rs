//! How a stack is leased on a remote store, whatever the store: [`Slack`] (how far a fleet may
//! run ahead of each limit) and [`Lease`] (the slack and the lease's time to live). Part of one
//! definition of a limiter (a limiterd policy, an envoy descriptor); the Redis backend takes
//! leases by it, and an in-process stack needs none (every decision is already local).

use core::fmt;
use core::time::Duration;

/// The default time a lease lives.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(1);

/// The shortest and longest time to live a lease may have.
pub const LEASE_TTL_RANGE: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_secs(3_600));

/// How far the fleet may run ahead of a limit: the most units of each limit leased out at
/// once. The bound is the limit plus this (see limiter-redis's `LeasedStack`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slack {
    /// The same number of units for every limit.
    Units(u64),
    /// A share of each limit's burst, in parts per million, rounded down.
    PartsPerMillion(u64),
}

impl Slack {
    /// `n` units of every limit.
    pub fn units(n: u64) -> Self {
        Self::Units(n)
    }

    /// `p` percent of each limit's burst.
    pub fn percent(p: u64) -> Self {
        Self::PartsPerMillion(p.saturating_mul(10_000))
    }

    /// The slack of a limit whose burst is `burst`, in units (a share rounds down).
    pub fn of_burst(&self, burst: u64) -> u64 {
        match *self {
            Self::Units(n) => n,
            Self::PartsPerMillion(ppm) => {
                let units = u128::from(burst) * u128::from(ppm) / 1_000_000;
                u64::try_from(units).unwrap_or(u64::MAX)
            }
        }
    }

    /// Why no lease can use this slack on a limit of burst `burst`, with the fix: a share
    /// that rounds to no unit (nothing would ever be leased; a slack of 0 is written
    /// `Slack::units(0)`, the per-call path), or more units than the burst (the fleet could
    /// run more than a whole burst ahead). `None` when it can.
    pub fn refusal(&self, burst: u64) -> Option<String> {
        let units = self.of_burst(burst);
        match *self {
            Self::PartsPerMillion(ppm) if ppm > 0 && units == 0 => {
                // The least share of the burst that is a whole unit, in ppm, rounded up.
                let least = 1_000_000u64.div_ceil(burst.max(1));
                let least = Self::PartsPerMillion(least).to_string();
                let least = least.trim_end_matches(" of each burst");
                Some(format!(
                    "a slack of {} is no whole unit of a burst of {burst}, so nothing would be \
                     leased; use at least {least} (one unit), or 1 unit",
                    self.to_string().trim_end_matches(" of each burst")
                ))
            }
            _ if units > burst => Some(format!(
                "a slack of {units} units is more than the burst of {burst}, so the fleet could \
                 run more than a whole burst ahead; use at most {burst} units (100%)"
            )),
            _ => None,
        }
    }
}

impl fmt::Display for Slack {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Units(n) => write!(f, "{n} units"),
            Self::PartsPerMillion(ppm) => {
                // Exact, with no trailing zeros: 10%, 0.5%, 0.0125%.
                let fraction = format!("{:04}", ppm % 10_000);
                let fraction = fraction.trim_end_matches('0');
                let dot = if fraction.is_empty() { "" } else { "." };
                write!(f, "{}{dot}{fraction}% of each burst", ppm / 10_000)
            }
        }
    }
}

/// How a stack leases: its [`Slack`] and the time a lease lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    slack: Slack,
    ttl: Duration,
}

impl Lease {
    /// Leases within `slack`, living [`DEFAULT_LEASE_TTL`].
    pub fn new(slack: Slack) -> Self {
        Self {
            slack,
            ttl: DEFAULT_LEASE_TTL,
        }
    }

    /// How long a lease lives (within [`LEASE_TTL_RANGE`]). Longer leases renew less often
    /// when demand is light; units left in a dead node's lease are lost for this long.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    /// The slack.
    pub fn slack(&self) -> Slack {
        self.slack
    }

    /// How long a lease lives.
    pub fn time_to_live(&self) -> Duration {
        self.ttl
    }
}
