//! What both differential test files share: the example-kernel variants compared, and how
//! one is built.

#![allow(dead_code)]

use kiln::ir::Kernel;
use kiln::ir::dsl::{KernelDef, Spec};

/// Comptime overrides, as `-D name=value` pairs.
pub type Overrides = &'static [(&'static str, &'static str)];

/// `(name, kernel, comptime overrides, tensors 16-byte aligned)` of every variant compared:
/// the sm_80 subset (vector_add, softmax, gemm) at its defaults and at other tile shapes,
/// column-major B, f16, and tensors not known to be aligned.
pub const VARIANTS: &[(&str, &str, Overrides, bool)] = &[
    ("vector_add", "vector_add", &[], true),
    ("vector_add_unaligned", "vector_add", &[], false),
    ("softmax", "softmax", &[], true),
    (
        "softmax_bm1_bn1024",
        "softmax",
        &[("BM", "1"), ("BN", "1024")],
        true,
    ),
    (
        "softmax_bm8_bn128",
        "softmax",
        &[("BM", "8"), ("BN", "128")],
        false,
    ),
    ("gemm", "gemm", &[], true),
    ("gemm_bcol", "gemm", &[("b_col_major", "true")], true),
    (
        "gemm_64x64x32",
        "gemm",
        &[("BM", "64"), ("BN", "64"), ("BK", "32")],
        true,
    ),
    (
        "gemm_bn256_bk32",
        "gemm",
        &[("BN", "256"), ("BK", "32")],
        true,
    ),
    ("gemm_f16", "gemm", &[("dtype", "f16")], true),
    ("gemm_unaligned", "gemm", &[], false),
];

/// Example kernel `kernel`'s definition, and its spec: `overrides` on its defaults, every
/// tensor's `aligned16` set to `aligned`.
pub fn spec(
    kernel: &str,
    overrides: &[(&str, &str)],
    aligned: bool,
) -> (&'static dyn KernelDef, Spec) {
    kiln_examples::spec(kernel, overrides, aligned).unwrap_or_else(|e| panic!("{e}"))
}

/// The IR of [`spec`]'s specialisation.
pub fn build(kernel: &str, overrides: &[(&str, &str)], aligned: bool) -> Kernel {
    let (def, spec) = spec(kernel, overrides, aligned);
    def.build(&spec)
        .unwrap_or_else(|d| panic!("{kernel} does not build: {d}"))
}
