//! How many epilogue warpgroups copy a Blackwell accumulator out of tensor memory.
//!
//! Each epilogue thread holds its row's share of the accumulator in registers together with
//! the kernel's code after the ring loop (a fused epilogue's bias row, its activation's
//! temporaries). One warpgroup holds whole rows; two split the columns in halves (warp `w`:
//! TMEM lanes `32 (w % 4) ..`, columns `(w / 4) n / 2 ..`), which halves every thread's
//! share but adds 128 threads to the block, so each thread may use fewer registers. The
//! layout pass takes the fewest warpgroups whose estimated need fits a thread's registers,
//! else the most there may be ([`epilogue_warps`]).
//!
//! The need is estimated on the IR, in op order: the most accumulator-wide tile values live
//! at once after the loop (a constant's splat costs nothing), times the columns of each a
//! thread holds. ptxas interleaves elementwise chains, so this overestimates; it is
//! calibrated by ptxas 13.5 (`-arch=sm_100a`) on `gemm_epilogue.rs` at BN = 128: the gemm's
//! copy-convert-store (one value) assembles without spills on one warpgroup, gelu and silu
//! (four values: `x`, `e^u`, `min(e^u, 1)`, `1 / e^u`) spill there and not on two. Beside
//! a bias row (two values) two warpgroups are taken too, which also assemble clean.
//!
//! At BN = 256 two warpgroups are the most: each thread holds 128 columns in the 168
//! registers a 320-thread block leaves it, enough for the gemm and a bias, not for the
//! activations' temporaries (ptxas spills relu and alpha/beta a little, gelu and silu much).

use crate::kernel::{Kernel, OpId, OpKind, ValueDef, ValueId};
use crate::passes::walk::ops_in_block_regions;
use crate::tma_store::BOX_COLUMNS;

/// Registers of each of an SM's four sub-partitions, which take a block's warps in turn.
const PARTITION_REGISTERS: u32 = 16384;
/// The most registers ptxas gives a thread.
const MAX_THREAD_REGISTERS: u32 = 255;
/// Warps of the block besides the epilogue's: the TMA producer and the MMA warp.
const OTHER_WARPS: u32 = 2;

/// The epilogue warps (4 or 8) for the `n`-column accumulator carried out of ring loop
/// `for_op` (see the module doc).
pub fn epilogue_warps(kernel: &Kernel, for_op: OpId, n: u32) -> u32 {
    let need = live_columns(kernel, for_op);
    // Two blocks of whole TMA-store boxes, so each staged box is one warpgroup's.
    let most = if n.is_multiple_of(2 * BOX_COLUMNS) {
        2
    } else {
        1
    };
    let fits = |groups: u32| need / groups <= registers_per_thread(32 * (4 * groups + OTHER_WARPS));
    4 * (1..most).find(|&g| fits(g)).unwrap_or(most)
}

/// The registers ptxas may give each of `threads` threads (in units of 8): a sub-partition
/// holds a quarter of the warps, rounded up (ptxas 13.5 gives 168 to a 320-thread block).
fn registers_per_thread(threads: u32) -> u32 {
    let warps = threads.div_ceil(32).div_ceil(4);
    (PARTITION_REGISTERS / (32 * warps) / 8 * 8).min(MAX_THREAD_REGISTERS)
}

/// The most columns of tile values live at once after loop `for_op` in the kernel's body
/// (each value counted by its last dimension: a thread holding whole rows holds that many of
/// its elements).
fn live_columns(kernel: &Kernel, for_op: OpId) -> u32 {
    let ops = &kernel.body.ops;
    let Some(at) = ops.iter().position(|&o| o == for_op) else {
        return 0;
    };
    let after = &ops[at..];
    // The last top-level op (or an op inside it) that reads each value.
    let mut last_use: Vec<(ValueId, usize)> = Vec::new();
    for (i, &op) in after.iter().enumerate().skip(1) {
        let mut inner = ops_in_block_regions(kernel, op);
        inner.push(op);
        for o in inner {
            for &v in &kernel.ops[o].operands {
                match last_use.iter_mut().find(|(u, _)| *u == v) {
                    Some(slot) => slot.1 = i,
                    None => last_use.push((v, i)),
                }
            }
        }
    }
    let weight = |v: ValueId| match kernel.values[v].def {
        ValueDef::Op(o, _) if matches!(kernel.ops[o].kind, OpKind::Splat { .. }) => 0,
        ValueDef::Op(..) | ValueDef::BlockArg { .. } => kernel
            .ty(v)
            .shape()
            .and_then(|s| s.dims().last().copied())
            .map_or(0, |c| c as u32),
    };
    (0..after.len())
        .map(|i| {
            after[..=i]
                .iter()
                .flat_map(|&o| kernel.ops[o].results.iter().copied())
                .filter(|v| last_use.iter().any(|&(u, l)| u == *v && l > i))
                .map(weight)
                .sum()
        })
        .max()
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_shares_its_sub_partition_with_a_quarter_of_the_warps() {
        // 6 warps (one epilogue warpgroup): 2 per sub-partition, ptxas's cap of 255.
        assert_eq!(registers_per_thread(192), 255);
        // 10 warps (two): 3 per sub-partition, 16384 / 96 = 170, in units of 8.
        assert_eq!(registers_per_thread(320), 168);
    }
}
