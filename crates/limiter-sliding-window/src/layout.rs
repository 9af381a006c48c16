//! [`Layout`]: how a window counter packs its state into one `u64`.
//!
//! From the high bits down: the window number, then (sliding only) the previous window's count,
//! then the current window's count. Each count holds up to twice the limit's count: a window
//! in debt (usage recorded past the limit, [`Usage::MAX_DEBT`](limiter_core::Usage)) keeps up
//! to one more window's worth. [`Layout::choose`] gives each field just the bits that needs,
//! in three tiers:
//!
//! 1. **Exact**: both counts in full, and a window number that covers
//!    [`MIN_CLOCK_RANGE`](limiter_core::MIN_CLOCK_RANGE) of clock (every fixed window up to
//!    `u32::MAX` per window of 34 ms or more; sliding windows up to 131,071 per second).
//! 2. **Previous count rounded up**: a sliding window whose two full counts leave too few bits
//!    for the window number keeps the previous count in units of `2^g`, rounded up (at least 10
//!    bits of it), so its weight can only be overestimated: never more admitted, at most
//!    `2^g - 1` units fewer per window (10^6 per second: 31 units; 10^8 per minute: 8,191).
//! 3. **Wrapping window number**: where even that leaves too few bits (over 67 million per
//!    one-second window sliding or per millisecond fixed), the window number is
//!    kept modulo `2^k` (`k >= 21`). A state is read as written in the window nearest the
//!    reading with the same low bits: exact for states written within the last `2^(k-1)`
//!    windows (the *horizon*). An older one (which the stores have normally dropped, since it
//!    is full) may be read as recent or as up to a horizon ahead, and denies more until the
//!    clock reaches its window; a clock that steps back by more than the horizon reads a state
//!    as that old.
#![deny(clippy::arithmetic_side_effects)]

/// A window counter's state, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Windows {
    /// The window the counts belong to: `now / period` when they were last written (its low
    /// `index_bits` only, for a wrapping layout, until [`Layout::absolute`] restores it).
    pub(crate) index: u64,
    /// Units admitted (or recorded) in window `index - 1` (always 0 for a fixed window), as
    /// counted: a multiple of the layout's granule, rounded up.
    pub(crate) previous: u64,
    /// Units admitted (or recorded) in window `index`: at most twice the limit's count.
    pub(crate) current: u64,
}

/// The bit layout of one limit's state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Bits of the current count.
    count_bits: u32,
    /// Bits of the previous count (0 for a fixed window).
    previous_bits: u32,
    /// The previous count is kept in units of `2^granule_bits`, rounded up.
    granule_bits: u32,
    /// Bits of the window number.
    index_bits: u32,
    /// Whether the window number is kept modulo `2^index_bits`.
    wrapping: bool,
}

/// The least bits a rounded-up previous count keeps before the layout wraps instead.
const MIN_PREVIOUS_BITS: u32 = 10;

/// A wrapping window number keeps at least this many bits (a state is read exactly for
/// `2^20` windows after it was written); a limit that would leave fewer is refused.
pub(crate) const MIN_WRAPPING_INDEX_BITS: u32 = 21;

/// Bits needed to hold `n`.
fn bits(n: u64) -> u32 {
    u64::BITS.saturating_sub(n.leading_zeros())
}

impl Layout {
    /// The most precise layout for a limit of `count` per window (its fields hold up to
    /// `2 * count`, a window in debt), given the window-number bits `needed_index_bits` that
    /// cover the clock range an absolute layout must.
    ///
    /// For a store that drops every state once it is full (`expiring`: Redis keys expire then),
    /// no state outlives its horizon, so a wrapping window number with exact counts is preferred
    /// to a rounded previous count.
    pub(crate) fn choose(
        count: u64,
        sliding: bool,
        needed_index_bits: u32,
        expiring: bool,
    ) -> Self {
        // The most a count holds: a window's count plus one more in debt. It is even, so it is
        // never all ones in its bits, and no word is `StateCell::RETIRED`.
        let most = count.saturating_mul(2);
        let count_bits = bits(most);
        let room = u64::BITS.saturating_sub(needed_index_bits);
        let fields = if sliding { 2 } else { 1 };
        if count_bits.saturating_mul(fields) <= room {
            return Self::exact(count_bits, sliding);
        }
        if sliding && !expiring {
            let previous_bits = room.saturating_sub(count_bits);
            if previous_bits >= MIN_PREVIOUS_BITS {
                return Self {
                    count_bits,
                    previous_bits,
                    granule_bits: granule_bits(most, previous_bits),
                    index_bits: needed_index_bits,
                    wrapping: false,
                };
            }
        }
        let previous_bits = match (sliding, expiring) {
            (false, _) => 0,
            (true, false) => count_bits.min(MIN_PREVIOUS_BITS),
            // As many bits as leave the window number its least.
            (true, true) => count_bits.min(
                u64::BITS
                    .saturating_sub(count_bits)
                    .saturating_sub(MIN_WRAPPING_INDEX_BITS)
                    .max(MIN_PREVIOUS_BITS),
            ),
        };
        Self {
            count_bits,
            previous_bits,
            granule_bits: if sliding {
                granule_bits(most, previous_bits)
            } else {
                0
            },
            index_bits: u64::BITS
                .saturating_sub(count_bits)
                .saturating_sub(previous_bits),
            wrapping: true,
        }
    }

