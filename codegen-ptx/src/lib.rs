//! # kiln-ptx: the PTX backend
//!
//! Turns a verified kernel into PTX text for a [`Target`]: [`compile`] runs the pass pipeline
//! (`kiln_ir::passes`) on a copy of the kernel, then [`writer::Writer`] writes the scheduled
//! kernel (sm_80 only: `mma.sync`, `ldmatrix`, `cp.async`, warp shuffles).
//!
//! **The launch ABI** (parameter order and types, launch geometry, dynamic shared memory) is
//! specified in [`abi`]; [`abi::slots`] lists an entry's parameters for the runtime.
//!
//! Output is deterministic: registers are numbered in writing order, and every IR op is
//! preceded by a comment with its source location and printed form.
//!
//! **Architecture invariant:** kiln-ptx knows nothing of syn or the CUDA driver; it reads the
//! IR and writes text.

pub mod abi;
mod arith;
mod control;
mod memory;
mod mma;
pub mod ptxas;
mod sync;
pub mod types;
pub mod writer;

use kiln_ir::{Diagnostic, Kernel, Target};

/// A compiled kernel: PTX text plus what the runtime needs to launch it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxModule {
    /// The whole PTX module (`.version`, `.target`, one `.entry`).
    pub ptx: String,
    /// The entry's name.
    pub entry: String,
    /// Threads per block the kernel must be launched with.
    pub threads_per_block: u32,
    /// Dynamic shared memory bytes the launch must request.
    pub dynamic_smem_bytes: u32,
    /// The target it was compiled for.
    pub target: Target,
}

/// Why a kernel could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// The kernel is wrong or over a budget; reported at the user's source.
    #[error("{0}")]
    Diagnostic(#[from] Diagnostic),
    /// The kernel uses something this target's backend does not implement.
    #[error("`{op}` is not supported on {target}")]
    Unsupported {
        /// The operation, as the IR prints it.
        op: String,
        /// The target.
        target: Target,
    },
}

/// Runs the pass pipeline for `target` on a copy of `kernel` and writes PTX.
pub fn compile(kernel: &Kernel, target: Target) -> Result<PtxModule, CodegenError> {
    let mut k = kernel.clone();
    kiln_ir::passes::run_pipeline(&mut k, target, &mut |_, _| {})?;
    writer::Writer::new(&k).write(target)
}
