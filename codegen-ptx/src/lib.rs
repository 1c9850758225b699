//! # kiln-ptx: the PTX backend
//!
//! Turns a verified kernel into PTX text for a [`Target`]: [`compile`] runs the pass pipeline
//! (`kiln_ir::passes`) on a copy of the kernel, then [`writer::Writer`] writes the module with the
//! generic writer as sm_80 runs it (`mma.sync`, `ldmatrix`, `cp.async`) or, for a kernel with a
//! schedule IR, its target family's writer (sm_90a TMA/wgmma, sm_100a `tcgen05.mma` with tensor
//! memory). The launch ABI: [`abi`]. Output is deterministic: registers numbered in writing order,
//! every IR op preceded by a comment with its source location and printed form.

// The generic writer (`emit`) writes the kernel's own ops (warp shuffles included). A
// family writer (`sm90a`, `sm100a`) walks the schedule's roles and has the generic writer
// write the kernel's ops where the programs run them; what both families share (barriers,
// the tile walk, TMA loads and stores) is in `sched`.
//
// Architecture invariant: kiln-ptx knows nothing of syn or the CUDA driver; it reads the IR
// and writes text. Its modules import one another in one direction: `writer` (the top) ->
// the families `sm90a`, `sm100a` -> `sched` -> `emit` -> `types`, `abi`, `error`, `output`;
// no module imports one that imports it.

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
