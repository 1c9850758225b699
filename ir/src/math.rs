//! The transcendental functions `sin`, `cos`, `tanh`, `erf`, `sigmoid`, `log` and `log2` as
//! kiln computes them: one fixed, branch-free sequence per element in f64, rounded once to f32.
//! The PTX writer emits these exact steps (the same constants, the same fused multiply-adds,
//! in the same order) and the interpreter runs these functions, so the two agree bit for bit.
//! Every result is within an f32 rounding (about 1 ulp) of the exact value; each function's
//! doc says how it is computed.

use std::f64::consts::{FRAC_2_SQRT_PI, FRAC_PI_2, LN_2, LOG2_E};

/// The bits of `2/pi` in 32-bit words, most significant first, after one zero word: the
/// reduction reads four consecutive words starting one word before the first word that
/// matters, which is word -1 (the zero) for `|x| < 2^8`.
pub const TWO_OVER_PI: [u32; 9] = [
    0,
    0xa2f9_836e,
    0x4e44_1529,
    0xfc27_57d1,
    0xf534_ddc0,
    0xdb62_9599,
    0x3c43_9041,
    0xfe51_63ab,
    0xdebb_c561,
];

/// Below this `|x|` (an f32 between 1/2 and `pi/4`) `sin`/`cos` use `r = x` unreduced; from
/// it on, the integer reduction, which needs `|x| >= 1/2`.
pub const REDUCE_FROM: f32 = 0.781_25;

/// `(pi/2) * 2^-64`: scales the reduction's signed 64-bit fraction of a quadrant to radians.
pub const QUADRANT_SCALE: f64 = FRAC_PI_2 / 18_446_744_073_709_551_616.0;

/// `sin(r) = r * P(r^2)` on `|r| <= pi/4`: Taylor coefficients `(-1)^k / (2k+1)!`, k = 0..=5
/// (truncation error below 1e-11).
pub fn sin_coeffs() -> [f64; 6] {
    taylor(1)
}

/// `cos(r) = P(r^2)`: `(-1)^k / (2k)!`, k = 0..=6 (truncation error below 1e-12).
pub fn cos_coeffs() -> [f64; 7] {
    taylor(0)
}

/// `(-1)^k / (2k + first)!` for k = 0..N.
fn taylor<const N: usize>(first: u32) -> [f64; N] {
    let mut out = [0.0; N];
    for (k, c) in out.iter_mut().enumerate() {
        let n = 2 * k as u32 + first;
        let fact: f64 = (1..=n).map(f64::from).product();
        *c = if k % 2 == 0 { 1.0 } else { -1.0 } / fact;
    }
    out
}

/// `e^r = P(r)` on `|r| <= ln2/2`: `1/n!`, n = 0..=11 (relative truncation error below 1e-14).
pub fn exp_coeffs() -> [f64; 12] {
    let mut out = [0.0; 12];
    let mut fact = 1.0;
    for (n, c) in out.iter_mut().enumerate() {
        if n > 0 {
            fact *= n as f64;
        }
        *c = 1.0 / fact;
    }
    out
}

/// `ln 2` split so that `k * LN2_HI` is exact for the `|k| < 2^11` [`exp64`] meets.
pub fn ln2_split() -> (f64, f64) {
    let hi = f64::from_bits(LN_2.to_bits() & !0x7ff);
    (hi, LN_2 - hi)
}

/// `erf(a) = a * P(a^2)` on `[0, 1)`: `(2/sqrt(pi)) (-1)^n / (n! (2n+1))`, n = 0..=12
/// (truncation error below 1e-10).
pub fn erf_taylor() -> [f64; 13] {
    let mut out = [0.0; 13];
    let mut fact = 1.0;
    for (n, c) in out.iter_mut().enumerate() {
        if n > 0 {
            fact *= n as f64;
        }
        let sign = if n % 2 == 0 { 1.0 } else { -1.0 };
        *c = FRAC_2_SQRT_PI * sign / (fact * (2 * n + 1) as f64);
    }
    out
}

