//! [`Cells`]: one layer's state for one key: a word per limit, and a header that holds the plan
//! the words were written under and the lock a committing call takes.
//!
//! # Protocol
//!
//! - Words are only written by a call that holds the entry's lock (the header's top bit), or
//!   the stack's *commit lock*. Committing calls lock every entry they touch in ascending
//!   address order and never block while holding one, so no order of layers or keys can
//!   deadlock.
//! - A stack with a global layer uses that layer's entry lock as its commit lock. Every call that
//!   writes (commits, refunds) touches every global layer, so it takes that one lock instead of
//!   one per entry, and holds its other entries through it ([`Cells::hold_under_guard`]):
//!   no call writes them without it, and none locks them on their own. Such calls were already
//!   ordered by the global entry; they now take one locked instruction where they took one per
//!   layer.
//! - Keyed layers that share a keyer keep their cells in one table entry ([`EntryCells`]). In a
//!   stack without a global layer, the first of them (the group's lead) is the entry's lock:
//!   every call that touches one of them touches all (one key, skipped by all or none), so a
//!   writer locks the lead alone and holds the others through it, as under a commit lock.
//! - Calls that only read (denials, peeks, the first look of every call) take no lock: each word
//!   they read is a value some committed call wrote.
//! - A change of plan rewrites every word in the new plan's terms. It bumps the header's
//!   version to odd before and to even after (a sequence lock), so a reader never pairs words of
//!   one plan with another plan's limits: it retries while the version is odd or has moved.

use crate::sync::{AtomicU32, AtomicU64, Ordering, back_off};

/// The most limits one layer holds (per key, per plan).
pub const MAX_LIMITS_PER_LAYER: usize = 4;

const LOCKED: u32 = 1 << 31;
const PLAN_SHIFT: u32 = 16;
/// The most plans one layer holds: the header keeps the plan in 15 bits.
pub(crate) const MAX_PLANS: usize = 1 << 15;
const VERSION_MASK: u32 = (1 << PLAN_SHIFT) - 1;

/// The words of one layer for one key, and their header.
#[derive(Debug)]
pub(crate) struct Cells {
    header: AtomicU32,
    words: [AtomicU64; MAX_LIMITS_PER_LAYER],
}

/// What a reader saw: the plan and every word, consistent with each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) plan: usize,
    pub(crate) words: [u64; MAX_LIMITS_PER_LAYER],
}

/// Proof that the caller holds an entry's lock; gives it back on [`Cells::unlock`].
#[derive(Debug)]
#[must_use]
pub(crate) struct Held {
    header: u32,
    /// Whether the caller took this entry's own lock (else it holds it through a guard's: the
    /// commit lock or its group's lead, and letting go writes no header unless a plan changed).
    owned: bool,
}

impl Cells {
    pub(crate) fn new(snapshot: Snapshot) -> Self {
        Self {
            header: AtomicU32::new(header(snapshot.plan, 0)),
            words: snapshot.words.map(AtomicU64::new),
        }
    }

    /// A consistent read without the lock.
    #[inline]
    pub(crate) fn read(&self) -> Snapshot {
        // Acquire: pairs with a commit's Release word stores (see `read_consistent`).
        let (plan, words) =
            self.read_consistent(|words| words.each_ref().map(|w| w.load(Ordering::Acquire)));
        Snapshot { plan, words }
    }

    /// A consistent read of the plan and the first word without the lock: [`read`](Self::read)
    /// for a plan of one limit.
    #[inline]
    pub(crate) fn read_first(&self) -> (usize, u64) {
        // Acquire: pairs with a commit's Release word store (see `read_consistent`).
        self.read_consistent(|words| words[0].load(Ordering::Acquire))
    }

    /// A consistent read of the plan and the first `W` words without the lock (`W` at most
    /// [`MAX_LIMITS_PER_LAYER`]): [`read`](Self::read) for the fixed-plan path, whose arrays
    /// are as wide as its stack's widest plan.
    #[inline]
    pub(crate) fn read_words<const W: usize>(&self) -> (usize, [u64; W]) {
        // Acquire: pairs with a commit's Release word stores (see `read_consistent`).
        self.read_consistent(|words| {
            std::array::from_fn(|limit| words[limit].load(Ordering::Acquire))
        })
    }

