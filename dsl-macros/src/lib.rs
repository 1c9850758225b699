//! kiln-macros: `#[kernel]` turns a Rust function into a kiln kernel definition, and
//! `#[kernel_fn]` makes a helper callable from kernels.
//!
//! A shell around `kiln-macros-expand`, which does the work on `proc_macro2` token streams
//! (so tests and the fuzzer can call it): `parse/` reads and checks the item, `generate/`
//! writes tokens. The macro never panics on user input; every unsupported construct is a
//! `syn::Error` at its token.

use proc_macro::TokenStream;

/// Defines a kernel. Options: `num_warps = N` (warps per block, default 4).
///
/// Parameters are `Tensor<T, R>`/`TensorMut<T, R>` (T in bf16, f16, f32, i32; R in 1..=5),
/// `f32`/`i32` scalars, and comptime values: `const N: usize` generics and `#[comptime]`
/// (or `#[comptime(default = ..)]`) parameters of type usize, i32, bool or f32.
#[proc_macro_attribute]
pub fn kernel(args: TokenStream, item: TokenStream) -> TokenStream {
    kiln_macros_expand::kernel(args.into(), item.into()).into()
}

/// Makes a plain function callable from kernels: its body gets the kernel rewriting (array
/// literals, comparisons, `if`, `for`); calling it while tracing inlines its ops.
#[proc_macro_attribute]
pub fn kernel_fn(args: TokenStream, item: TokenStream) -> TokenStream {
    kiln_macros_expand::kernel_fn(args.into(), item.into()).into()
}
