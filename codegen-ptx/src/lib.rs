//! # kiln-ptx: the PTX backend
//!
//! Turns a verified kernel into PTX text for a [`Target`]: [`compile`] runs the pass pipeline
//! (`kiln_ir::passes`) on a copy of the kernel, then [`writer::Writer`] writes the scheduled
//! kernel: on sm_80 with `mma.sync`, `ldmatrix`, `cp.async` and warp shuffles; on sm_90a the
//! same, plus the `pipeline` pass's stage rings as a warp-specialised TMA/wgmma loop (`sm90a`);
//! on sm_100a the rings as a TMA/`tcgen05.mma` loop with its accumulator in tensor memory
//! (`sm100a`).
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
mod device_print;
mod memory;
mod mma;
pub mod ptxas;
mod sm100a;
mod sm90a;
mod sync;
pub mod types;
mod values;
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
    /// The TMA descriptors the runtime must encode and pass (sm_90a), one per
    /// [`abi::SlotRole::TensorMap`] slot, in slot order. Empty for other targets.
    pub tensor_maps: Vec<TensorMapSpec>,
    /// Whether the kernel is persistent (`kiln_ir::sched::tiles`): its CTAs walk the
    /// logical grid passed in its [`abi::SlotRole::Grid`] slots.
    pub persistent: bool,
}

/// How the runtime encodes one tensor map (`cuTensorMapEncodeTiled`) for a launch: over the
/// whole tensor argument `param` (its extents and strides), bf16/f16 elements, interleave none,
/// element strides 1, out-of-bounds elements filled with zeros.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMapSpec {
    /// The tensor parameter (index into the kernel's parameters).
    pub param: usize,
    /// Box extents, outermost dimension first (like the tensor's shape).
    pub box_dims: Vec<u32>,
    /// Swizzle span in bytes: 32, 64 or 128 (the inner box row's bytes).
    pub swizzle_bytes: u32,
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
    writer::Writer::new(&k, target).write()
}
