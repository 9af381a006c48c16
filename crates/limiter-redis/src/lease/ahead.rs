//! A lease renewed ahead: a spend that leaves less than half of the last lease sends its
//! key here, and one task per leased stack takes the next lease in the background, in one
//! script call that keeps what is left of the live one (Redis's ledger counts it in the new
//! lease, which takes that much less of the holder's share), then adds the new units to the
//! lease word while callers go on spending it ([`LeaseCell::top_up`]). A hot key so never waits
//! for Redis while its lease lasts; a key whose lease runs out before the answer comes (or a
//! stack outside a tokio runtime) is renewed by the caller that finds it empty, as before.

use std::sync::Weak;

use tokio::sync::mpsc::UnboundedReceiver;

use super::*;
use crate::script::reply;

/// Renews, one at a time, the leases spends found running low, while the stack lives.
pub(super) async fn renew_asked<R>(
    shared: Weak<Shared<R>>,
    mut asked: UnboundedReceiver<Arc<Entry>>,
) {
    while let Some(entry) = asked.recv().await {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        LeasedStack { shared }.renew_ahead(&entry).await;
    }
}

impl<R> LeasedStack<R> {
    /// Takes the next lease for `entry` ahead, keeping what is left of its live one; nothing
    /// when the lease ran out, was renewed or handed back meanwhile, or the call fails (a
    /// caller that then finds it empty renews it).
    async fn renew_ahead(&self, entry: &Entry) {
        let shared = &*self.shared;
        let mut meta = entry.renewal.lock().await;
        let backend = shared.stack.backend();
        let now = backend.local_now();
        let word = entry.cell.load();
        let left = LeaseCell::units_of(word);
        // Gone, run out (its caller renews it), or renewed meanwhile (more than half left).
        if meta.removed || !LeaseCell::holds_units(word, now) || left >= meta.granted / 2 {
            return;
        }
        let ttl = renew::duration_nanos(shared.lease.time_to_live());
        let want = meta.next_want(left, now, ttl, shared.most);
        let sent = backend.sent();
        let (keys, args) = self.lease_call(&meta.call, [0, want, 0, left]);
        // Relaxed: a statistic.
        shared.renewals.fetch_add(1, Ordering::Relaxed);
        let Ok(value) = backend.eval_as(&keys, args, Some(&meta.field)).await else {
            return;
        };
        let Ok((now_us, mut groups)) = reply::parse_leases(&value, &[meta.call.limits()]) else {
            return;
        };
        let (Some((leased, Ok(answers))), true) = (groups.pop(), groups.is_empty()) else {
            return;
        };
        if answers.len() != meta.call.limits() {
            return;
        }
        // What Redis holds once the new lease is taken: what local answers report from now on.
        let decision = shared.stack.decided(&meta.call, &answers, sent, false);
        entry.known.update(&decision.at(now_us), sent.at);
        if !answers.iter().all(|a| a.allowed) {
            return;
        }
        // As a renewal's lease: stopped a tenth of its time to live before Redis forgets it.
        let deadline = sent.at.saturating_add(ttl - ttl / 10);
        let now = backend.local_now();
        if entry.cell.top_up(leased.kept, leased.units, deadline, now) {
            let held = leased.kept.saturating_add(leased.units);
            entry.granted(held);
            meta.granted = held;
            meta.granted_at = sent.at;
            // Relaxed: a statistic.
            shared.leased.fetch_add(leased.units, Ordering::Relaxed);
        }
    }
}