    /// The plan the words are in, read under the lock that guards the entry (its own, the
    /// commit lock, or its group's lead).
    #[inline]
    pub(crate) fn plan_held(&self) -> usize {
        // Relaxed: the guard's Acquire already ordered the last writer's stores, a change of
        // plan's header included, before us.
        plan_of(self.header.load(Ordering::Relaxed))
    }

    /// Word `limit` without the lock, for a layer with no plan function: its plan never
    /// changes, so no sequence lock is needed, and every value read is one a commit wrote
    /// (words of several limits may be of different commits; a committing call compares each
    /// under the lock, as every lock-free reader's writes are checked).
    #[inline]
    pub(crate) fn read_only_plan(&self, limit: usize) -> u64 {
        // Acquire: pairs with the committing writer's Release store of the word.
        self.words[limit].load(Ordering::Acquire)
    }

    /// Word `limit`, read under the lock that guards the entry (its own, the commit lock, or
    /// its group's lead), for a layer with one plan.
    #[inline]
    pub(crate) fn word_held(&self, limit: usize) -> u64 {
        // Relaxed: the guard's Acquire already ordered the last writer's stores before us.
        self.words[limit].load(Ordering::Relaxed)
    }

    /// Writes word `limit` under the lock that guards the entry, which the caller holds and
    /// releases after (its Release publishes this store too), for a layer with one plan.
    #[inline]
    pub(crate) fn write_word_held(&self, limit: usize, word: u64) {
        // Release: readers without a lock Acquire-load the word itself.
        self.words[limit].store(word, Ordering::Release);
    }

    /// The plan and what `load` reads of the words, consistent with each other: retried while
    /// a plan change is under way or has happened in between.
    #[inline]
    fn read_consistent<T>(
        &self,
        load: impl Fn(&[AtomicU64; MAX_LIMITS_PER_LAYER]) -> T,
    ) -> (usize, T) {
        let mut spins = 0;
        loop {
            // Acquire: pairs with the Release stores of the last writer, so the words read
            // below are at least as new as the header read here.
            let before = self.header.load(Ordering::Acquire);
            if before & 1 == 0 {
                // `load` reads each word with Acquire: a word written under a plan change
                // synchronises with that write, so the header read after it sees the odd (or
                // later) version.
                let words = load(&self.words);
                // Relaxed: ordered after the Acquire loads above.
                let after = self.header.load(Ordering::Relaxed);
                if (before & !LOCKED) == (after & !LOCKED) {
                    return (plan_of(before), words);
                }
            }
            back_off(&mut spins);
        }
    }

    /// Takes the entry's lock, waiting for its holder (who never blocks) to let go.
    #[inline]
    pub(crate) fn lock(&self) -> Held {
        let mut spins = 0;
        loop {
            // Relaxed: only a guess at the unlocked value; the exchange below decides.
            let current = self.header.load(Ordering::Relaxed);
            if current & LOCKED == 0 {
                // Unlocked when read: take it, if no one took it since.
                if self
                    .header
                    .compare_exchange_weak(
                        current,
                        current | LOCKED,
                        // Acquire: pairs with the Release unlock of the last holder, so its
                        // word stores are visible to the reads made under this lock.
                        Ordering::Acquire,
                        // (Relaxed on failure: nothing was acquired.)
                        Ordering::Relaxed,
                    )
                    .is_ok()
                {
                    return Held {
                        header: current,
                        owned: true,
                    };
                }
            }
            back_off(&mut spins);
        }
    }

    /// Holds the entry through the lock that guards it, which the caller holds (the stack's
    /// commit lock, or its group's lead): every writer of the entry holds that lock too, and
    /// none takes the entry's own, so the header read here stays until the caller lets go.
    #[inline]
    pub(crate) fn hold_under_guard(&self) -> Held {
        // Relaxed: the guard's Acquire already ordered the last writer's stores before us.
        Held {
            header: self.header.load(Ordering::Relaxed),
            owned: false,
        }
    }

    /// The state, read under the lock (no other writer can run).
    #[inline]
    pub(crate) fn read_held(&self, held: &Held) -> Snapshot {
        Snapshot {
            plan: plan_of(held.header),
            // Relaxed: the lock's Acquire already ordered the last holder's writes before us.
            words: self.words.each_ref().map(|w| w.load(Ordering::Relaxed)),
        }
    }

