//! Rounding an f64 to the 16-bit float types once, to the nearest value, ties to even: as the
//! GPU's `cvt.rn` rounds an f32, so that host data, interpreted constants and references agree
//! with a kernel bit for bit. `half`'s own `from_f64` drops the low 32 bits of the mantissa
//! before it rounds to bf16 (a value a hair past a tie rounds as the tie: to even, the wrong
//! way) and rounds f16 through f32 (twice); here the f32 route gives a candidate and its two
//! neighbours decide on the f64 itself.

use half::{bf16, f16};

/// `x` rounded to the nearest bf16 (ties to even).
pub fn to_bf16(x: f64) -> bf16 {
    let bits = nearest(x, bf16::from_f32(x as f32).to_bits(), 0x7f80, |b| {
        bf16::from_bits(b).to_f64()
    });
    bf16::from_bits(bits)
}

/// `x` rounded to the nearest f16 (ties to even).
pub fn to_f16(x: f64) -> f16 {
    let bits = nearest(x, f16::from_f32(x as f32).to_bits(), 0x7c00, |b| {
        f16::from_bits(b).to_f64()
    });
    f16::from_bits(bits)
}

/// Of `candidate` (the bits of a 16-bit float within one unit of `x`'s nearest) and its two
/// neighbours in magnitude, the bits nearest `x`, the even ones on a tie. `infinity`: the
/// magnitude bits of infinity, where an overflow keeps the candidate.
fn nearest(x: f64, candidate: u16, infinity: u16, value: impl Fn(u16) -> f64) -> u16 {
    let (sign, magnitude) = (candidate & 0x8000, candidate & 0x7fff);
    if !x.is_finite() || magnitude >= infinity {
        return candidate;
    }
    let mut best = candidate;
    for m in [magnitude.checked_sub(1), Some(magnitude + 1)]
        .into_iter()
        .flatten()
        .filter(|&m| m < infinity)
    {
        let b = sign | m;
        let (d, d_best) = ((x - value(b)).abs(), (x - value(best)).abs());
        if d < d_best || d == d_best && b & 1 == 0 {
            best = b;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every pair of neighbouring finite values, both signs: a hair below their midpoint
    /// rounds to the lower, a hair above to the upper, the midpoint itself to the even one.
    fn ties(to: fn(f64) -> u16, value: fn(u16) -> f64, infinity: u16) {
        for sign in [0u16, 0x8000] {
            for m in 0..infinity - 1 {
                let (lo, hi) = (sign | m, sign | (m + 1));
                let mid = (value(lo) + value(hi)) / 2.0;
                let hair = (value(hi) - value(lo)).abs() * 1e-9;
                let toward_hi = if sign == 0 { hair } else { -hair };
                assert_eq!(to(mid - toward_hi), lo, "below the tie of {lo:#06x}");
                assert_eq!(to(mid + toward_hi), hi, "above the tie of {lo:#06x}");
                let even = if m % 2 == 0 { lo } else { hi };
                assert_eq!(to(mid), even, "the tie of {lo:#06x}");
                assert_eq!(to(value(lo)), lo, "{lo:#06x} itself");
            }
        }
    }

    #[test]
    fn bf16_rounds_once_to_the_nearest() {
        ties(
            |x| to_bf16(x).to_bits(),
            |b| bf16::from_bits(b).to_f64(),
            0x7f80,
        );
        // Just past the tie between 10.25 and 10.3125 by less than `half` keeps.
        assert_eq!(to_bf16(10.281255722045898).to_f64(), 10.3125);
    }

    #[test]
    fn f16_rounds_once_to_the_nearest() {
        ties(
            |x| to_f16(x).to_bits(),
            |b| f16::from_bits(b).to_f64(),
            0x7c00,
        );
    }

    #[test]
    fn overflow_and_specials_keep_their_meaning() {
        assert!(to_bf16(f64::INFINITY).to_f64().is_infinite());
        assert!(to_bf16(f64::NAN).is_nan());
        assert!(to_f16(1e9).to_f64().is_infinite());
        assert_eq!(to_f16(-0.0).to_bits(), 0x8000);
        assert_eq!(to_bf16(0.0).to_bits(), 0);
    }
}
