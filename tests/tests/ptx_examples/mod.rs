//! The example kernels the PTX tests compile: each registry kernel at its default comptime
//! values, plus the documented attention variants (causal, d = 64).

#![allow(dead_code)]

use kiln::ir::Kernel;
use kiln::ir::dsl::{KernelDef, Spec};

/// Comptime overrides, as `-D name=value` pairs.
pub type Overrides = &'static [(&'static str, &'static str)];

/// `(snapshot name, kernel, comptime overrides)` of every tested variant.
pub const VARIANTS: &[(&str, &str, Overrides)] = &[
    ("vector_add", "vector_add", &[]),
    ("softmax", "softmax", &[]),
    ("gemm", "gemm", &[]),
    ("attention", "attention", &[]),
    ("attention_causal", "attention", &[("causal", "true")]),
    ("attention_d64", "attention", &[("d", "64")]),
];

/// Builds registry kernel `kernel` with `overrides` on its defaults.
pub fn build(kernel: &str, overrides: &[(&str, &str)]) -> Kernel {
    let def: &dyn KernelDef = *kiln_examples::registry()
        .iter()
        .find(|d| d.name() == kernel)
        .unwrap_or_else(|| panic!("no example kernel `{kernel}`"));
    let o: Vec<(String, String)> = overrides
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let spec = Spec::from_defaults(def, &o).unwrap_or_else(|e| panic!("{kernel}: {e}"));
    def.build(&spec)
        .unwrap_or_else(|d| panic!("{kernel} does not build: {d}"))
}

/// Every variant, built.
pub fn all() -> Vec<(&'static str, Kernel)> {
    VARIANTS
        .iter()
        .map(|(name, kernel, o)| (*name, build(kernel, o)))
        .collect()
}