    /// Whether the state under the lock is still `seen` (compared word by word, from the
    /// atomics: no snapshot is built to compare).
    #[inline]
    pub(crate) fn still_holds(&self, held: &Held, seen: &Snapshot) -> bool {
        plan_of(held.header) == seen.plan
            && self
                .words
                .iter()
                .zip(&seen.words)
                // Relaxed: as in `read_held`.
                .all(|(word, &value)| word.load(Ordering::Relaxed) == value)
    }

    /// Whether the plan and the first word under the lock are still `plan` and `word`.
    #[inline]
    pub(crate) fn first_still(&self, held: &Held, plan: usize, word: u64) -> bool {
        // Relaxed: as in `read_held`.
        plan_of(held.header) == plan && self.words[0].load(Ordering::Relaxed) == word
    }

    /// Writes the first word under the lock, keeping the plan, and releases it.
    #[inline]
    pub(crate) fn write_first_and_unlock(&self, held: Held, word: u64) {
        // Release: as in `write_and_unlock` (the plan is unchanged: no odd version).
        self.words[0].store(word, Ordering::Release);
        self.unlock(held);
    }

    /// Writes `next` under the lock and releases it. A change of plan goes through an odd
    /// version, so lock-free readers retry instead of mixing the two plans.
    #[inline]
    pub(crate) fn write_and_unlock(&self, held: Held, next: &Snapshot) {
        let old_plan = plan_of(held.header);
        let mut version = held.header & VERSION_MASK;
        if next.plan != old_plan {
            version = (version + 1) & VERSION_MASK;
            // Relaxed: readers see it through the Release word stores that follow.
            self.header
                .store(LOCKED | header(old_plan, version), Ordering::Relaxed);
            version = (version + 1) & VERSION_MASK;
        }
        for (word, &value) in self.words.iter().zip(&next.words) {
            // Release: a reader that Acquire-loads this value also sees the odd version above.
            word.store(value, Ordering::Release);
        }
        if held.owned || next.plan != old_plan {
            // Release: pairs with the next locker's Acquire and with readers' Acquire header
            // loads.
            self.header
                .store(header(next.plan, version), Ordering::Release);
        }
    }

    /// Releases the lock without writing (a hold through a guard writes nothing: the guard's
    /// release orders the handover).
    #[inline]
    pub(crate) fn unlock(&self, held: Held) {
        if held.owned {
            // Release: pairs with the next locker's Acquire (nothing was written, but the
            // handover must still be ordered).
            self.header.store(held.header, Ordering::Release);
        }
    }
}

/// The cells of one table entry: one keyed layer's, or those of every layer of a group sharing a
/// keyer (by position in the group, the lead first), found by one lookup.
#[derive(Debug)]
pub(crate) enum EntryCells {
    One(Cells),
    Group(Box<[Cells]>),
}

impl EntryCells {
    /// Cells starting from `snapshots`, one per layer of the group, in position order.
    pub(crate) fn new(snapshots: &[Snapshot]) -> Self {
        match snapshots {
            [only] => Self::One(Cells::new(*only)),
            group => Self::Group(group.iter().copied().map(Cells::new).collect()),
        }
    }

    /// The cells of the layer at `position` in the group. Positions are fixed when the stack is
    /// built and every entry holds its whole group, so the index is always in range.
    #[inline]
    pub(crate) fn get(&self, position: usize) -> &Cells {
        match self {
            Self::One(cells) => cells,
            Self::Group(group) => &group[position],
        }
    }

    /// Every layer's cells, in position order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Cells> {
        match self {
            Self::One(cells) => std::slice::from_ref(cells).iter(),
            Self::Group(group) => group.iter(),
        }
    }
}

#[inline]
fn header(plan: usize, version: u32) -> u32 {
    // plan < MAX_PLANS, checked when the stack is built.
    ((plan as u32) << PLAN_SHIFT) & !LOCKED | (version & VERSION_MASK)
}

#[inline]
fn plan_of(header: u32) -> usize {
    ((header & !LOCKED) >> PLAN_SHIFT) as usize
}
