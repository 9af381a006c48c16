//! [`LeaseCell`]: units a remote store granted this process ahead of time, spent locally by
//! compare-and-swap until a deadline, or a standing denial the store answered.
//!
//! The remote half of the protocol (who grants what, and the bound it keeps) lives in
//! limiter-redis; this is the lock-free local half, kept here, beside [`StateCell`], so the
//! loom models of every atomic protocol live with the atomics they check.
//!
//! The whole lease is one `u64`:
//!
//! ```text
//! bit 63      denial flag
//! bits 20..63 deadline, in ticks of 2^20 ns (~1.05 ms) of the caller's clock, rounded down
//!             (43 bits: any clock reading below 2^63 ns, 292 years, Unix time included)
//! bits 0..20  units left (a lease) or the smallest cost denied (a denial)
//! ```
//!
//! `0` holds nothing. A lease is spendable while `now` is before its deadline tick; a unit is
//! spent by exactly one successful compare-and-swap, and [`LeaseCell::close`] takes whatever
//! is left in one swap, so a unit is either spent here or refunded, never both.
//!
//! [`StateCell`]: crate::StateCell

use crate::sync::{AtomicU64, Ordering};

/// The most units one lease holds (2^20 - 1, 1,048,575).
pub const MAX_LEASE_UNITS: u64 = (1 << UNIT_BITS) - 1;

/// The resolution of a lease's deadline: 2^20 ns (about 1.05 ms). Deadlines are rounded down
/// to it, so a lease ends at most this much before the deadline it was given, never after.
pub const LEASE_TICK_NANOS: u64 = 1 << TICK_SHIFT;

const UNIT_BITS: u32 = 20;
const TICK_SHIFT: u32 = 20;
const TICK_BITS: u32 = 43;
const DENIED: u64 = 1 << 63;
const UNITS: u64 = MAX_LEASE_UNITS;
const TICK_MASK: u64 = (1 << TICK_BITS) - 1;

/// What [`LeaseCell::spend`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseSpend {
    /// The cost was taken from the lease; `left` units remain in it.
    Spent {
        /// Units still leased.
        left: u64,
    },
    /// A standing denial covers this cost until `until` (clock nanoseconds, on a tick).
    Denied {
        /// When the denial ends.
        until: u64,
    },
    /// Nothing here decides the call: no lease, an expired one, too few units, or a denial of
    /// a larger cost. Ask the store.
    Ask,
}

/// One key's lease, one lock-free word: bit 63 flags a denial, bits 20..63 hold the deadline
/// in ticks of [`LEASE_TICK_NANOS`] (rounded down), bits 0..20 the units left (or the least
/// cost denied). `0` holds nothing. A unit is spent by exactly one successful
/// compare-and-swap, and [`close`](Self::close) takes what is left in one swap, so a unit is
/// spent here or refunded, never both.
#[derive(Debug)]
pub struct LeaseCell {
    word: AtomicU64,
}

impl Default for LeaseCell {
    fn default() -> Self {
        Self {
            word: AtomicU64::new(0),
        }
    }
}

/// The deadline tick of `deadline` ns, or `None` past what the word holds (2^63 ns), where no
/// lease is kept.
fn tick_of(deadline: u64) -> Option<u64> {
    let tick = deadline >> TICK_SHIFT;
    (tick <= TICK_MASK).then_some(tick)
}

/// Whether `word`'s deadline is still ahead of `now`.
fn is_live(word: u64, now: u64) -> bool {
    (now >> TICK_SHIFT) < ((word >> UNIT_BITS) & TICK_MASK)
}

