//! # kiln-llvm: a second backend, for checking
//!
//! Lowers a kernel scheduled for sm_80 (the `verify`, `canonicalize`, `layout`, `memory_plan`
//! and `lower` passes of `kiln_ir::passes`) to an LLVM module for `nvptx64-nvidia-cuda` and
//! has LLVM's NVPTX target write it as PTX, to check the PTX backend (`kiln-ptx`) against an
//! independent code generator, not to replace it. Built without the cargo feature `llvm` (the
//! default) this crate is empty; with it, it links LLVM 14 (`scripts/ensure-llvm`) through
//! `inkwell`. What it reuses from `kiln-ptx` and the IR subset it lowers: `docs/testing.md`.

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
