//! kiln-macros: `#[kernel]` turns a Rust function into a kiln kernel definition, and
//! `#[kernel_fn]` makes a helper callable from kernels.
//!
//! A shell around `kiln-macros-expand`, which does the work on `proc_macro2` token streams
//! (so tests and the fuzzer can call it): `parse/` reads and checks the item, `generate/`
//! writes tokens. The macro never panics on user input; every unsupported construct is a
//! `syn::Error` at its token.

use proc_macro::TokenStream;

/// Defines a kernel. Options: `num_warps = N` (warps per block, default 4) and
/// `grid = [X, Y, Z]` (the units of the problem one block covers along each axis, each a
/// literal or a `usize` comptime parameter: `KernelDef::grid` then launches `cdiv(extent,
/// tile)` blocks per axis).
///
/// Parameters are `Tensor<T, R>`/`TensorMut<T, R>` (T in bf16, f16, f32, i32; R in 1..=5),
/// `f32`/`i32` scalars, and comptime values: `const N: usize` generics and `#[comptime]`
/// (or `#[comptime(default = .., tune = [..])]`) parameters of type usize, i32, bool, f32 or
/// DType, which the macro gathers into the kernel's comptime struct (`NAMEComptime`); or one
/// `#[comptime] p: S` parameter, `S` a struct under [`macro@comptime`] several kernels share.
#[proc_macro_attribute]
pub fn kernel(args: TokenStream, item: TokenStream) -> TokenStream {
    kiln_macros_expand::kernel(args.into(), item.into()).into()
}

/// Declares comptime parameters once, as a struct several kernels take as their one comptime
/// parameter (`#[comptime] p: AttentionParams`). Each field is a usize, i32, bool, f32 or DType
/// with optional `#[comptime(default = .., tune = [..])]`; the macro derives Clone, Copy,
/// Debug, PartialEq, Eq and Hash (an f32 field by its bits), Default when every field has a
/// default, and `kiln::ir::dsl::Comptime`.
#[proc_macro_attribute]
pub fn comptime(args: TokenStream, item: TokenStream) -> TokenStream {
    kiln_macros_expand::comptime(args.into(), item.into()).into()
}

/// Makes a plain function callable from kernels: its body gets the kernel rewriting (array
/// literals, comparisons, `if`, `for`); calling it while tracing inlines its ops.
#[proc_macro_attribute]
pub fn kernel_fn(args: TokenStream, item: TokenStream) -> TokenStream {
    kiln_macros_expand::kernel_fn(args.into(), item.into()).into()
}
