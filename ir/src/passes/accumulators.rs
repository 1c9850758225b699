//! Part of the `lower` pass: the `mma` accumulators held in registers, against a thread's
//! registers. Its warp grid (the `layout` pass) splits one over the block's warps; a share
//! a little beyond the 255 registers a thread holds compiles with spills (a note says so),
//! one beyond twice that would have ptxas spill for minutes, so it is an error at the mma's
//! line instead.

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpKind};
use crate::schedule::{Layout, Note};

use super::walk::ops_in_order;

/// Registers one thread holds.
pub const THREAD_REGISTERS: usize = 255;

/// Notes each mma whose register accumulator needs more than [`THREAD_REGISTERS`] 32-bit
/// registers a thread (it spills), and fails at the first that needs more than twice that,
/// naming the tile, `num_warps` and the limit.
pub fn check(kernel: &mut Kernel) -> Result<(), Diagnostic> {
    let mut notes = Vec::new();
    for id in ops_in_order(kernel) {
        let op = &kernel.ops[id];
        if op.kind != OpKind::Mma {
            continue;
        }
        let r = op.results[0];
        let Some(Layout::Mma { warps }) = kernel.schedule.layouts.get(&r) else {
            continue;
        };
        let Some(shape) = kernel.ty(r).shape() else {
            continue;
        };
        let threads = 32 * (warps[0] * warps[1]).max(1) as usize;
        let words = kernel.ty(r).dtype().size_bytes().div_ceil(4).max(1);
        let per = shape.numel().div_ceil(threads) * words;
        if per <= THREAD_REGISTERS {
            continue;
        }
        let num_warps = kernel.options.num_warps;
        // The fewest warps (a power of two) that bring it within the limit.
        let enough = (shape.numel() * words)
            .div_ceil(32 * THREAD_REGISTERS)
            .next_power_of_two();
        let what = format!(
            "this mma's accumulator, {}, takes {per} registers a thread over its {} \
             (num_warps = {num_warps}), more than the {THREAD_REGISTERS} registers a thread holds",
            kernel.ty(r).words(),
            match warps[0] * warps[1] {
                1 => "one warp".to_string(),
                n => format!("{n} warps"),
            }
        );
        let fix = format!(
            "use more warps (`num_warps = {enough}` or more) or a smaller accumulator tile, \
             looping over its column blocks"
        );
        if per > 2 * THREAD_REGISTERS {
            return Err(Diagnostic::new(op.loc, what).note(fix));
        }
        notes.push(Note {
            loc: op.loc,
            text: format!("{what}: ptxas spills it; {fix}"),
        });
    }
    kernel.schedule.notes.extend(notes);
    Ok(())
}
