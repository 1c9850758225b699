//! The `memory_plan` pass: places one shared-memory buffer per tile staged in shared memory
//! (layout `#smem`: a load or a bounded masked load, `staged_load`), with `stages` copies for a
//! load directly inside a pipelined loop, then the rings of the register tiles that loops
//! without mma read ahead (`prefetch`).
//!
//! Buffers are laid out one after another at 128-byte alignment (no reuse yet: every staged
//! tile of the example kernels is live across the main loop). Rows of a multiple of 32 bytes
//! (192 for a head dim of 96 included) are XOR-swizzled ([`SmemBuffer::swizzle`]) so
//! ldmatrix and cp.async are bank-conflict free. A total over the target's
//! limit is a diagnostic at the first load, naming every buffer. Rewrites no op.

use std::collections::BTreeMap;

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, Loc, OpId, OpKind};
use crate::schedule::{SmemBuffer, ThreadSlab};
use crate::target::Target;
use crate::types::Shape;

use super::walk::{ops_in_block_regions, ops_in_order};

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
    // The rings of the register tiles loops without mma read ahead (`prefetch`). A loop's
    // rings are dead once it ends, so they start after those of the loops around it alone:
    // loops one after another (or in two branches) share their bytes.
    let threads = 32 * kernel.options.num_warps;
    let base = offset;
    let mut slabs: Vec<ThreadSlab> = Vec::new();
    let mut ends: BTreeMap<OpId, u32> = BTreeMap::new();
    for id in &order {
        let Some(plan) = kernel.schedule.loops.get(id) else {
            continue;
        };
        let mut at = ends
            .iter()
            .filter(|&(&g, _)| ops_in_block_regions(kernel, g).contains(id))
            .map(|(_, &end)| end)
            .max()
            .unwrap_or(base);
        for &load in &plan.prefetched {
            if buffers.iter().any(|b| b.load == load) {
                continue;
            }
            let r = kernel.ops[load].results[0];
            let regs = kernel
                .distribution(r)
                .map_err(|e| Diagnostic::internal(kernel.ops[load].loc, e.to_string()))?
                .regs
                .len() as u32;
            let stage_bytes = regs * kernel.ty(r).dtype().size_bytes() as u32 * threads;
            slabs.push(ThreadSlab {
                load,
                offset: at,
                stage_bytes,
                stages: plan.stages,
            });
            at += (stage_bytes * plan.stages).next_multiple_of(128);
        }
        ends.insert(*id, at);
        offset = offset.max(at);
    }
    if offset > SMEM_LIMIT {
        let first = buffers
            .first()
            .map(|b| b.load)
            .or(slabs.first().map(|b| b.load))
            .map(|l| kernel.ops[l].loc)
            .unwrap_or_default();
        let mut d = Diagnostic::new(
            first,
            format!(
                "the kernel needs {offset} bytes of shared memory; at most {SMEM_LIMIT} are available"
            ),
        );
        let stages = buffers.iter().map(|b| (b.stages, b.stage_bytes, b.load));
        let rings = slabs.iter().map(|b| (b.stages, b.stage_bytes, b.load));
        for (stages, bytes, load) in stages.chain(rings) {
            d = d.note(format!(
                "{stages} stage(s) of {bytes} bytes for the tile loaded at {}",
                kernel.ops[load].loc
            ));
        }
        return Err(d.note("use smaller tiles or fewer pipeline stages"));
    }
    kernel.schedule.buffers = buffers;
    kernel.schedule.slabs = slabs;
    kernel.schedule.smem_bytes = offset;
    Ok(())
}
