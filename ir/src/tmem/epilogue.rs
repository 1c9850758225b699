//! How the epilogue warps copy a Blackwell accumulator out of tensor memory: how many
//! warpgroups, and how many of its columns a thread holds at once.
//!
//! Each epilogue thread holds its row's share of the accumulator in registers together with
//! the kernel's code after the ring loop (a fused epilogue's bias row, its activation's
//! temporaries). One warpgroup holds whole rows; two split the columns in halves (warp `w`:
//! TMEM lanes `32 (w % 4) ..`, columns `(w / 4) n / 2 ..`), which halves every thread's
//! share but adds 128 threads to the block, so each thread may use fewer registers.

use std::ops::Range;

use crate::kernel::{Kernel, OpId, OpKind, ValueDef, ValueId};
use crate::passes::walk::ops_in_block_regions;
use crate::sched::store::BOX_COLUMNS;
use crate::sched::tmem::{LOAD_COLUMNS, TmemTileId};
use crate::sched::{BarrierId, Op, Region};
use crate::schedule::{Distribution, Layout};

/// Registers of each of an SM's four sub-partitions, which take a block's warps in turn.
const PARTITION_REGISTERS: u32 = 16384;
/// The most registers ptxas gives a thread.
const MAX_THREAD_REGISTERS: u32 = 255;
/// Warps of the block besides the epilogue's: the TMA producer and the MMA warp.
const OTHER_WARPS: u32 = 2;

/// The epilogue warps (4 or 8) for the `n`-column accumulator carried out of ring loop
/// `for_op`: the layout pass takes the fewest warpgroups whose estimated need fits a thread's
/// registers, else the most there may be.
///
/// The need is estimated on the IR, in op order: the most accumulator-wide tile values live
/// at once after the loop (a constant's splat costs nothing), times the columns of each a
/// thread holds. ptxas interleaves elementwise chains, so this overestimates; it is
/// calibrated by ptxas 13.5 (`-arch=sm_100a`) on `gemm_epilogue.rs` at BN = 128: the gemm's
/// copy-convert-store (one value) assembles without spills on one warpgroup, gelu and silu
/// (four values: `x`, `e^u`, `min(e^u, 1)`, `1 / e^u`) spill there and not on two. Beside
/// a bias row (two values) two warpgroups are taken too, which also assemble clean.
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

/// The columns of its block an epilogue thread of `warps` holds at once, for the `n`-column
/// accumulator carried out of ring loop `for_op`: the block in the
/// fewest equal chunks of whole `tcgen05.ld`s whose share of the estimated need fits a
/// thread's registers, else in chunks of one load each; the whole block where the code after
/// the loop is not [`column_local`].
///
/// Two warpgroups are the most, so at BN = 256 a thread's half row (128 columns in the 168
/// registers a 320-thread block leaves it) still does not fit beside an activation's
/// temporaries (ptxas 13.5 spilled relu and alpha/beta a little, gelu and silu about 920 B).
/// Where the code after the loop computes each column from the same column alone
/// ([`column_local`]), the thread then holds its block in chunks: per
/// chunk it copies the chunk's columns out of TMEM, waits for them and runs the code after
/// the loop on them (which loads the chunk's bias, converts it and writes it to the store's
/// staging tile), so the estimate counts a chunk's columns of each live value, not the
/// block's. TMEM is handed back once the last chunk is copied ([`program`]), so a thread
/// whose whole block fits keeps it whole and hands TMEM back before its code runs.
pub fn chunk_columns(kernel: &Kernel, for_op: OpId, n: u32, warps: u32) -> u32 {
    let groups = (warps / 4).max(1);
    let block = n / groups;
    if !column_local(kernel, for_op) {
        return block;
    }
    let need = live_columns(kernel, for_op) / groups;
    let registers = registers_per_thread(32 * (warps + OTHER_WARPS));
    let counts = (1..=block / LOAD_COLUMNS)
        .filter(|&k| block.is_multiple_of(k) && (block / k).is_multiple_of(LOAD_COLUMNS));
    counts
        .clone()
        .find(|&k| need / k <= registers)
        .or(counts.max())
        .map_or(block, |k| block / k)
}

/// The epilogue's program per work tile, for blocks of `block` columns held `chunk` at a
/// time: wait for the accumulator on `full` (and fence after the wait), then per chunk copy
/// its columns (one `tcgen05.ld` per [`LOAD_COLUMNS`]), wait for the copies and read them.
/// TMEM goes back to the MMA warp on `empty` (fenced) once the last chunk has landed, before
/// that chunk is read: the next tile's mmas may overwrite the accumulator only when no copy
/// is left to make.
pub fn program(block: u32, chunk: u32, full: BarrierId, empty: BarrierId) -> Vec<Op> {
    let acc = TmemTileId(0);
    let mut ops = vec![Op::wait(full, 0), Op::Tcgen05FenceAfter];
    let starts: Vec<u32> = (0..block).step_by(chunk.max(1) as usize).collect();
    for (i, &start) in starts.iter().enumerate() {
        let columns = chunk.min(block - start);
        let end = start + columns;
        ops.extend(
            (start..end)
                .step_by(LOAD_COLUMNS as usize)
                .map(|column| Op::TmemLoad {
                    tile: acc,
                    column,
                    columns: LOAD_COLUMNS.min(end - column),
                }),
        );
        ops.push(Op::TmemWaitLoad);
        if i + 1 == starts.len() {
            ops.extend([Op::Tcgen05FenceBefore, Op::arrive(empty)]);
        }
        ops.push(Op::Run(Region::Epilogue(Some((start, columns)))));
    }
    ops
}

