//! # kiln-llvm: a second backend, for checking
//!
//! Lowers a kernel scheduled for sm_80 (the `verify`, `canonicalize`, `layout`, `memory_plan`
//! and `lower` passes of `kiln_ir::passes`) to an LLVM module for `nvptx64-nvidia-cuda` and
//! has LLVM's NVPTX target write it as PTX. It exists to check the PTX backend (`kiln-ptx`)
//! against an independent code generator, not to replace it: the differential tests assemble
//! both backends' PTX with ptxas and, on a GPU, compare their results.
//!
//! Built without the cargo feature `llvm` (the default) this crate is empty, so the workspace
//! builds without LLVM. With it, it links LLVM 14 (Debian's `llvm-14-dev`, see
//! `scripts/ensure-llvm`) through `inkwell`.
//!
//! What the lowering reuses rather than re-derives: the parameter ABI is
//! [`kiln_ptx::abi::slots`] (so the runtime packs both backends' parameters the same way), the
//! result is a [`kiln_ptx::PtxModule`] (so `Device::load_ptx` and `Device::launch_loaded` take
//! it as they are), and every register tile is laid out by its
//! [`kiln_ir::schedule::Distribution`] and every staged tile by its
//! [`kiln_ir::schedule::SmemBuffer`] (swizzle included), as the passes chose them.
//!
//! The subset: scalars, elementwise ops with broadcasting, `iota`, `splat`, `reshape`,
//! reductions within a warp (warp shuffles), masked global loads and stores, `for` and `if`,
//! and `mma` of shared-memory operands (`ldmatrix` + `mma.sync.m16n8k16` through LLVM 14's
//! NVVM intrinsics, bf16 and f16). Loads staged in shared memory are copied synchronously
//! (no cp.async pipeline: the `lower` pass's loop plans are a performance choice the checking
//! backend does not need). Anything else is an `LlvmError` whose kind is `DiagKind::Unsupported`, at the user's line
//! (with the `llvm` feature).

#[cfg(feature = "llvm")]
mod lower;
#[cfg(feature = "llvm")]
mod memory;
#[cfg(feature = "llvm")]
mod mma;
#[cfg(feature = "llvm")]
mod tile;

#[cfg(feature = "llvm")]
pub use lower::{LlvmError, LlvmModule, compile, compile_scheduled};
