//! [`WindowCache`]: the window a calendar computed last and the one after it, kept under a
//! sequence lock, so a decision inside either is answered by a few loads instead of a
//! conversion to the zone's calendar. Readers never wait (a reader that finds a write under way
//! computes the window itself); a writer that finds another writing leaves it to that one.

use crate::sync::{AtomicU64, Ordering, fence};
use crate::window::Window;

/// The words kept: a window's number, its start and end, and the next window's number and end
/// (the next starts where the first ends; an end equal to the first's: no next kept).
const WORDS: usize = 5;

/// Two consecutive windows of one calendar, read and written whole.
#[derive(Debug)]
pub(crate) struct WindowCache {
    /// Even: the words are whole; odd: a writer is writing them. It only grows.
    sequence: AtomicU64,
    words: [AtomicU64; WORDS],
}

impl WindowCache {
    /// Empty: a window that ends where it starts holds no instant.
    pub(crate) fn new() -> Self {
        Self {
            sequence: AtomicU64::new(0),
            words: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The kept window that holds `unix_ns`, if one does.
    #[inline]
    pub(crate) fn get(&self, unix_ns: u64) -> Option<Window> {
        let [index, start, end, next_index, next_end] = self.read()?;
        if (start..end).contains(&unix_ns) {
            Some(Window {
                index,
                start_unix_ns: start,
                end_unix_ns: end,
            })
        } else if (end..next_end).contains(&unix_ns) {
            Some(Window {
                index: next_index,
                start_unix_ns: end,
                end_unix_ns: next_end,
            })
        } else {
            None
        }
    }

    /// Keeps `window` and, where given, the `next` (which must start where `window` ends), unless
    /// another writer is writing now.
    pub(crate) fn put(&self, window: &Window, next: Option<&Window>) {
        let (next_index, next_end) = match next {
            Some(next) if next.start_unix_ns == window.end_unix_ns => {
                (next.index, next.end_unix_ns)
            }
            _ => (0, window.end_unix_ns),
        };
        self.write([
            window.index,
            window.start_unix_ns,
            window.end_unix_ns,
            next_index,
            next_end,
        ]);
    }

    /// The words, if no write was under way or happened while they were read.
    #[inline]
    fn read(&self) -> Option<[u64; WORDS]> {
        // Acquire: the words a completed write stored (released by its even sequence) are
        // visible to the loads below.
        let before = self.sequence.load(Ordering::Acquire);
        if before % 2 == 1 {
            return None;
        }
        // Relaxed: whether they are whole is decided by the sequence read again below.
        let words = std::array::from_fn(|i| self.words[i].load(Ordering::Relaxed));
        // Acquire fence: the loads above happen before the sequence's second load, so a
        // write that any of them saw has its odd sequence seen there.
        fence(Ordering::Acquire);
        // Relaxed: ordered after the words' loads by the fence.
        let after = self.sequence.load(Ordering::Relaxed);
        (before == after).then_some(words)
    }

    /// Writes `words` whole, unless a write is under way.
    fn write(&self, words: [u64; WORDS]) {
        // Relaxed: a hint; the compare-exchange below decides.
        let current = self.sequence.load(Ordering::Relaxed);
        if current % 2 == 1 {
            return;
        }
        // Acquire on success: the last writer's stores (released by the sequence it left)
        // come before this writer's, so no word of theirs can land after one of these.
        // Relaxed on failure: another writer won; nothing is read.
        if self
            .sequence
            .compare_exchange(current, current + 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // Release fence: a reader whose loads see any word stored below also sees the odd
        // sequence stored above when it reads the sequence again (and refuses the words).
        fence(Ordering::Release);
        for (word, value) in self.words.iter().zip(words) {
            // Relaxed: published by the sequence's release store below.
            word.store(value, Ordering::Relaxed);
        }
        // Release: the words stored above are visible to a reader that sees this sequence.
        self.sequence.store(current + 2, Ordering::Release);
    }
}

impl Clone for WindowCache {
    /// A cache of its own, holding what this one holds now (or nothing, mid-write).
    fn clone(&self) -> Self {
        let copy = Self::new();
        if let Some(words) = self.read() {
            copy.write(words);
        }
        copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window(index: u64, start: u64, end: u64) -> Window {
        Window {
            index,
            start_unix_ns: start,
            end_unix_ns: end,
        }
    }

    #[test]
    fn an_empty_cache_holds_no_instant() {
        let cache = WindowCache::new();
        assert_eq!(cache.get(0), None);
        assert_eq!(cache.get(u64::MAX), None);
    }

    #[test]
    fn a_kept_window_and_the_next_answer_their_own_instants_only() {
        let cache = WindowCache::new();
        cache.put(&window(7, 100, 200), Some(&window(8, 200, 350)));
        assert_eq!(cache.get(99), None);
        assert_eq!(cache.get(100), Some(window(7, 100, 200)));
        assert_eq!(cache.get(199), Some(window(7, 100, 200)));
        assert_eq!(cache.get(200), Some(window(8, 200, 350)));
        assert_eq!(cache.get(349), Some(window(8, 200, 350)));
        assert_eq!(cache.get(350), None);
        // A next that does not start where the first ends is not kept.
        cache.put(&window(9, 350, 400), Some(&window(11, 401, 500)));
        assert_eq!(cache.get(399), Some(window(9, 350, 400)));
        assert_eq!(cache.get(450), None);
        // Without a next, the first alone.
        cache.put(&window(3, 10, 20), None);
        assert_eq!(cache.get(15), Some(window(3, 10, 20)));
        assert_eq!(cache.get(20), None);
        let copy = cache.clone();
        assert_eq!(copy.get(15), Some(window(3, 10, 20)));
    }
}
