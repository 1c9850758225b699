//! # kiln-ptx: the PTX backend
//!
//! Turns a verified kernel into PTX text for a [`Target`]: [`compile`] runs the pass pipeline
//! (`kiln_ir::passes`) on a copy of the kernel, then [`writer::Writer`] writes the module. The
//! generic writer (`emit`) writes the kernel's own ops as sm_80 runs them (`mma.sync`,
//! `ldmatrix`, `cp.async`, warp shuffles). A kernel with a schedule IR (`kiln_ir::sched`) is
//! written by its target family's writer, which walks the schedule's roles and has the
//! generic writer write the kernel's ops where the programs run them: on sm_90a as a
//! warp-specialised TMA/wgmma loop (`sm90a`), on sm_100a as a TMA/`tcgen05.mma` loop with its
//! accumulators in tensor memory (`sm100a`); what both share (barriers, the tile walk, TMA
//! loads and stores) is in `sched`.
//!
//! **The launch ABI** (parameter order and types, launch geometry, dynamic shared memory) is
//! specified in [`abi`]; [`abi::slots`] lists an entry's parameters for the runtime.
//!
//! Output is deterministic: registers are numbered in writing order, and every IR op is
//! preceded by a comment with its source location and printed form.
//!
//! **Architecture invariant:** kiln-ptx knows nothing of syn or the CUDA driver; it reads the
//! IR and writes text. Its modules import one another in one direction: `writer` (the top)
//! -> the families `sm90a`, `sm100a` -> `sched` -> `emit` -> `types`, `abi`, `error`,
//! `output`; no module imports one that imports it.

pub mod abi;
mod emit;
mod error;
mod output;
pub mod ptxas;
mod sched;
mod sm100a;
mod sm90a;
pub mod source_map;
pub mod types;
pub mod writer;

use kiln_ir::{Kernel, Target};

pub use error::CodegenError;
pub use output::{PtxModule, TensorMapSpec};

/// Runs the pass pipeline for `target` on a copy of `kernel` and writes PTX.
pub fn compile(kernel: &Kernel, target: Target) -> Result<PtxModule, CodegenError> {
    let mut k = kernel.clone();
    kiln_ir::passes::run_pipeline(&mut k, target, &mut |_, _| {})?;
    writer::Writer::new(&k, target).write()
}
