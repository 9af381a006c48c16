//! Decimal digits of an integer, two at a time from a table, into a byte slice: what the
//! rate limit headers print on every response, without `fmt`, a `String`, or a check that the
//! digits are UTF-8.

/// "00" to "99".
const PAIRS: &[u8; 200] = b"\
0001020304050607080910111213141516171819\
2021222324252627282930313233343536373839\
4041424344454647484950515253545556575859\
6061626364656667686970717273747576777879\
8081828384858687888990919293949596979899";

/// Hands the decimal digits of `n` to `out`.
#[inline]
pub(crate) fn write(mut n: u64, out: impl FnOnce(&[u8])) {
    let mut buffer = [0_u8; 20];
    let mut at = buffer.len();
    while n >= 100 {
        let pair = usize::try_from(n % 100).unwrap_or(0) * 2;
        n /= 100;
        at -= 2;
        buffer[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    }
    if n >= 10 {
        let pair = usize::try_from(n).unwrap_or(0) * 2;
        at -= 2;
        buffer[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
    } else {
        at -= 1;
        buffer[at] = b'0' + u8::try_from(n).unwrap_or(0);
    }
    out(&buffer[at..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_every_width_like_display() {
        let mut cases = vec![
            0,
            1,
            9,
            10,
            11,
            99,
            100,
            101,
            999,
            1_000,
            u64::MAX,
            u64::MAX - 1,
        ];
        let mut power = 1_u64;
        while let Some(next) = power.checked_mul(10) {
            cases.extend([power - 1, power, power + 1, next - 1]);
            power = next;
        }
        for n in cases {
            let mut out = b"x".to_vec();
            write(n, |digits| out.extend_from_slice(digits));
            assert_eq!(out, format!("x{n}").into_bytes(), "{n}");
        }
    }
}
