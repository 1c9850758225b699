//! `exp2` on the FMA pipes: the polynomial the sm_100a softmax uses for a share of its
//! exponentials, so the multi-function unit (`ex2.approx`, 16 results per clock per SM quarter)
//! is not the only pipe computing them (FlashAttention-4's idea).

/// Coefficients of `f`, `f^2`, `f^3` of the cubic for `2^f` on `[0, 1)`; its constant term
/// is exactly 1 (so `2^0 = 1` exactly, as the row maximum's own term must be).
///
/// The cubic interpolates `2^f` at three nodes chosen so its relative error equioscillates
/// (our own fit, not a published table): at most `4.5e-4` on `[0, 1)`, under a quarter of a
/// bf16 half-ulp (`2^-9`), so the bf16 `P` the tail mma reads rounds as from the exact value
/// but for ties.
pub const EXP2_POLY: [f32; 3] = [0.693_905_4, 0.232_864_59, 0.072_357_684];

/// Below this input the result is 0 (`2^x` is not a normal f32), as `ex2.approx.ftz` gives.
pub const EXP2_POLY_MIN: f32 = -126.0;

/// The polynomial exponential exactly as the PTX computes it (f32 operations in the same
/// order), for tests and for the CPU model of the schedule: `2^x = 2^j * 2^f` with
/// `j = floor(x)` and `f = x - j`, `2^f` the cubic [`EXP2_POLY`] (Horner, three FMAs) and `2^j`
/// added to the result's exponent field with an integer shift and add.
pub fn exp2_poly(x: f32) -> f32 {
    if x.is_nan() {
        return x;
    }
    if x < EXP2_POLY_MIN {
        return 0.0;
    }
    let j = x.min(127.0).floor();
    let f = x.min(127.0) - j;
    let [c1, c2, c3] = EXP2_POLY;
    let p = c3.mul_add(f, c2).mul_add(f, c1).mul_add(f, 1.0);
    f32::from_bits(p.to_bits().wrapping_add(((j as i32) << 23) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The polynomial is accurate to a bf16 `P`: relative error under `2^-9` (half a bf16
    /// ulp is `2^-8` relative at worst) everywhere the softmax evaluates it (`x <= 8`, the
    /// deferral's threshold, and far below 0), exact at integers and 0 below the normal range.
    #[test]
    fn accurate_to_bf16() {
        let mut worst = 0.0f64;
        for i in 0..=200_000 {
            let x = -130.0 + 138.0 * f64::from(i) / 200_000.0;
            let got = f64::from(exp2_poly(x as f32));
            let want = (x as f32 as f64).exp2();
            if (x as f32) < EXP2_POLY_MIN {
                assert_eq!(got, 0.0, "x = {x}");
                continue;
            }
            worst = worst.max((got / want - 1.0).abs());
        }
        assert!(worst < 4.5e-4, "worst relative error {worst}");
        assert!(worst < 2f64.powi(-9));
        for j in -126..=8 {
            assert_eq!(exp2_poly(j as f32), (j as f32).exp2(), "2^{j}");
        }
        assert_eq!(exp2_poly(f32::NEG_INFINITY), 0.0);
    }
}
