//! The example kernels the PTX tests compile: each registry kernel at its default comptime
//! values, plus the gemm with column-major B and the documented attention variants (causal,
//! d = 64; the varlen kernels at d = 64, sm_80's spill-free head dim), and for sm_90a the attention schedules its benchmarks run and d = 64 on 192-row
//! query blocks.

#![allow(dead_code)]

use kiln::ir::Kernel;

/// Comptime overrides, as `-D name=value` pairs.
pub type Overrides = &'static [(&'static str, &'static str)];

/// `(snapshot name, kernel, comptime overrides)` of every tested variant.
pub const VARIANTS: &[(&str, &str, Overrides)] = &[
    ("vector_add", "vector_add", &[]),
    // Philox4x32-10 and a select per element: the random-number ops' code size.
    ("dropout", "dropout", &[]),
    ("softmax", "softmax", &[]),
    // The memory-bound row kernels in bf16 and f32: 16-byte vector loads and stores.
    ("softmax_bf16", "softmax", &[("dtype", "bf16")]),
    ("layer_norm", "layer_norm", &[]),
    ("rms_norm_bf16", "rms_norm", &[("dtype", "bf16")]),
    ("gemm", "gemm", &[]),
    ("gemm_bcol", "gemm", &[("b_col_major", "true")]),
    ("attention", "attention", &[]),
    ("attention_causal", "attention", &[("causal", "true")]),
    ("attention_d64", "attention", &[("d", "64")]),
    // One launch over a packed varlen batch: offsets read in the kernel, bounded stores.
    ("attention_varlen_d64", "attention_varlen", &[("d", "64")]),
    (
        "attention_varlen_lse_d64_causal",
        "attention_varlen_lse",
        &[("d", "64"), ("causal", "true")],
    ),
];

/// Variants compiled for sm_90a only: the attention schedules the sm_90a benchmarks run
/// (d = 128 with 128-key blocks, d = 64 causal, d = 256: sm_80's four warps could not hold
/// them in registers; d = 96, whose sm_80 build `attention_features_ptx` assembles).
pub const SM90A_VARIANTS: &[(&str, &str, Overrides)] = &[
    ("attention_bn128", "attention", &[("block_n", "128")]),
    (
        "attention_bn128_causal",
        "attention",
        &[("block_n", "128"), ("causal", "true")],
    ),
    (
        "attention_d64_causal",
        "attention",
        &[("d", "64"), ("causal", "true")],
    ),
    ("attention_d256", "attention", &[("d", "256")]),
    (
        "attention_d256_causal",
        "attention",
        &[("d", "256"), ("causal", "true")],
    ),
    // Head dim 96 in 96-column tiles (64-byte-swizzled TMA boxes of 32 columns).
    ("attention_d96", "attention", &[("d", "96")]),
    // FlashAttention-3's d = 64 query block: 192 rows on three consumer warpgroups.
    (
        "attention_d64_bm192",
        "attention",
        &[("d", "64"), ("block_m", "192")],
    ),
    (
        "attention_d64_bm192_causal",
        "attention",
        &[("d", "64"), ("block_m", "192"), ("causal", "true")],
    ),
    // The varlen kernels at the tuned d = 128 (160 keys) and d = 64 (192 rows) schedules.
    (
        "attention_varlen_lse_bn160_causal",
        "attention_varlen_lse",
        &[("block_n", "160"), ("causal", "true")],
    ),
    (
        "attention_varlen_d64_bm192",
        "attention_varlen",
        &[("d", "64"), ("block_m", "192"), ("block_n", "128")],
    ),
];

/// Builds registry kernel `kernel` with `overrides` on its defaults, every tensor 16-byte
/// aligned.
pub fn build(kernel: &str, overrides: &[(&str, &str)]) -> Kernel {
    build_aligned(kernel, overrides, true)
}

/// Builds registry kernel `kernel` with `overrides` on its defaults and every tensor's
/// `aligned16` set to `aligned`.
pub fn build_aligned(kernel: &str, overrides: &[(&str, &str)], aligned: bool) -> Kernel {
    kiln_examples::build(kernel, overrides, aligned)
        .unwrap_or_else(|e| panic!("{kernel} does not build: {e}"))
}

/// Every variant, built; then the gemm with no tensor known to be 16-byte aligned (the
/// element-wise copy fallback).
pub fn all() -> Vec<(&'static str, Kernel)> {
    let mut out: Vec<(&'static str, Kernel)> = VARIANTS
        .iter()
        .map(|(name, kernel, o)| (*name, build(kernel, o)))
        .collect();
    out.push(("gemm_unaligned", build_aligned("gemm", &[], false)));
    out
}

/// [`all`], then every [`SM90A_VARIANTS`] variant, built.
pub fn all_sm90a() -> Vec<(&'static str, Kernel)> {
    let mut out = all();
    out.extend(
        SM90A_VARIANTS
            .iter()
            .map(|(name, kernel, o)| (*name, build(kernel, o))),
    );
    out
}
