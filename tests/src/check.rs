//! Numerical checks: relative norm error against a reference, poisoned outputs, and an
//! assertion whose message names the kernel, the shape, the distribution and the seed.

use std::fmt;

use kiln_ir::{DType, HostTensor};

use crate::inputs::Dist;

/// `||out - reference|| / ||reference||` in the 2-norm, or the absolute `||out - reference||`
/// when the reference is all zeros. Any NaN in `out` (a poisoned element left unwritten)
/// gives NaN, which fails every comparison.
pub fn rel_error(out: &[f64], reference: &[f64]) -> f64 {
    error_against(out, reference, reference)
}

/// `||out - reference|| / ||terms||` in the 2-norm (absolute when `terms` are all zeros);
/// NaN for any NaN in `out` or a length mismatch.
pub fn error_against(out: &[f64], reference: &[f64], terms: &[f64]) -> f64 {
    if out.len() != reference.len() || out.iter().any(|x| x.is_nan()) {
        return f64::NAN;
    }
    let diff: f64 = out
        .iter()
        .zip(reference)
        .map(|(o, r)| (o - r) * (o - r))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = terms.iter().map(|t| t * t).sum::<f64>().sqrt();
    if norm == 0.0 { diff } else { diff / norm }
}

/// The tolerance on the relative norm error of an output of `dtype`.
pub fn tolerance(dtype: DType) -> f64 {
    match dtype {
        DType::Bf16 => 1e-2,
        DType::F16 => 2e-3,
        DType::F32 => 1e-5,
        DType::I32 | DType::U32 | DType::Bool => 0.0,
    }
}

/// The relative error allowed an f32 sum of `n` terms: each addition rounds by up to 2^-24
/// (the f32 unit roundoff), so the bound grows with `n` (all-equal inputs come near it).
pub fn sum_tolerance(n: usize) -> f64 {
    tolerance(DType::F32).max(n as f64 * f64::from(f32::EPSILON) / 2.0)
}

/// Fills every element of `t` with NaN (i32 tensors with `i32::MIN`, u32 tensors with
/// `0xDEADBEEF`), so that an element the kernel fails to write cannot pass as a correct result.
pub fn poison(t: &mut HostTensor) {
    let n = t.data.len();
    for i in 0..n {
        t.data.set_f64(i, f64::NAN);
    }
    match &mut t.data {
        kiln_ir::TensorData::I32(v) => v.fill(i32::MIN),
        kiln_ir::TensorData::U32(v) => v.fill(0xDEAD_BEEF),
        _ => {}
    }
}

/// A contiguous poisoned output tensor of `shape` and `dtype`.
pub fn poisoned(shape: &[usize], dtype: DType) -> HostTensor {
    let mut t = HostTensor::full(shape, dtype, 0.0);
    poison(&mut t);
    t
}

/// Each element's bits, NaNs told apart by payload: for results that must be identical,
/// not merely close.
pub fn bits(t: &HostTensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|x| x.to_bits()).collect()
}

/// What a numerical check ran: printed in every failure message.
#[derive(Clone, Debug)]
pub struct Case {
    /// The kernel's name (and variant).
    pub kernel: String,
    /// The problem shape, e.g. `m=130 n=70 k=50`.
    pub shape: String,
    /// The input distribution.
    pub dist: Dist,
    /// The RNG seed that drew the inputs.
    pub seed: u64,
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "kernel {} shape [{}] inputs {} (replay with KILN_SEED={})",
            self.kernel, self.shape, self.dist, self.seed
        )
    }
}

/// Asserts that `out` matches `reference` within `tol` relative norm error; the panic
/// message names the case, the error, and the first unwritten (NaN) element if any.
pub fn assert_close(case: &Case, out: &HostTensor, reference: &[f64], tol: f64) {
    assert_close_to_terms(case, out, reference, reference, tol);
}

/// [`assert_close`] for a result that cancels: the error `||out - reference||` against the
/// norm of `terms`, the size of what makes each element (`terms[i] >= |reference[i]|`, e.g.
/// the same computation on absolute values). Floating-point error is bounded by the terms
/// a result is computed from, not by the result: a sum of signed values near 0 is as
/// accurate as any other sum of terms that size.
pub fn assert_close_to_terms(
    case: &Case,
    out: &HostTensor,
    reference: &[f64],
    terms: &[f64],
    tol: f64,
) {
    let got = out.to_f64_vec();
    assert_eq!(
        got.len(),
        reference.len(),
        "{case}: output has {} elements, reference {}",
        got.len(),
        reference.len()
    );
    if let Some(i) = got.iter().position(|x| x.is_nan()) {
        let count = got.iter().filter(|x| x.is_nan()).count();
        panic!("{case}: {count} output element(s) are NaN, the first at flat index {i}");
    }
    let err = error_against(&got, reference, terms);
    assert!(
        err <= tol,
        "{case}: relative norm error {err:.3e} exceeds tolerance {tol:.0e}"
    );
}

/// The terms a log-sum-exp is measured against: `max(|lse|, 1)`. An absolute error in a
/// log-sum-exp is the relative error of the normaliser it stands for (and of every
/// probability recomputed from it), so one near 0 (the maximum cancelling the log of the
/// sum) is held to that, not to its own small size.
pub fn lse_terms(lse: &[f64]) -> Vec<f64> {
    lse.iter().map(|l| l.abs().max(1.0)).collect()
}

/// `reference` as an output tensor of `dtype` holds it: each element below f32's normal range
/// replaced by 0 (the GPU's f32 arithmetic flushes subnormals), then rounded to `dtype`. The
/// rounding keeps f16's subnormals, as the kernels' f32-to-f16 conversion does: near and
/// below f16's smallest normal number (6.1e-5) the grid is 6e-8 apart, so an all-equal input
/// whose every output is that small (`silu(-15)` is `-4.6e-6`, `gelu(-4)` `-5.6e-5`) is
/// matched to its last bit instead of failing a relative tolerance no stored value could
/// meet; elsewhere the rounding is far below any tolerance.
pub fn as_stored(reference: &[f64], dtype: DType) -> Vec<f64> {
    let flushed = |x: f64| {
        if x.abs() < f64::from(f32::MIN_POSITIVE) {
            0.0
        } else {
            x
        }
    };
    HostTensor::from_fn(&[reference.len()], dtype, |i| flushed(reference[i])).to_f64_vec()
}

/// Asserts FlashAttention's test rule for a gradient `got` (named `name`) of a 16-bit kernel:
/// every element finite, and its relative norm error against the `exact` gradient within
/// twice the error of `rounded` (the same computation with the kernel's 16-bit roundings),
/// plus a floor about a quarter of `dtype`'s unit roundoff (1e-3 for bf16, 1e-4 for f16)
/// for gradients whose rounded computation happens to be nearly exact.
pub fn assert_within_rule(
    case: &Case,
    name: &str,
    got: &HostTensor,
    exact: &[f64],
    rounded: &[f64],
    dtype: DType,
) {
    let got = got.to_f64_vec();
    if let Some(i) = got.iter().position(|x| !x.is_finite()) {
        panic!("{case}: {name}[{i}] = {} (not finite)", got[i]);
    }
    let err = rel_error(&got, exact);
    let yardstick = rel_error(rounded, exact);
    let floor = match dtype {
        DType::F16 => 1e-4,
        _ => 1e-3,
    };
    println!("{name}: error {err:.3e}, rounded computation's {yardstick:.3e}");
    assert!(
        err <= 2.0 * yardstick + floor,
        "{case}: {name} relative error {err:.3e} > 2 x {yardstick:.3e} + {floor:.0e}"
    );
}