    /// Both counts in full; the window number gets the rest.
    pub(crate) fn exact(count_bits: u32, sliding: bool) -> Self {
        let previous_bits = if sliding { count_bits } else { 0 };
        Self {
            count_bits,
            previous_bits,
            granule_bits: 0,
            index_bits: u64::BITS
                .saturating_sub(count_bits)
                .saturating_sub(previous_bits),
            wrapping: false,
        }
    }

    /// Bits of the window number.
    pub(crate) fn index_bits(&self) -> u32 {
        self.index_bits
    }

    /// Whether the window number wraps.
    pub(crate) fn is_wrapping(&self) -> bool {
        self.wrapping
    }

    /// The previous count's unit, `2^g` (1 when it is kept exactly).
    pub(crate) fn granule(&self) -> u64 {
        1u64.checked_shl(self.granule_bits).unwrap_or(u64::MAX)
    }

    /// The layout as the Redis script receives it: current bits, previous bits, granule bits,
    /// index bits, and 1 if the window number wraps.
    pub(crate) fn fields(&self) -> [u32; 5] {
        [
            self.count_bits,
            self.previous_bits,
            self.granule_bits,
            self.index_bits,
            u32::from(self.wrapping),
        ]
    }

    /// The largest window number the layout can hold.
    pub(crate) fn max_index(&self) -> u64 {
        mask(self.index_bits)
    }

    /// A previous count as counted: rounded up to a whole granule.
    pub(crate) fn round_previous(&self, previous: u64) -> u64 {
        if self.granule_bits == 0 {
            return previous;
        }
        let granule = self.granule();
        previous.div_ceil(granule).saturating_mul(granule)
    }

    /// The window a stored (possibly wrapped) `stored` index stands for, seen from window
    /// `now`: itself for an absolute layout; for a wrapping one, the window with the same low
    /// bits nearest `now` (at most `2^(k-1)` behind, or less than that ahead).
    pub(crate) fn absolute(&self, stored: u64, now: u64) -> u64 {
        if !self.wrapping {
            return stored;
        }
        let m = mask(self.index_bits);
        let behind = now.wrapping_sub(stored) & m;
        let half = 1u64
            .checked_shl(self.index_bits.saturating_sub(1))
            .unwrap_or(0);
        if behind < half {
            now.saturating_sub(behind)
        } else {
            // The state's window is ahead of the reading: the clock went back.
            now.saturating_add(m.wrapping_sub(behind).saturating_add(1))
        }
    }

    /// Packs a state; the caller keeps `index <= max_index()` (or wraps it), counts within
    /// twice the limit and `previous` a whole granule (from
    /// [`round_previous`](Self::round_previous)).
    pub(crate) fn pack(&self, w: Windows) -> u64 {
        let index = (w.index & mask(self.index_bits))
            .checked_shl(self.count_bits.saturating_add(self.previous_bits))
            .unwrap_or(0);
        let previous = w
            .previous
            .checked_shr(self.granule_bits)
            .unwrap_or(0)
            .checked_shl(self.count_bits)
            .unwrap_or(0);
        debug_assert!(
            (self.wrapping || w.index <= self.max_index())
                && w.current <= mask(self.count_bits)
                && w.previous >> self.granule_bits <= mask(self.previous_bits)
                && w.previous == self.round_previous(w.previous)
        );
        index | previous | w.current
    }

    pub(crate) fn unpack(&self, word: u64) -> Windows {
        Windows {
            index: word
                .checked_shr(self.count_bits.saturating_add(self.previous_bits))
                .unwrap_or(0),
            previous: (word.checked_shr(self.count_bits).unwrap_or(0) & mask(self.previous_bits))
                .checked_shl(self.granule_bits)
                .unwrap_or(0),
            current: word & mask(self.count_bits),
        }
    }
}

