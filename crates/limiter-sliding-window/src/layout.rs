//! [`Layout`]: how a window counter packs its state into one `u64`.
//!
//! From the high bits down: the window number, then (sliding only) the previous window's count,
//! then the current window's count. Each count takes just the bits `count` needs, and the window
//! number gets the rest, so small limits get the widest clock range.
#![deny(clippy::arithmetic_side_effects)]

/// A window counter's state, unpacked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Windows {
    /// The window the counts belong to: `now / period` when they were last written.
    pub(crate) index: u64,
    /// Units admitted in window `index - 1` (always 0 for a fixed window).
    pub(crate) previous: u64,
    /// Units admitted in window `index`.
    pub(crate) current: u64,
}

/// The bit layout of one limit's state word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Bits per count field.
    count_bits: u32,
    /// How many count fields: 2 for a sliding window, 1 for a fixed one.
    fields: u32,
}

impl Layout {
    /// The narrowest layout that holds counts up to `max_count` in `fields` fields.
    pub(crate) fn for_count(max_count: u64, fields: u32) -> Self {
        Self {
            count_bits: u64::BITS.saturating_sub(max_count.leading_zeros()),
            fields,
        }
    }

    /// Bits left for the window number.
    pub(crate) fn index_bits(&self) -> u32 {
        u64::BITS.saturating_sub(self.count_bits.saturating_mul(self.fields))
    }

    /// The largest window number the layout can hold.
    pub(crate) fn max_index(&self) -> u64 {
        u64::MAX
            .checked_shr(u64::BITS.saturating_sub(self.index_bits()))
            .unwrap_or(0)
    }

    fn count_mask(&self) -> u64 {
        // count_bits >= 1 (a count is at least 1), so the shift is in range.
        u64::MAX
            .checked_shr(u64::BITS.saturating_sub(self.count_bits))
            .unwrap_or(0)
    }

    /// Packs a state; the caller keeps `index <= max_index()` and counts within `max_count`.
    pub(crate) fn pack(&self, w: Windows) -> u64 {
        debug_assert!(
            w.index <= self.max_index()
                && w.current <= self.count_mask()
                && w.previous <= self.count_mask()
        );
        let index = w
            .index
            .checked_shl(self.count_bits.saturating_mul(self.fields))
            .unwrap_or(0);
        let previous = if self.fields == 2 {
            w.previous.checked_shl(self.count_bits).unwrap_or(0)
        } else {
            0
        };
        index | previous | w.current
    }

    pub(crate) fn unpack(&self, word: u64) -> Windows {
        let mask = self.count_mask();
        Windows {
            index: word
                .checked_shr(self.count_bits.saturating_mul(self.fields))
                .unwrap_or(0),
            previous: if self.fields == 2 {
                word.checked_shr(self.count_bits).unwrap_or(0) & mask
            } else {
                0
            },
            current: word & mask,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_at_the_edges_of_every_field() {
        for (max_count, fields) in [
            (1, 2),
            (100, 2),
            (100, 1),
            ((1 << 20) - 1, 2),
            ((1 << 31) - 1, 2),
        ] {
            let layout = Layout::for_count(max_count, fields);
            let previous = if fields == 2 { max_count } else { 0 };
            for w in [
                Windows {
                    index: 0,
                    previous: 0,
                    current: 0,
                },
                Windows {
                    index: layout.max_index(),
                    previous,
                    current: max_count,
                },
                Windows {
                    index: 1,
                    previous,
                    current: 0,
                },
                Windows {
                    index: layout.max_index() - 1,
                    previous: 0,
                    current: 1,
                },
            ] {
                assert_eq!(layout.unpack(layout.pack(w)), w, "{layout:?}");
            }
        }
    }

    #[test]
    fn counts_take_only_the_bits_they_need() {
        assert_eq!(Layout::for_count(100, 2).index_bits(), 64 - 14);
        assert_eq!(Layout::for_count(100, 1).index_bits(), 64 - 7);
        assert_eq!(Layout::for_count(1, 2).max_index(), (1 << 62) - 1);
    }
}
