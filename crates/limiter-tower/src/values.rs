//! Header values written without an allocation per response: each thread writes its values
//! into one buffer and hands out each as a shared slice of it (`bytes::Bytes`). When every response
//! that held a slice is gone, the next value reuses the buffer in place; while some are alive, a
//! new buffer is taken once it is full (one allocation per about a hundred values). A value
//! every response repeats (a policy's `RateLimit-Policy`) is kept once for the process and
//! handed out with no reference count ([`constant`]).

use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

use bytes::BytesMut;
use http::HeaderValue;

use crate::digits;

/// Room made before each value is written: every value the middleware writes fits (a
/// `RateLimit` item is a name and two numbers of at most 15 digits), so the one check covers
/// it; a longer one (many layers with long names) grows the buffer as it is written.
const ROOM: usize = 256;

/// The size of a fresh buffer.
const CHUNK: usize = 8 * 1024;

thread_local! {
    static BUFFER: RefCell<BytesMut> = RefCell::new(BytesMut::with_capacity(CHUNK));
}

/// A header value of what `write` writes, or `None` if it wrote a byte a header value cannot
/// hold (the middleware writes only quoted strings and digits, so never).
#[inline]
pub(crate) fn value(write: impl FnOnce(&mut Writer<'_>)) -> Option<HeaderValue> {
    BUFFER.with_borrow_mut(|buffer| {
        if buffer.capacity() - buffer.len() < ROOM {
            // Reclaims the buffer in place when no value still points into it; else a new one.
            buffer.reserve(CHUNK);
        }
        write(&mut Writer { buffer });
        HeaderValue::from_maybe_shared(buffer.split().freeze()).ok()
    })
}

/// The decimal digits of `n` as a header value.
#[inline]
pub(crate) fn number(n: u64) -> Option<HeaderValue> {
    value(|out| out.number(n))
}

/// The most distinct constant values kept for the process: past it (layers built again and
/// again with ever new policies), a value is shared by reference count instead.
const MAX_CONSTANTS: usize = 4096;

/// Every constant value handed out so far, each kept once for the life of the process.
static CONSTANTS: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);

/// `text` as a header value every response can carry with no per-response cost: a static
/// value, whose clone and drop touch no counter (a value shared by reference count would have
/// every response on every core increment and decrement one counter). Each distinct text is
/// kept once (a layer built again with the same policies reuses it), at most
/// [`MAX_CONSTANTS`] of them; `None` for a text a header value cannot hold.
pub(crate) fn constant(text: &str) -> Option<HeaderValue> {
    // Checked first: `from_static` refuses (panics on) what `from_str` refuses.
    let checked = HeaderValue::from_str(text).ok()?;
    let mut kept = CONSTANTS.lock().unwrap_or_else(PoisonError::into_inner);
    let kept = kept.get_or_insert_with(HashSet::new);
    let text: &'static str = match kept.get(text) {
        Some(text) => text,
        None if kept.len() >= MAX_CONSTANTS => return Some(checked),
        None => {
            let text = Box::leak(text.to_owned().into_boxed_str());
            kept.insert(text);
            text
        }
    };
    Some(HeaderValue::from_static(text))
}

/// Where one value is written: the end of the thread's buffer.
pub(crate) struct Writer<'a> {
    buffer: &'a mut BytesMut,
}

impl Writer<'_> {
    /// Appends `bytes`.
    #[inline]
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// Appends the decimal digits of `n`.
    #[inline]
    pub(crate) fn number(&mut self, n: u64) {
        digits::write(n, |digits| self.buffer.extend_from_slice(digits));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_hold_what_was_written_and_outlive_the_buffer_they_share() {
        let held: Vec<HeaderValue> = (0..2_000_u64)
            .map(|i| {
                value(|out| {
                    out.bytes(b"\"per-ip\";r=");
                    out.number(i);
                })
                .expect("printable")
            })
            .collect();
        for (i, value) in held.iter().enumerate() {
            assert_eq!(value.to_str().unwrap(), format!("\"per-ip\";r={i}"));
        }
        assert_eq!(number(u64::MAX).unwrap(), u64::MAX.to_string().as_str());
        // A value longer than the room made for it grows the buffer as it is written.
        let long = "x".repeat(ROOM - 3) + &"y".repeat(CHUNK * 2);
        let written = value(|out| {
            out.bytes(&long.as_bytes()[..ROOM - 3]);
            out.bytes(&long.as_bytes()[ROOM - 3..]);
        });
        assert_eq!(written.unwrap(), long.as_str());
        // A byte a header value cannot hold is refused, not passed on.
        assert!(value(|out| out.bytes(b"a\nb")).is_none());
    }

    #[test]
    fn a_constant_is_kept_once_and_refuses_what_a_header_cannot_hold() {
        let text = "\"per-ip\";q=10;w=1, \"constant-test\";q=5;w=60";
        let first = constant(text).expect("printable");
        // The same text from another allocation.
        let copy = String::from(text);
        let again = constant(&copy).expect("printable");
        assert_eq!(first, text);
        // The same bytes, kept once: both point at one static text.
        assert_eq!(first.as_bytes().as_ptr(), again.as_bytes().as_ptr());
        assert!(constant("a\nb").is_none());
        let kept = CONSTANTS.lock().unwrap_or_else(PoisonError::into_inner);
        let count = kept
            .as_ref()
            .map_or(0, |k| k.iter().filter(|t| **t == text).count());
        assert_eq!(count, 1);
    }
}