/// The low `n` bits set.
fn mask(n: u32) -> u64 {
    u64::MAX
        .checked_shr(u64::BITS.saturating_sub(n))
        .filter(|_| n > 0)
        .unwrap_or(0)
}

/// The fewest granule bits that keep `ceil(most / 2^g)` below all ones in `previous_bits`.
fn granule_bits(most: u64, previous_bits: u32) -> u32 {
    let all_ones = mask(previous_bits);
    (0..u64::BITS)
        .find(|&g| {
            let granule = 1u64.checked_shl(g).unwrap_or(u64::MAX);
            most.div_ceil(granule) < all_ones
        })
        .unwrap_or(u64::BITS.saturating_sub(1))
}

#[cfg(test)]
#[allow(clippy::arithmetic_side_effects)] // tests compute expected values with plain operators
mod tests {
    use super::*;

    #[test]
    fn round_trips_at_the_edges_of_every_field() {
        let max = u64::from(u32::MAX);
        for (count, layout) in [
            (1, Layout::exact(1, true)),
            (127, Layout::exact(7, true)),
            (127, Layout::exact(7, false)),
            (1_000_000, Layout::choose(1_000_000, true, 27, false)),
            (100_000_000, Layout::choose(100_000_000, true, 21, false)),
            (max, Layout::choose(max, true, 47, false)),
            (max, Layout::choose(max, false, 47, false)),
            (1_000_000, Layout::choose(1_000_000, true, 37, true)),
            (max, Layout::choose(max, true, 47, true)),
        ] {
            let previous = if layout.previous_bits == 0 {
                0
            } else {
                layout.round_previous(count)
            };
            for w in [
                Windows {
                    index: 0,
                    previous: 0,
                    current: 0,
                },
                Windows {
                    // An absolute layout leaves its last window number unused.
                    index: layout.max_index() - u64::from(!layout.wrapping),
                    previous,
                    current: count,
                },
                Windows {
                    index: 1,
                    previous,
                    current: 0,
                },
            ] {
                let word = layout.pack(w);
                assert_eq!(layout.unpack(word), w, "{layout:?}");
                assert_ne!(word, u64::MAX, "{layout:?} wrote RETIRED");
            }
        }
    }

    #[test]
    fn counts_take_only_the_bits_they_need() {
        assert_eq!(Layout::exact(7, true).index_bits(), 64 - 14);
        assert_eq!(Layout::exact(7, false).index_bits(), 64 - 7);
        assert_eq!(Layout::exact(1, true).max_index(), (1 << 62) - 1);
    }

    #[test]
    fn a_million_per_second_rounds_the_previous_count_to_32_units_and_keeps_its_range() {
        // 27 window-number bits cover 2^56 ns of one-second windows; 21 for the current count
        // (up to two million, a window in debt) leave 16 for the previous one.
        let layout = Layout::choose(1_000_000, true, 27, false);
        assert!(!layout.is_wrapping());
        assert_eq!((layout.index_bits(), layout.granule()), (27, 32));
        assert_eq!(layout.round_previous(999_969), 1_000_000);
        assert_eq!(layout.round_previous(32), 32);
        // Two million, rounded, still fits the previous count's bits.
        let most = layout.round_previous(2_000_000);
        assert_eq!(
            layout
                .unpack(layout.pack(Windows {
                    index: 1,
                    previous: most,
                    current: 2_000_000
                }))
                .previous,
            most
        );
        // 10^8 per minute: 21 bits of minutes, 28 of count, 15 of previous.
        let layout = Layout::choose(100_000_000, true, 21, false);
        assert!(!layout.is_wrapping());
        assert_eq!(layout.granule(), 8_192);
    }

    #[test]
    fn a_wrapping_window_number_is_read_as_the_nearest_window_with_its_low_bits() {
        let layout = Layout::choose(u64::from(u32::MAX), true, 47, false);
        assert!(layout.is_wrapping());
        let k = layout.index_bits();
        assert!(k >= 21, "{layout:?}");
        let m = (1u64 << k) - 1;
        let now = 10 * (1u64 << k) + 5;
        for written in [now, now - 1, now - 7, now - (1 << (k - 1)) + 1] {
            assert_eq!(layout.absolute(written & m, now), written);
        }
        // Ahead of the reading: a clock that went back.
        for ahead in [now + 1, now + 3, now + (1 << (k - 1))] {
            assert_eq!(layout.absolute(ahead & m, now), ahead);
        }
    }
}
