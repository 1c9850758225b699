//! kiln_attn without Python: FlashAttention's `flash_attn_func` arguments checked and mapped
//! onto kiln's DSL attention (`kiln_examples::attention`), which takes `[batch, heads, seq, d]`
//! tensors. FlashAttention's BSHD tensors are the same memory seen through swapped strides,
//! so nothing is copied: the kernel reads PyTorch's memory in place and writes its output.
//! [`generic`] does the same for any registered kernel by name (`kiln_attn.kernel`): its
//! arguments and comptime values checked against its declaration, the launch on the caller's
//! stream, or a run on the CPU interpreter over host memory. [`backward`] checks a backward
//! call's gradients and buffers against the forward's plan and runs the backward kernels.
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