/// Chebyshev coefficients of `erf(a)` on `[1, 4]` in `t = (2a - 5) / 3`: interpolation at
/// the 19 Chebyshev nodes of the first kind (largest error about 2e-11), computed offline from
/// double-precision `erf` values; `tests::erf_matches_a_series_reference` re-checks them.
pub const ERF_CHEBYSHEV: [f64; 19] = [
    0.969_697_479_460_005_2,
    0.054_251_323_896_461_034,
    -0.038_763_756_439_034_354,
    0.021_797_487_803_849_623,
    -0.009_314_174_792_885_052,
    0.002_748_111_832_708_715,
    -0.000_357_675_173_901_687_17,
    -0.000_126_862_210_713_679_92,
    8.896_524_124_890_029e-5,
    -2.228_847_529_060_408_2e-5,
    7.040_156_691_536_031e-8,
    1.808_171_485_253_701_3e-6,
    -5.517_666_265_290_22e-7,
    2.368_918_669_997_929e-8,
    3.172_083_979_696_120_5e-8,
    -9.389_214_926_015_58e-9,
    2.260_895_126_086_830_5e-10,
    5.035_960_449_820_277e-10,
    -1.241_937_955_984_589_6e-10,
];

/// The bits of `sqrt(1/2)` in f64: subtracting them from `x`'s bits leaves `k` in the
/// exponent field exactly when `x = 2^k * m` with `m` in `[sqrt(1/2), sqrt(2))`.
pub const LOG_SPLIT_BITS: u64 = 0x3fe6_a09e_667f_3bcd;

/// `ln m = 2s P(s^2)` with `s = (m - 1) / (m + 1)`: the series of `atanh`, `1 / (2n + 1)`,
/// n = 0..=7; with `s^2 <= 0.0295` the first term left out is below `4e-14` of the sum.
pub fn log_coeffs() -> [f64; 8] {
    let mut out = [0.0; 8];
    for (n, c) in out.iter_mut().enumerate() {
        *c = 1.0 / (2 * n + 1) as f64;
    }
    out
}

/// Where `tanh` is `x` itself in f32 (`x^3/3` is below half an ulp of `x`).
pub const TANH_LINEAR_BELOW: f64 = 1.0 / 4096.0;
/// Where `tanh` is clamped (it rounds to 1 in f32 well before).
pub const TANH_CLAMP: f64 = 20.0;
/// Where `sigmoid`'s exponent is clamped (the result is 0 or 1 in f32 beyond).
pub const SIGMOID_CLAMP: f64 = 110.0;

/// Horner's rule with fused multiply-adds, highest coefficient first: what the PTX writes.
pub fn horner(coeffs: &[f64], x: f64) -> f64 {
    let mut it = coeffs.iter().rev();
    let mut p = it.next().copied().unwrap_or(0.0);
    for &c in it {
        p = p.mul_add(x, c);
    }
    p
}

/// Clenshaw's recurrence for `sum c_k T_k(t)`: `b = fma(2t, b1, c_k) - b2`.
pub fn clenshaw(coeffs: &[f64], t: f64) -> f64 {
    let (mut b1, mut b2) = (0.0f64, 0.0f64);
    let t2 = t + t;
    for &c in coeffs[1..].iter().rev() {
        let b0 = t2.mul_add(b1, c) - b2;
        b2 = b1;
        b1 = b0;
    }
    t.mul_add(b1, coeffs[0]) - b2
}