/// Whether the kernel's code after ring loop `for_op` computes each column of its tiles from
/// the same column of the accumulator alone, so that it may run on a chunk of the columns at
/// a time: every op is scalar, elementwise, a splat, an iota, a reshape that keeps the
/// columns, a load into registers or a store, without regions; every tile it reads or
/// defines is the loop's result or its own, in a layout that [`holds_columns`]. A reduction,
/// a transpose or a tile from before the loop would need columns of other chunks.
pub fn column_local(kernel: &Kernel, for_op: OpId) -> bool {
    let ops = &kernel.body.ops;
    let Some(at) = ops.iter().position(|&o| o == for_op) else {
        return false;
    };
    let after = &ops[at + 1..];
    let own: Vec<ValueId> = std::iter::once(for_op)
        .chain(after.iter().copied())
        .flat_map(|o| kernel.ops[o].results.iter().copied())
        .collect();
    let fits = |v: ValueId| {
        kernel.ty(v).shape().is_none()
            || (own.contains(&v) && kernel.schedule.layouts.get(&v).is_some_and(holds_columns))
    };
    let last_dim = |v: ValueId| kernel.ty(v).shape().and_then(|s| s.dims().last().copied());
    after.iter().all(|&o| {
        let op = &kernel.ops[o];
        let local = match &op.kind {
            OpKind::Reshape { shape } => last_dim(op.operands[0]) == shape.dims().last().copied(),
            OpKind::Const(_)
            | OpKind::ScalarParam(_)
            | OpKind::BlockId(_)
            | OpKind::GridDim(_)
            | OpKind::TensorDim { .. }
            | OpKind::LoadScalar { .. }
            | OpKind::Unary(_)
            | OpKind::Binary(_)
            | OpKind::Select
            | OpKind::Cast { .. }
            | OpKind::Bitcast { .. }
            | OpKind::Splat { .. }
            | OpKind::Iota { .. }
            | OpKind::Load { .. }
            | OpKind::Store { .. } => true,
            OpKind::Transpose
            | OpKind::Permute { .. }
            | OpKind::Convert
            | OpKind::Take { .. }
            | OpKind::Gather { .. }
            | OpKind::Scatter { .. }
            | OpKind::Atomic { .. }
            | OpKind::ScalarAtomic { .. }
            | OpKind::Reduce { .. }
            | OpKind::Mma
            | OpKind::For { .. }
            | OpKind::If
            | OpKind::Print { .. }
            | OpKind::Yield => false,
        };
        local && op.regions.is_empty() && op.operands.iter().chain(&op.results).all(|&v| fits(v))
    })
}

/// Whether a tile in `layout` spreads its columns over the epilogue's threads as the
/// accumulator does (sm_100a's [`Layout::TmemRows`], sm_90a's wgmma [`Layout::Mma`], or a row
/// of either: a slice across the rows), so that a chunk of a block's columns is the registers
/// whose last offset lies in it ([`chunk`]).
pub fn holds_columns(layout: &Layout) -> bool {
    match layout {
        Layout::TmemRows { .. } | Layout::Mma { .. } => true,
        Layout::Slice { dim, parent, .. } => {
            *dim == 0 && matches!(**parent, Layout::TmemRows { .. } | Layout::Mma { .. })
        }
        Layout::Blocked { .. }
        | Layout::Shared { .. }
        | Layout::WgmmaColumns { .. }
        | Layout::Transposed { .. } => false,
    }
}

/// The registers of `d`, the distribution of a tile whose layout [`holds_columns`], in the
/// block's columns `columns`.
pub fn chunk(mut d: Distribution, columns: &Range<u32>) -> Distribution {
    d.regs
        .retain(|offs| offs.last().is_some_and(|c| columns.contains(c)));
    d
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
pub(crate) fn live_columns(kernel: &Kernel, for_op: OpId) -> u32 {
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

    #[test]
    fn chunks_are_read_as_they_land_and_tmem_goes_back_after_the_last() {
        let (full, empty) = (BarrierId::from_index(0), BarrierId::from_index(1));
        let load = |column| Op::TmemLoad {
            tile: TmemTileId(0),
            column,
            columns: 32,
        };
        let read = |column, columns| Op::Run(Region::Epilogue(Some((column, columns))));
        let head = [Op::wait(full, 0), Op::Tcgen05FenceAfter];
        let hand_back = [Op::Tcgen05FenceBefore, Op::arrive(empty)];
        // Whole: every copy, one wait, TMEM back before the code runs.
        let mut whole = head.to_vec();
        whole.extend([load(0), load(32), Op::TmemWaitLoad]);
        whole.extend(hand_back);
        whole.push(read(0, 64));
        assert_eq!(program(64, 64, full, empty), whole);
        // Two chunks: the first is read before the second is copied.
        let mut chunked = head.to_vec();
        chunked.extend([load(0), load(32), Op::TmemWaitLoad, read(0, 64)]);
        chunked.extend([load(64), load(96), Op::TmemWaitLoad]);
        chunked.extend(hand_back);
        chunked.push(read(64, 64));
        assert_eq!(program(128, 64, full, empty), chunked);
    }
}
