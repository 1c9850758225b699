//! The `memory_plan` pass: places one shared-memory buffer per tile staged in shared memory
//! (layout `#smem`: a load or a bounded masked load, `staged_load`), with `stages` copies for a load directly inside a pipelined loop.
//!
//! Buffers are laid out one after another at 128-byte alignment (no reuse yet: every staged
//! tile of the example kernels is live across the main loop). Rows of a multiple of 32 bytes
//! (192 for a head dim of 96 included) are XOR-swizzled ([`SmemBuffer::swizzle`]) so
//! ldmatrix and cp.async are bank-conflict free. A total over the target's
//! limit is a diagnostic at the first load, naming every buffer. Rewrites no op.

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, Loc, OpKind};
use crate::schedule::SmemBuffer;
use crate::target::Target;
use crate::types::Shape;

use super::walk::ops_in_order;

/// Shared memory a block may use on every supported target (227 KiB).
pub const SMEM_LIMIT: u32 = 227 * 1024;

/// Fails at `loc` when the `bytes` of shared memory that `what` need exceed [`SMEM_LIMIT`],
/// with `advice` as a note.
pub fn check_smem(loc: Loc, bytes: u32, what: &str, advice: &str) -> Result<(), Diagnostic> {
    if bytes <= SMEM_LIMIT {
        return Ok(());
    }
    let message =
        format!("{what} need {bytes} bytes of shared memory; at most {SMEM_LIMIT} are available");
    Err(Diagnostic::new(loc, message).note(advice))
}

/// Places the buffers and records the total.
pub fn run(kernel: &mut Kernel, _target: Target) -> Result<(), Diagnostic> {
    let mut buffers = Vec::new();
    let mut offset = 0u32;
    let order = ops_in_order(kernel);
    for &id in &order {
        let op = &kernel.ops[id];
        if super::staged_load::of(kernel, id).is_none() {
            continue;
        }
        let r = op.results[0];
        if !kernel
            .schedule
            .layouts
            .get(&r)
            .is_some_and(|l| l.is_shared())
        {
            continue;
        }
        let ty = kernel.ty(r);
        let shape = ty.shape().cloned().unwrap_or(Shape(Vec::new()));
        let row_bytes = (shape.cols() * ty.dtype().size_bytes()) as u32;
        let stage_bytes = row_bytes * shape.rows() as u32;
        let stages = order
            .iter()
            .find(|&&f| {
                kernel.ops[f]
                    .regions
                    .first()
                    .is_some_and(|b| b.ops.contains(&id))
            })
            .and_then(|&f| match kernel.ops[f].kind {
                OpKind::For { stages: Some(n) } if n >= 2 => Some(n),
                _ => None,
            })
            .unwrap_or(1);
        buffers.push(SmemBuffer {
            load: id,
            offset,
            stage_bytes,
            stages,
            row_bytes,
            swizzled: row_bytes.is_multiple_of(32),
            boxed: false,
        });
        offset += (stage_bytes * stages).next_multiple_of(128);
    }
    if offset > SMEM_LIMIT {
        let first = buffers
            .first()
            .map(|b| kernel.ops[b.load].loc)
            .unwrap_or_default();
        let mut d = Diagnostic::new(
            first,
            format!(
                "the kernel needs {offset} bytes of shared memory; at most {SMEM_LIMIT} are available"
            ),
        );
        for b in &buffers {
            d = d.note(format!(
                "{} stage(s) of {} bytes for the tile loaded at {}",
                b.stages, b.stage_bytes, kernel.ops[b.load].loc
            ));
        }
        return Err(d.note("use smaller tiles or fewer pipeline stages"));
    }
    kernel.schedule.buffers = buffers;
    kernel.schedule.smem_bytes = offset;
    Ok(())
}
