//! Part of the `lower` pass: every `mma` accumulator held in registers fits a thread's
//! registers. Its warp grid (the `layout` pass) splits it over the block's warps; what is
//! left per thread beyond the 255 registers a thread holds would only make ptxas spill it
//! all for minutes, so it is an error at the mma's line instead.

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpKind};
use crate::schedule::Layout;

use super::walk::ops_in_order;

/// Registers one thread holds.
pub const THREAD_REGISTERS: usize = 255;

/// Fails at the first mma whose register accumulator needs more than [`THREAD_REGISTERS`]
/// 32-bit registers a thread, naming the tile, `num_warps` and the limit.
pub fn check(kernel: &Kernel) -> Result<(), Diagnostic> {
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
        return Err(Diagnostic::new(
            op.loc,
            format!(
                "this mma's accumulator, {}, takes {per} registers a thread over its {} \
                 (num_warps = {num_warps}), more than the {THREAD_REGISTERS} registers a thread \
                 holds",
                kernel.ty(r).words(),
                match warps[0] * warps[1] {
                    1 => "one warp".to_string(),
                    n => format!("{n} warps"),
                }
            ),
        )
        .note(format!(
            "use more warps (`num_warps = {enough}` or more) or a smaller accumulator tile, \
             looping over its column blocks"
        )));
    }
    Ok(())
}
