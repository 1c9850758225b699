//! kiln_attn without Python: FlashAttention's `flash_attn_func` arguments checked and mapped
//! onto kiln's DSL attention (`kiln_examples::attention`, `[batch, heads, seq, d]`): the BSHD
//! tensors are the same memory through swapped strides, so nothing is copied. [`generic`] does
//! the same for any registered kernel by name; [`backward`] plans and runs the backward kernels.
//!
//! **Architecture invariant:** this crate knows nothing of Python. The extension (the
//! `kiln-attn` crate) only turns Python objects into [`args::TensorInfo`] and errors into
//! exceptions; every rule lives here, unit-tested without an interpreter or a GPU.

pub mod args;
pub mod backward;
pub mod generic;
pub mod launch;
pub mod varlen;

/// The kiln crate this package is built on (its IR, registry and runtime types), for the
/// extension's conversions.
pub use kiln;
/// The decode kernels' choices the Python decode path makes the same way (the split-KV
/// count).
pub use kiln_examples::attention_decode as decode;
/// How the row kernels split a row over a block, for the Python ops' choice.
pub use kiln_examples::rows;