impl LeaseCell {
    /// A cell holding nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Spends `cost` units of a live lease at `now` (ns of the clock the deadlines were set
    /// on). A cost of 0 reads the lease and changes nothing.
    #[inline]
    pub fn spend(&self, cost: u64, now: u64) -> LeaseSpend {
        // Relaxed (here and in the exchange): the word is the whole lease and publishes no
        // other memory. What keeps a unit from being spent twice is that every successful
        // exchange starts from the value immediately before it in the word's modification
        // order, and `close` takes what is left by a swap in that same order.
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            if word == 0 || !is_live(word, now) {
                return LeaseSpend::Ask;
            }
            let units = word & UNITS;
            if word & DENIED != 0 {
                return if cost >= units {
                    LeaseSpend::Denied {
                        until: ((word >> UNIT_BITS) & TICK_MASK) << TICK_SHIFT,
                    }
                } else {
                    LeaseSpend::Ask
                };
            }
            if units < cost {
                return LeaseSpend::Ask;
            }
            if cost == 0 {
                return LeaseSpend::Spent { left: units };
            }
            // `units >= cost`, so the subtraction stays within the units field.
            match self.word.compare_exchange_weak(
                word,
                word - cost,
                // Relaxed: as the load above; the exchange succeeds only from the word right
                // before it in its modification order, so no unit is spent twice.
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return LeaseSpend::Spent { left: units - cost },
                Err(actual) => word = actual,
            }
        }
    }

    /// Ends whatever the cell holds and returns its word: a lease's units can no longer be
    /// spent here once this returns, so they may be refunded ([`units_of`](Self::units_of)
    /// reads them; expired or not, the store decides whether they still count).
    pub fn close(&self) -> u64 {
        // Relaxed: see `spend`; the swap is one step in the word's modification order.
        self.word.swap(0, Ordering::Relaxed)
    }

    /// The units of a lease word [`close`](Self::close) returned (0 for a denial or nothing).
    pub fn units_of(word: u64) -> u64 {
        if word & DENIED != 0 { 0 } else { word & UNITS }
    }

    /// Puts back a word [`close`](Self::close) took, if nothing was written since: for a
    /// hand-back that was never sent. Returns whether it was put back.
    pub fn restore(&self, word: u64) -> bool {
        // Relaxed: it succeeds only if the word is still the 0 `close` left, one step later
        // in the word's modification order; the word publishes nothing else.
        self.word
            .compare_exchange(0, word, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    }

    /// Holds `units` (at most [`MAX_LEASE_UNITS`]) until `deadline` (rounded down to a tick),
    /// replacing what the cell held: call it only after [`close`](Self::close), from the one
    /// caller renewing. Returns whether the lease is held (not when `units` is 0 or more than a
    /// lease holds, or the deadline is past what the word holds).
    pub fn grant(&self, units: u64, deadline: u64) -> bool {
        match tick_of(deadline) {
            Some(tick) if units > 0 && units <= UNITS => {
                // Relaxed: the one renewing caller writes after `close` left 0, and a spender
                // that reads it spends by exchange from it (see `spend`); nothing else is
                // published with the word.
                self.word
                    .store((tick << UNIT_BITS) | units, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// Adds `units` to the lease the cell holds at `now`, keeping at most `keep` of what is
    /// left of it, all held until `deadline` (rounded down to a tick): a lease renewed ahead,
    /// while callers still spend it, by the one caller renewing. What is left beyond `keep`
    /// (the store counts no more as still held), and anything left of a lease expired or
    /// closed, is not kept; a denial is replaced. At most [`MAX_LEASE_UNITS`] are held (any
    /// more are never spent). Returns whether the cell holds the lease (not when it would hold
    /// nothing, or the deadline is past what the word holds).
    pub fn top_up(&self, keep: u64, units: u64, deadline: u64, now: u64) -> bool {
        let Some(tick) = tick_of(deadline) else {
            return false;
        };
        // Relaxed (here and in the exchange): as in `spend`, the word is the whole lease. A
        // spend that lands between the load and the exchange fails the exchange, which reads
        // the word again: a unit is spent from the old word or counted in the new, never both.
        let mut word = self.word.load(Ordering::Relaxed);
        loop {
            let left = if word & DENIED == 0 && is_live(word, now) {
                (word & UNITS).min(keep)
            } else {
                0
            };
            let held = left.saturating_add(units).min(UNITS);
            if held == 0 {
                return false;
            }
            match self.word.compare_exchange_weak(
                word,
                (tick << UNIT_BITS) | held,
                // Relaxed: as the load above; the exchange succeeds only from the word right
                // before it, so no unit spent since is counted again.
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(actual) => word = actual,
            }
        }
    }

    /// Records that the store denies any cost of at least `cost` until `until` (rounded down
    /// to a tick, so the denial never outlasts the store's), replacing what the cell held:
    /// call it only after [`close`](Self::close). A cost of 0 or above [`MAX_LEASE_UNITS`]
    /// records nothing.
    pub fn deny(&self, cost: u64, until: u64) -> bool {
        match tick_of(until) {
            Some(tick) if cost > 0 && cost <= UNITS => {
                // Relaxed: as in `grant`, the renewing caller's one write after `close`.
                self.word
                    .store(DENIED | (tick << UNIT_BITS) | cost, Ordering::Relaxed);
                true
            }
            _ => false,
        }
    }

    /// The word as it is (the idle sweep compares it with an earlier reading).
    pub fn load(&self) -> u64 {
        // Relaxed: a reading to compare later, not a decision; spending reads by exchange.
        self.word.load(Ordering::Relaxed)
    }

    /// Whether `word` is a lease with units left that is live at `now`.
    pub fn holds_units(word: u64, now: u64) -> bool {
        word & DENIED == 0 && word & UNITS > 0 && is_live(word, now)
    }
}

#[cfg(all(test, not(limiter_loom)))]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_lease_is_spent_unit_by_unit_until_empty() {
        let cell = LeaseCell::new();
        assert_eq!(cell.spend(1, 0), LeaseSpend::Ask);
        assert!(cell.grant(3, 100 * MS));
        assert_eq!(cell.spend(0, 0), LeaseSpend::Spent { left: 3 });
        assert_eq!(cell.spend(2, 0), LeaseSpend::Spent { left: 1 });
        assert_eq!(cell.spend(2, 0), LeaseSpend::Ask);
        assert_eq!(cell.spend(1, 0), LeaseSpend::Spent { left: 0 });
        assert_eq!(cell.spend(1, 0), LeaseSpend::Ask);
    }

    #[test]
    fn a_lease_ends_at_its_deadline_rounded_down_to_a_tick() {
        let cell = LeaseCell::new();
        let deadline = 10 * LEASE_TICK_NANOS + LEASE_TICK_NANOS / 2;
        assert!(cell.grant(5, deadline));
        assert_eq!(
            cell.spend(1, 10 * LEASE_TICK_NANOS - 1),
            LeaseSpend::Spent { left: 4 }
        );
        // The tick the deadline falls in is already over: never spent after the deadline.
        assert_eq!(cell.spend(1, 10 * LEASE_TICK_NANOS), LeaseSpend::Ask);
        assert_eq!(cell.spend(1, deadline), LeaseSpend::Ask);
    }

    #[test]
    fn close_takes_what_is_left_once() {
        let cell = LeaseCell::new();
        assert!(cell.grant(7, 100 * MS));
        assert_eq!(cell.spend(2, 0), LeaseSpend::Spent { left: 5 });
        let word = cell.close();
        assert_eq!(LeaseCell::units_of(word), 5);
        assert_eq!(cell.spend(1, 0), LeaseSpend::Ask);
        assert_eq!(LeaseCell::units_of(cell.close()), 0);
        // A hand-back never sent comes back, and only into an empty cell.
        assert!(cell.restore(word));
        assert!(!cell.restore(word));
        assert_eq!(cell.spend(5, 0), LeaseSpend::Spent { left: 0 });
    }

    #[test]
    fn a_denial_covers_larger_costs_until_it_ends() {
        let cell = LeaseCell::new();
        assert!(cell.deny(3, 20 * LEASE_TICK_NANOS));
        assert_eq!(
            cell.spend(3, 0),
            LeaseSpend::Denied {
                until: 20 * LEASE_TICK_NANOS
            }
        );
        assert_eq!(
            cell.spend(9, 0),
            LeaseSpend::Denied {
                until: 20 * LEASE_TICK_NANOS
            }
        );
        assert_eq!(cell.spend(2, 0), LeaseSpend::Ask, "a smaller cost may fit");
        assert_eq!(cell.spend(3, 20 * LEASE_TICK_NANOS), LeaseSpend::Ask);
        assert_eq!(
            LeaseCell::units_of(cell.close()),
            0,
            "a denial holds no units"
        );
    }

    #[test]
    fn a_top_up_keeps_at_most_what_it_is_told_and_drops_what_expired() {
        let cell = LeaseCell::new();
        assert!(cell.grant(10, 100 * MS));
        assert_eq!(cell.spend(4, 0), LeaseSpend::Spent { left: 6 });
        // 6 left, 5 of them still counted by the store: 5 kept, 20 added, a later deadline.
        assert!(cell.top_up(5, 20, 200 * MS, 0));
        assert_eq!(cell.spend(0, 150 * MS), LeaseSpend::Spent { left: 25 });
        // Past the lease's deadline nothing left of it is kept.
        assert!(cell.top_up(25, 3, 300 * MS, 250 * MS));
        assert_eq!(cell.spend(0, 250 * MS), LeaseSpend::Spent { left: 3 });
        // A denial is replaced; a top-up to nothing, or past the word, holds nothing new.
        assert!(cell.deny(2, 400 * MS));
        assert!(cell.top_up(9, 4, 500 * MS, 0));
        assert_eq!(cell.spend(0, 0), LeaseSpend::Spent { left: 4 });
        assert!(!LeaseCell::new().top_up(5, 0, 500 * MS, 0));
        assert!(!cell.top_up(0, 1, u64::MAX, 0));
        assert!(cell.top_up(4, MAX_LEASE_UNITS, 500 * MS, 0));
        assert_eq!(
            cell.spend(0, 0),
            LeaseSpend::Spent {
                left: MAX_LEASE_UNITS
            },
            "capped at what a lease holds"
        );
    }

    #[test]
    fn what_the_word_cannot_hold_is_refused() {
        let cell = LeaseCell::new();
        assert!(!cell.grant(0, MS));
        assert!(!cell.grant(MAX_LEASE_UNITS + 1, MS));
        assert!(!cell.grant(1, u64::MAX));
        assert!(!cell.deny(0, MS));
        assert!(!cell.deny(MAX_LEASE_UNITS + 1, MS));
        assert_eq!(cell.load(), 0);
        assert!(cell.grant(MAX_LEASE_UNITS, (TICK_MASK << TICK_SHIFT) + 5));
        assert_eq!(
            cell.spend(MAX_LEASE_UNITS, 0),
            LeaseSpend::Spent { left: 0 },
            "the largest lease, at the latest deadline, is whole"
        );
    }
}
