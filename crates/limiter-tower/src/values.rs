//! Header values written without an allocation per response: each thread writes its values
//! into one buffer and hands out each as a shared slice of it (`bytes::Bytes`). When every response
//! that held a slice is gone, the next value reuses the buffer in place; while some are alive, a
//! new buffer is taken once it is full (one allocation per about a hundred values).

use std::cell::RefCell;

use bytes::{BufMut, BytesMut};
use http::HeaderValue;

use crate::digits;

/// The longest value written on the stack before it is copied into the buffer (the usual
/// `RateLimit` value, a name and two numbers, is under 40 bytes); a longer one (many layers
/// with long names) is written on the heap instead.
const ON_STACK: usize = 192;

/// The size of a fresh buffer.
const CHUNK: usize = 8 * 1024;

thread_local! {
    static BUFFER: RefCell<BytesMut> = RefCell::new(BytesMut::with_capacity(CHUNK));
}

/// A header value of what `write` writes, or `None` if it wrote a byte a header value cannot
/// hold (the middleware writes only quoted strings and digits, so never).
#[inline]
pub(crate) fn value(write: impl FnOnce(&mut Writer)) -> Option<HeaderValue> {
    let mut writer = Writer {
        stack: [0; ON_STACK],
        len: 0,
        heap: Vec::new(),
    };
    write(&mut writer);
    let written = writer.written();
    let bytes = BUFFER.with(|buffer| {
        let mut buffer = buffer.borrow_mut();
        // Reclaims the buffer in place when no value still points into it; else a new one.
        buffer.reserve(written.len().max(CHUNK / 64));
        buffer.put_slice(written);
        buffer.split().freeze()
    });
    HeaderValue::from_maybe_shared(bytes).ok()
}

/// The decimal digits of `n` as a header value.
#[inline]
pub(crate) fn number(n: u64) -> Option<HeaderValue> {
    value(|out| out.number(n))
}

/// Where one value is written: on the stack, or on the heap once it outgrows it.
pub(crate) struct Writer {
    stack: [u8; ON_STACK],
    len: usize,
    heap: Vec<u8>,
}

impl Writer {
    /// Appends `bytes`.
    #[inline]
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        match self.stack.get_mut(self.len..end) {
            Some(room) if self.heap.is_empty() => {
                room.copy_from_slice(bytes);
                self.len = end;
            }
            _ => {
                if self.heap.is_empty() {
                    self.heap.extend_from_slice(&self.stack[..self.len]);
                }
                self.heap.extend_from_slice(bytes);
            }
        }
    }

    /// Appends the decimal digits of `n`.
    #[inline]
    pub(crate) fn number(&mut self, n: u64) {
        digits::write(n, |digits| self.bytes(digits));
    }

    fn written(&self) -> &[u8] {
        if self.heap.is_empty() {
            &self.stack[..self.len]
        } else {
            &self.heap
        }
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
        // A value longer than the stack holds moves to the heap whole.
        let long = "x".repeat(ON_STACK - 3) + &"y".repeat(ON_STACK * 2);
        let written = value(|out| {
            out.bytes(&long.as_bytes()[..ON_STACK - 3]);
            out.bytes(&long.as_bytes()[ON_STACK - 3..]);
        });
        assert_eq!(written.unwrap(), long.as_str());
        // A byte a header value cannot hold is refused, not passed on.
        assert!(value(|out| out.bytes(b"a\nb")).is_none());
    }
}
