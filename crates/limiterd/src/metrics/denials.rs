//! Denials as the status page and the log see them: the identifiers denied most, by policy
//! ([`TopDenied`], a fixed-size sketch, so its memory is bounded whatever the traffic), and a
//! denial logged at most once a second, with the number not logged since.

use std::sync::Mutex;
use std::time::Duration;

use limiter_core::Paced;

/// How many identifiers [`TopDenied`] keeps.
pub const TOP_DENIED: usize = 32;

/// The longest identifier [`TopDenied`] keeps (longer ones are cut, marked with `…`).
pub(super) const TOP_DENIED_KEY_BYTES: usize = 128;

/// The identifiers denied most, by policy: the Space-Saving sketch (Metwally, Agrawal and El
/// Abbadi), [`TOP_DENIED`] counters. An identifier denied more than `1/TOP_DENIED` of all
/// denials is always in it; each count is at most `error` above the truth.
#[derive(Debug, Default)]
pub struct TopDenied {
    pub(super) entries: Vec<HeavyHitter>,
}

/// One identifier the sketch tracks.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct HeavyHitter {
    /// The policy's name.
    pub policy: String,
    /// The identifier (cut at 128 bytes).
    pub identifier: String,
    /// Denials counted, at most `error` above the true number.
    pub denied: u64,
    /// How much of `denied` may belong to identifiers it replaced.
    pub error: u64,
}

impl TopDenied {
    /// Counts one denial of `identifier` under `policy`.
    pub fn record(&mut self, policy: &str, identifier: &str) {
        let mut cut = identifier.len().min(TOP_DENIED_KEY_BYTES);
        while !identifier.is_char_boundary(cut) {
            cut -= 1;
        }
        let (kept, long) = (&identifier[..cut], cut < identifier.len());
        if let Some(hit) = self.entries.iter_mut().find(|h| {
            h.policy == policy
                && h.identifier.strip_suffix('…').unwrap_or(&h.identifier) == kept
                && h.identifier.ends_with('…') == long
        }) {
            hit.denied = hit.denied.saturating_add(1);
            return;
        }
        let mut identifier = kept.to_owned();
        if long {
            identifier.push('…');
        }
        let fresh = HeavyHitter {
            policy: policy.to_owned(),
            identifier,
            denied: 1,
            error: 0,
        };
        if self.entries.len() < TOP_DENIED {
            self.entries.push(fresh);
        } else if let Some(least) = self.entries.iter_mut().min_by_key(|h| h.denied) {
            // Space-Saving: the newcomer inherits the least count as its possible error.
            *least = HeavyHitter {
                denied: least.denied.saturating_add(1),
                error: least.denied,
                ..fresh
            };
        }
    }

    /// The tracked identifiers, most denied first.
    pub fn top(&self) -> Vec<HeavyHitter> {
        let mut top = self.entries.clone();
        top.sort_by(|a, b| {
            b.denied
                .cmp(&a.denied)
                .then_with(|| a.identifier.cmp(&b.identifier))
        });
        top
    }
}

/// Denials as the status page and the log see them.
#[derive(Debug)]
pub(super) struct Denials {
    top: Mutex<TopDenied>,
    /// One denial a second is logged.
    logged: Paced,
}

impl Denials {
    pub(super) fn new() -> Self {
        Self {
            top: Mutex::new(TopDenied::default()),
            logged: Paced::new(Duration::from_secs(1)),
        }
    }

    /// The identifiers denied most, most first.
    pub(super) fn top(&self) -> Vec<HeavyHitter> {
        // A poisoned sketch is still a sketch: each record completes or is left out.
        self.top
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .top()
    }

    /// Counts one denial of `identifier` under `policy`, and logs it if none was this second.
    pub(super) fn record(&self, policy: &str, identifier: &str) {
        // Never waits: under contention this denial is left out of the sketch (a sample).
        if let Ok(mut top) = self.top.try_lock() {
            top.record(policy, identifier);
        }
        if let Some(unlogged) = self.logged.due() {
            tracing::info!(
                policy,
                identifier,
                unlogged,
                "denied (one denial a second is logged)"
            );
        }
    }
}
