//! [`Reciprocal`]: exact floor division by a divisor fixed when a limit is built, by one
//! multiply and a shift instead of a division instruction (which costs tens of cycles, and a
//! token bucket's answer divides on every call that finds the bucket not full: the units left).
//!
//! # Why it is exact
//!
//! With `d` the divisor, `l = ceil(log2 d)`, `k = 63 + l` and `m = ceil(2^k / d)`, the error
//! `e = m * d - 2^k` is below `d <= 2^l = 2^(k - 63)`. For every `x < 2^63`,
//! `x * m / 2^k = x / d + x * e / (d * 2^k)`, and the second term is below `1 / d`, too little to
//! carry `x / d` past the next whole number: `floor(x * m / 2^k) = floor(x / d)` (Granlund and
//! Montgomery, 1994, theorem 4.2). `m` fits 64 bits (below `2^64` for every `d`) and
//! `x * m` below `2^127`, so a `u128` product holds it. Dividends of `2^63` and above (a bucket
//! deeper than that, which a limit may build) take the division instruction.
#![deny(clippy::arithmetic_side_effects)]

use core::num::NonZeroU64;

/// Floor division by a fixed divisor (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Reciprocal {
    divisor: NonZeroU64,
    /// `m = ceil(2^shift / divisor)`.
    multiplier: u64,
    /// `k = 63 + ceil(log2 divisor)`, at most 127.
    shift: u32,
}

impl Reciprocal {
    /// Division by `divisor`.
    pub(crate) fn new(divisor: NonZeroU64) -> Self {
        let d = divisor.get();
        // ceil(log2 d): 0 for 1, 64 above 2^63.
        let l = u64::BITS.wrapping_sub(d.wrapping_sub(1).leading_zeros());
        // 63 + l <= 127.
        let shift = 63_u32.wrapping_add(l);
        let power = 1_u128.wrapping_shl(shift);
        // ceil(2^k / d) below 2^64 (module docs); the fallback is never taken.
        let multiplier = u64::try_from(power.div_ceil(u128::from(d))).unwrap_or(0);
        Self {
            divisor,
            multiplier,
            shift,
        }
    }

    /// `x / divisor`, floored.
    #[inline]
    pub(crate) fn divide(&self, x: u64) -> u64 {
        if x >> 63 != 0 || self.multiplier == 0 {
            // Division by `NonZeroU64` cannot fail.
            return x / self.divisor;
        }
        // x < 2^63 and m < 2^64: the product is below 2^127.
        let product = u128::from(x).wrapping_mul(u128::from(self.multiplier));
        // The quotient is at most x: it fits.
        product.wrapping_shr(self.shift) as u64
    }

    /// `x / divisor`, rounded up.
    #[inline]
    pub(crate) fn divide_ceil(&self, x: u64) -> u64 {
        let quotient = self.divide(x);
        // quotient * divisor <= x, and is below x exactly when there is a remainder.
        let exact = quotient.wrapping_mul(self.divisor.get()) == x;
        quotient.wrapping_add(u64::from(!exact))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::arithmetic_side_effects)]

    use proptest::prelude::*;

    use super::*;

    fn by(d: u64) -> Reciprocal {
        Reciprocal::new(NonZeroU64::new(d).unwrap())
    }

    #[test]
    fn divides_exactly_at_the_edges_of_every_width() {
        let mut divisors = vec![1, 2, 3, 7, 10, 1_000, 1_000_000, 999_999_937, u64::MAX];
        for bit in 1..64 {
            let power = 1_u64 << bit;
            divisors.extend([power - 1, power, power + 1]);
        }
        for d in divisors {
            let r = by(d);
            for x in [
                0,
                1,
                d - 1,
                d,
                d.saturating_add(1),
                d.saturating_mul(3).saturating_sub(1),
                (1 << 63) - 1,
                1 << 63,
                u64::MAX - 1,
                u64::MAX,
            ] {
                assert_eq!(r.divide(x), x / d, "{x} / {d}");
                assert_eq!(r.divide_ceil(x), x.div_ceil(d), "ceil {x} / {d}");
            }
        }
    }

    proptest! {
        #[test]
        fn divides_like_the_division_instruction(d in 1..=u64::MAX, x in any::<u64>()) {
            prop_assert_eq!(by(d).divide(x), x / d);
            prop_assert_eq!(by(d).divide_ceil(x), x.div_ceil(d));
        }

        #[test]
        fn divides_like_the_division_instruction_for_small_divisors(d in 1..=100_000u64, x in any::<u64>()) {
            prop_assert_eq!(by(d).divide(x), x / d);
        }
    }
}