/// `x mod pi/2`: the quadrant `q` (mod 4) and the remainder `r` in radians, `|r| <= pi/4`,
/// with `x = q * pi/2 + r` (for finite `x`).
pub fn reduce_half_pi(x: f32) -> (u32, f64) {
    if x.abs() < REDUCE_FROM {
        return (0, f64::from(x));
    }
    let bits = x.to_bits();
    let e = ((bits >> 23) & 0xff) as i32 - 150;
    let m = u64::from((bits & 0x7f_ffff) | 0x80_0000);
    // |x| = m * 2^e. Words of 2/pi before word j only add multiples of 4 to x * 2/pi.
    let j = (e - 2) >> 5;
    let idx = (j + 1).max(0) as usize;
    let s = e - 32 * j;
    let word = |i: usize| u64::from(TWO_OVER_PI[(idx + i).min(TWO_OVER_PI.len() - 1)]);
    let (whi, wlo) = (word(0) << 32 | word(1), word(2) << 32 | word(3));
    // The low 128 bits of m * window; its binary point sits at bit 128 - s.
    let p0 = m.wrapping_mul(wlo);
    let carry = ((u128::from(m) * u128::from(wlo)) >> 64) as u64;
    let p1 = m.wrapping_mul(whi).wrapping_add(carry);
    let sh = (66 - s) as u32;
    // Two integer bits and 62 fraction bits of |x| * 2/pi.
    let frac = shr(p0, sh) | shl(p1, 64 - sh);
    let q = (frac.wrapping_add(1 << 61) >> 62) as u32;
    let r = ((frac << 2) as i64) as f64 * QUADRANT_SCALE;
    if x < 0.0 {
        (q.wrapping_neg(), -r)
    } else {
        (q, r)
    }
}

/// `x >> n` with PTX's clamp of the amount to 64.
fn shr(x: u64, n: u32) -> u64 {
    x.checked_shr(n).unwrap_or(0)
}

/// `x << n` with PTX's clamp of the amount to 64.
fn shl(x: u64, n: u32) -> u64 {
    x.checked_shl(n).unwrap_or(0)
}

/// `sin(x)` (`quarter = 0`) or `cos(x)` (`quarter = 1`): `sin(x + quarter * pi/2)`.
fn sin_quadrant(x: f32, quarter: u32) -> f32 {
    if !x.is_finite() {
        return f32::NAN;
    }
    let (q, r) = reduce_half_pi(x);
    let r2 = r * r;
    let s = r * horner(&sin_coeffs(), r2);
    let c = horner(&cos_coeffs(), r2);
    let n = q.wrapping_add(quarter);
    let v = if n & 1 == 0 { s } else { c };
    (if n & 2 == 0 { v } else { -v }) as f32
}

/// `sin(x)`: `x` reduced modulo `pi/2` exactly for every finite f32 ([`reduce_half_pi`],
/// Payne-Hanek: the 24-bit mantissa times a 128-bit window of the bits of `2/pi`, in
/// integers), then Taylor polynomials of `sin` and `cos` on `|r| <= pi/4` in f64.
pub fn sin(x: f32) -> f32 {
    sin_quadrant(x, 0)
}

/// `cos(x)`, reduced and evaluated as [`sin`] is.
pub fn cos(x: f32) -> f32 {
    sin_quadrant(x, 1)
}

/// `e^y` for `|y| <= 220`: `2^k * e^r` with `k = rint(y log2 e)`.
pub fn exp64(y: f64) -> f64 {
    let (hi, lo) = ln2_split();
    let k = (y * LOG2_E).round_ties_even();
    let r = (-k).mul_add(hi, y);
    let r = (-k).mul_add(lo, r);
    let scale = f64::from_bits(((k as i64 + 1023) as u64) << 52);
    horner(&exp_coeffs(), r) * scale
}

/// `tanh(x)`, through an f64 exponential ([`exp64`]: `2^k * e^r`, `|r| <= ln2/2`).
pub fn tanh(x: f32) -> f32 {
    let a = f64::from(x).abs().min(TANH_CLAMP);
    let e = exp64(a + a);
    let t = ((e - 1.0) / (e + 1.0)).copysign(f64::from(x)) as f32;
    if x.is_nan() || f64::from(x).abs() < TANH_LINEAR_BELOW {
        x
    } else {
        t
    }
}

