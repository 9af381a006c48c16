//! Header values written without an allocation per response: each thread writes its values
//! into one buffer and hands out each as a shared slice of it (`bytes::Bytes`). When every response
//! that held a slice is gone, the next value reuses the buffer in place; while some are alive, a
//! new buffer is taken once it is full (one allocation per about a hundred values).

use std::cell::RefCell;

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
}
