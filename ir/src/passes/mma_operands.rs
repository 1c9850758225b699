//! Part of the `lower` pass: which `mma` operands the sm_80 lowering (mma.sync) reads through
//! shared memory, and where.
//!
//! An operand staged by its load is read with `ldmatrix`, an A in the accumulator layout is
//! repacked in registers, and every other register operand is written through a swizzled
//! buffer of its own: the route is listed at [`plan`]. Buffers go after every other one at
//! 128-byte alignment; mmas of a schedule IR's ring (sm_90a wgmma, sm_100a tcgen05) are not
//! lowered here and stage nothing.

use std::collections::BTreeSet;

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, ValueId};
use crate::schedule::{Layout, SmemBuffer, StagedOperand};
use crate::types::Shape;

use super::memory_plan::check_smem;
use super::walk::{defining_op, ops_in_order, uses};

/// Plans the staged operands of every mma outside `ring` (the ops of the schedule IR's loop
/// body) into `kernel.schedule.staged`, growing `smem_bytes`.
///
/// mma.sync reads A and B fragments in fixed thread patterns. A tile staged in shared memory
/// by its load (layout `#smem`, or `#smem.t` for its transpose) is read with `ldmatrix`; an A
/// in the accumulator layout of the mma's own `wm x 1` warp grid (attention's `P` in `P V`)
/// is repacked in registers. Every other register operand (a B computed in the kernel, a
/// masked A, an A whose layout is blocked, the transpose `p.t()` of a register tile) is
/// written by every thread into a buffer of its own, row-major and swizzled as a staged load,
/// and read back with `ldmatrix` like one: the writer's route for any layout, with one
/// `bar.sync` before the writes (earlier readers are done) and one after (the writes are
/// visible). A transpose is staged only when every user of it is an mma operand; its source
/// is stored as it is and the mma reads it transposed.
pub fn plan(kernel: &mut Kernel, ring: &BTreeSet<OpId>) -> Result<(), Diagnostic> {
    let uses = uses(kernel);
    // A ring's consumers stage their own operands (the `pipeline` pass planned and placed
    // them); they stay.
    let mut staged: Vec<StagedOperand> = kernel
        .schedule
        .staged
        .iter()
        .filter(|s| ring.contains(&s.buffer.load))
        .cloned()
        .collect();
    let mut offset = kernel.schedule.smem_bytes.next_multiple_of(128);
    let mut first_loc = None;
    for id in ops_in_order(kernel) {
        let op = &kernel.ops[id];
        if op.kind != OpKind::Mma || ring.contains(&id) {
            continue;
        }
        let grid = match kernel.schedule.layouts.get(&op.results[0]) {
            Some(Layout::Mma { warps }) => *warps,
            _ => continue,
        };
        for slot in 0..2 {
            let operand = op.operands[slot];
            if staged.iter().any(|s| s.operand == operand) {
                continue;
            }
            let Some((source, transposed)) = source_of(kernel, operand, slot, grid, &uses) else {
                continue;
            };
            let ty = kernel.ty(source);
            let shape = ty.shape().cloned().unwrap_or(Shape(Vec::new()));
            if shape.rank() != 2 {
                continue;
            }
            let row_bytes = (shape.cols() * ty.dtype().size_bytes()) as u32;
            let bytes = row_bytes * shape.rows() as u32;
            first_loc.get_or_insert(op.loc);
            staged.push(StagedOperand {
                operand,
                source,
                transposed,
                slot,
                buffer: SmemBuffer {
                    load: id,
                    offset,
                    stage_bytes: bytes,
                    stages: 1,
                    row_bytes,
                    swizzled: row_bytes.is_multiple_of(32),
                    boxed: false,
                },
                at_source: false,
            });
            offset = (offset + bytes).next_multiple_of(128);
        }
    }
    if let Some(loc) = first_loc {
        check_smem(
            loc,
            offset,
            "the shared tiles and the register mma operands staged through shared memory",
            "use smaller tiles or fewer pipeline stages",
        )?;
        kernel.schedule.smem_bytes = offset;
    }
    kernel.schedule.staged = staged;
    Ok(())
}

/// The register tile to stage for operand `slot` (0: A, 1: B) `v` of an mma whose
/// accumulator has warp grid `grid`, and whether `v` is its transpose; `None` when the
/// operand is read without staging (a shared tile, a register A in the accumulator layout)
/// or cannot be staged (a transpose with other users: the writer reports it).
fn source_of(
    kernel: &Kernel,
    v: ValueId,
    slot: usize,
    grid: [u32; 2],
    uses: &std::collections::BTreeMap<ValueId, Vec<OpId>>,
) -> Option<(ValueId, bool)> {
    let layout = kernel.schedule.layouts.get(&v)?;
    if layout.is_shared() {
        return None;
    }
    if slot == 0 && grid[1] == 1 && *layout == (Layout::Mma { warps: grid }) {
        return None;
    }
    // Walk back through transposes of register tiles, each read only by mma operands.
    let (mut source, mut transposed) = (v, false);
    loop {
        let (def, is_result) = defining_op(kernel, source);
        if !is_result || kernel.ops[def].kind != OpKind::Transpose {
            break;
        }
        let only_mma = uses.get(&source).is_some_and(|us| {
            us.iter().all(|&u| {
                kernel.ops[u].kind == OpKind::Mma && kernel.ops[u].operands[..2].contains(&source)
            })
        });
        let inner = kernel.ops[def].operands[0];
        if !only_mma
            || kernel
                .schedule
                .layouts
                .get(&inner)
                .is_none_or(Layout::is_shared)
        {
            return None;
        }
        source = inner;
        transposed = !transposed;
    }
    Some((source, transposed))
}