/// `1 / (1 + e^-x)`, through an f64 exponential ([`exp64`]).
pub fn sigmoid(x: f32) -> f32 {
    let y = (-f64::from(x)).clamp(-SIGMOID_CLAMP, SIGMOID_CLAMP);
    let s = (1.0 / (1.0 + exp64(y))) as f32;
    if x.is_nan() { x } else { s }
}

/// `erf(x)`: a Taylor polynomial below 1, a degree-18 Chebyshev interpolant of `erf` on
/// `[1, 4]`, and 1 above (where `erf` rounds to 1 in f32).
pub fn erf(x: f32) -> f32 {
    let a = f64::from(x).abs();
    let small = a * horner(&erf_taylor(), a * a);
    let t = a.mul_add(2.0 / 3.0, -5.0 / 3.0);
    let mid = clenshaw(&ERF_CHEBYSHEV, t);
    let v = if a < 1.0 {
        small
    } else if a >= 4.0 {
        1.0
    } else {
        mid
    };
    if x.is_nan() {
        x
    } else {
        v.copysign(f64::from(x)) as f32
    }
}

/// `x = 2^k * m`, `m` in `[sqrt(1/2), sqrt(2))`, as `(k, ln m)`, for a positive finite `x`
/// (anything else gives values [`log_special`] replaces).
pub fn log_parts(x: f32) -> (f64, f64) {
    let bits = f64::from(x).to_bits();
    let k = (bits.wrapping_sub(LOG_SPLIT_BITS) as i64) >> 52;
    let m = f64::from_bits(bits.wrapping_sub((k as u64) << 52));
    // m - 1 is exact (Sterbenz); the quotient is rounded once.
    let s = (m - 1.0) / (m + 1.0);
    let p = horner(&log_coeffs(), s * s);
    (k as f64, (s + s) * p)
}

/// `v` rounded to f32 for a positive finite `x`; IEEE's answers elsewhere: NaN for a NaN
/// (the same bits) or a negative `x`, `-inf` at `+-0`, `+inf` at `+inf`.
pub fn log_special(x: f32, v: f64) -> f32 {
    if x.is_nan() {
        x
    } else if x < 0.0 {
        f32::NAN
    } else if x == 0.0 {
        f32::NEG_INFINITY
    } else if x == f32::INFINITY {
        x
    } else {
        v as f32
    }
}

/// The natural logarithm `ln x`: `x` (exact in f64, subnormals included) split into
/// `2^k * m` with `m` in `[sqrt(1/2), sqrt(2))` by integer arithmetic on its bits, then
/// `ln m = 2 atanh(s)` with `s = (m - 1) / (m + 1)`, `|s| <= 0.172`, an odd polynomial; `k`
/// is added in one fused multiply-add, so near `x = 1` the error stays relative (no `k` to
/// cancel against).
pub fn log(x: f32) -> f32 {
    let (k, lnm) = log_parts(x);
    log_special(x, k.mul_add(LN_2, lnm))
}

/// `log2 x`, computed as [`log`] is.
pub fn log2(x: f32) -> f32 {
    let (k, lnm) = log_parts(x);
    log_special(x, lnm.mul_add(LOG2_E, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `erf` by its series of positive terms, `2/sqrt(pi) e^-a^2 sum a (2a^2)^n / (2n+1)!!`,
    /// which has no cancellation: a reference independent of the coefficients above.
    fn erf_series(a: f64) -> f64 {
        let (mut term, mut sum) = (a, 0.0);
        for n in 0..400 {
            sum += term;
            term *= 2.0 * a * a / f64::from(2 * n + 3);
        }
        FRAC_2_SQRT_PI * (-a * a).exp() * sum
    }

    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let ulp = f64::from(f32::from_bits(w.abs().to_bits() + 1) - w.abs())
            .max(f64::from(f32::MIN_POSITIVE) * f64::from(f32::EPSILON));
        (f64::from(got) - want).abs() / ulp
    }

    #[test]
    fn erf_matches_a_series_reference() {
        for i in 0..=20_000 {
            let x = (-5.0 + 10.0 * f64::from(i) / 20_000.0) as f32;
            let xf = f64::from(x);
            let want = erf_series(xf.abs()).copysign(xf);
            let got = erf(x);
            assert!(ulps(got, want) <= 1.0, "erf({x}) = {got}, want {want}");
        }
    }

    #[test]
    fn sin_cos_are_within_an_ulp_across_magnitudes() {
        let mut state = 0x1234_5678_9abc_def0u64;
        for _ in 0..200_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let x = f32::from_bits((state >> 32) as u32);
            if !x.is_finite() {
                continue;
            }
            let (s, c) = (f64::from(x).sin(), f64::from(x).cos());
            assert!(
                ulps(sin(x), s) <= 1.0,
                "sin({x:e}) = {:e}, want {s:e}",
                sin(x)
            );
            assert!(
                ulps(cos(x), c) <= 1.0,
                "cos({x:e}) = {:e}, want {c:e}",
                cos(x)
            );
        }
    }

    #[test]
    fn log_and_log2_are_within_an_ulp_everywhere() {
        let check = |x: f32| {
            let xf = f64::from(x);
            assert!(ulps(log(x), xf.ln()) <= 1.0, "log({x:e}) = {:e}", log(x));
            assert!(
                ulps(log2(x), xf.log2()) <= 1.0,
                "log2({x:e}) = {:e}",
                log2(x)
            );
        };
        // Every positive finite f32 bit pattern at a stride: subnormals, near 1, huge.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..300_000 {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            let x = f32::from_bits((state >> 33) as u32 % 0x7f80_0000);
            if x > 0.0 {
                check(x);
            }
        }
        // Each side of 1, where the result is tiny and only a relative error is acceptable.
        for i in 1..20_000u32 {
            check(f32::from_bits(1.0f32.to_bits() + i));
            check(f32::from_bits(1.0f32.to_bits() - i));
        }
        for x in [
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::MAX,
            0.5,
            2.0,
            0.707_106_77,
        ] {
            check(x);
        }
        assert_eq!(log(1.0).to_bits(), 0.0f32.to_bits());
        assert_eq!(log2(8.0), 3.0);
        assert_eq!(log2(f32::from_bits(1)), -149.0);
        assert_eq!(log(0.0), f32::NEG_INFINITY);
        assert_eq!(log2(-0.0), f32::NEG_INFINITY);
        assert_eq!(log(f32::INFINITY), f32::INFINITY);
        assert!(log(-1.0).is_nan() && log2(f32::NEG_INFINITY).is_nan());
        let nan = f32::from_bits(0x7fc0_1234);
        assert_eq!(log2(nan).to_bits(), nan.to_bits());
    }

    #[test]
    fn tanh_and_sigmoid_are_within_an_ulp() {
        for i in 0..=200_000 {
            let x = (-120.0 + 240.0 * f64::from(i) / 200_000.0) as f32;
            let xf = f64::from(x);
            assert!(ulps(tanh(x), xf.tanh()) <= 1.0, "tanh({x})");
            let sg = 1.0 / (1.0 + (-xf).exp());
            assert!(
                ulps(sigmoid(x), sg) <= 1.0,
                "sigmoid({x}) = {}, want {sg}",
                sigmoid(x)
            );
        }
        assert!(tanh(f32::NAN).is_nan() && sigmoid(f32::NAN).is_nan() && erf(f32::NAN).is_nan());
        assert!(sin(f32::INFINITY).is_nan() && cos(f32::NAN).is_nan());
    }
}
