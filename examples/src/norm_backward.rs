//! Backward passes of layer norm and RMS norm over the last dimension: `dx` per row, and the
//! weight (and bias) gradients as per-block partial sums that [`sum_partials`] adds up (two
//! deterministic stages, no atomics).

use kiln::prelude::*;

use crate::softmax::{from_f32, to_f32};

/// Layer norm's backward for `y = (x - mean) * rstd * w + b` over rows of `x: [M, N]`:
/// with `xhat = (x - mean) * rstd` and `g = w * dy`,
/// `dx = (g - mean_c(g * xhat) * xhat - mean_c(g)) * rstd`; block `i` (rows
/// `RB i .. RB (i + 1)`) writes `dw_part[i, :] = sum_r dy * xhat` and
/// `db_part[i, :] = sum_r dy`. `x`, `dy`, `dx` and `w` are of element type `dtype`; `mean`,
/// `rstd` (from the forward) and the partials f32.
///
/// A row that fits one `BN`-wide tile (`N <= BN`) is read once: the block walks its `RB` rows
/// in tiles of `BM` rows (see [`group_rows`]), keeps each tile of `x` and `dy` in registers
/// from the row sums to `dx`, and adds its column sums into `dw` and `db` held in registers
/// across the walk, so the partials are written once per `RB` rows. A longer row takes two
/// runtime loops over tiles of all `RB` rows by [`loop_cols`] columns.
///
/// Grid: `(cdiv(M, RB), 1, 1)`. Comptime: `BM`, `RB` (rows per block, default 16) and `NW`
/// (warps per block, default 8), powers of two; `BN` a multiple of 16; `OCC`, the blocks a
/// multiprocessor is asked to hold ([`blocks_per_sm`]: 1, none): a block walks its rows one
/// tile after another, so a second block overlaps its reductions with the other's loads,
/// where the registers allow
/// (bf16 at 4096 columns takes 72 registers a thread unasked: one block of 512 threads).
/// Every loop is `pipelined` `STAGES` deep (default 1: none): the next tiles' loads are
/// issued before this tile's reductions, at the registers of the tiles carried. `LC`: the
/// columns a tile of a longer row's walk takes (0, the default: [`loop_cols`]).
#[kernel(num_warps = NW, grid = [RB, 1, 1])]
#[allow(clippy::too_many_arguments)]
pub fn layer_norm_backward(
    x: Tensor<dtype, 2>,
    w: Tensor<dtype, 1>,
    mean: Tensor<f32, 1>,
    rstd: Tensor<f32, 1>,
    dy: Tensor<dtype, 2>,
    dx: TensorMut<dtype, 2>,
    dw_part: TensorMut<f32, 2>,
    db_part: TensorMut<f32, 2>,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 1024)] BN: usize,
    #[comptime(default = 16)] RB: usize,
    #[comptime(default = 8)] NW: usize,
    #[comptime(default = 1)] OCC: usize,
    #[comptime(default = 1)] STAGES: usize,
    #[comptime(default = 0)] LC: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    blocks_per_sm(OCC);
    let blk = block_id().x;
    let b0 = blk * RB;
    let n = x.dim(1);
    let nf = n.cast::<f32>();
    if n <= BN as i32 {
        let bm = group_rows(BM, RB);
        let mut dw = zeros::<f32>([BN]);
        let mut db = zeros::<f32>([BN]);
        for g in pipelined((0..RB as i32).step_by(bm), stages = STAGES as u32) {
            let r0 = b0 + g;
            let mu = mean.tile([bm], [r0]).load().col();
            let rs = rstd.tile([bm], [r0]).load().col();
            // Rows past `M` and columns past `N` load as zeros: they add nothing.
            let xhat = (to_f32(x.tile([bm, BN], [r0, 0]).load(), dtype) - mu) * rs;
            let d = to_f32(dy.tile([bm, BN], [r0, 0]).load(), dtype);
            // Read again each group (from L1/L2, not HBM): one more tile held across the
            // walk would cost the registers that keep more bytes in flight.
            let wt = to_f32(w.tile([BN], [0]).load(), dtype).row();
            let gw = d * wt;
            let c1 = (row_sum(&(gw * xhat)) / nf).col();
            let c2 = (row_sum(&gw) / nf).col();
            dx.tile([bm, BN], [r0, 0])
                .store(from_f32((gw - xhat * c1 - c2) * rs, dtype));
            dw = dw + col_sum(&(d * xhat));
            db = db + col_sum(&d);
        }
        dw_part.tile([1, BN], [blk, 0]).store(dw.row());
        db_part.tile([1, BN], [blk, 0]).store(db.row());
    } else {
        let lc = if LC > 0 {
            LC
        } else {
            loop_cols(BM, BN, RB, NW, OCC, dtype)
        };
        let mu = mean.tile([RB], [b0]).load().col();
        let rs = rstd.tile([RB], [b0]).load().col();
        // Each thread sums its own elements across the walk; the rows meet once, after it
        // (a reduction across warps each tile would hold every warp at its barriers).
        let mut c1 = zeros::<f32>([RB, lc]);
        let mut c2 = zeros::<f32>([RB, lc]);
        for j in pipelined((0..n).step_by(lc), stages = STAGES as u32) {
            let xhat = (to_f32(x.tile([RB, lc], [b0, j]).load(), dtype) - mu) * rs;
            let wt = to_f32(w.tile([lc], [j]).load(), dtype).row();
            let g = to_f32(dy.tile([RB, lc], [b0, j]).load(), dtype) * wt;
            c1 = c1 + g * xhat;
            c2 = c2 + g;
        }
        let c1 = (row_sum(&c1) / nf).col();
        let c2 = (row_sum(&c2) / nf).col();
        // Backwards: the tiles the first loop read last are the likeliest to be in L2.
        let last = (n - 1) / lc as i32 * lc as i32;
        for back in pipelined((0..n).step_by(lc), stages = STAGES as u32) {
            let j = last - back;
            let xhat = (to_f32(x.tile([RB, lc], [b0, j]).load(), dtype) - mu) * rs;
            let wt = to_f32(w.tile([lc], [j]).load(), dtype).row();
            let d = to_f32(dy.tile([RB, lc], [b0, j]).load(), dtype);
            let g = d * wt;
            dx.tile([RB, lc], [b0, j])
                .store(from_f32((g - xhat * c1 - c2) * rs, dtype));
            dw_part
                .tile([1, lc], [blk, j])
                .store(col_sum(&(d * xhat)).row());
            db_part.tile([1, lc], [blk, j]).store(col_sum(&d).row());
        }
    }
}

/// RMS norm's backward for `y = x * rstd * w`: with `xhat = x * rstd` and `g = w * dy`,
/// `dx = (g - mean_c(g * xhat) * xhat) * rstd`; block `i` (rows `RB i .. RB (i + 1)`) writes
/// `dw_part[i, :] = sum_r dy * xhat`. Walks its rows as [`layer_norm_backward`] does.
/// Grid: `(cdiv(M, RB), 1, 1)`. `LC` as [`layer_norm_backward`]'s.
#[kernel(num_warps = NW, grid = [RB, 1, 1])]
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward(
    x: Tensor<dtype, 2>,
    w: Tensor<dtype, 1>,
    rstd: Tensor<f32, 1>,
    dy: Tensor<dtype, 2>,
    dx: TensorMut<dtype, 2>,
    dw_part: TensorMut<f32, 2>,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 1024)] BN: usize,
    #[comptime(default = 16)] RB: usize,
    #[comptime(default = 8)] NW: usize,
    #[comptime(default = 1)] OCC: usize,
    #[comptime(default = 1)] STAGES: usize,
    #[comptime(default = 0)] LC: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    blocks_per_sm(OCC);
    let blk = block_id().x;
    let b0 = blk * RB;
    let n = x.dim(1);
    let nf = n.cast::<f32>();
    if n <= BN as i32 {
        let bm = group_rows(BM, RB);
        let mut dw = zeros::<f32>([BN]);
        for g in pipelined((0..RB as i32).step_by(bm), stages = STAGES as u32) {
            let r0 = b0 + g;
            let rs = rstd.tile([bm], [r0]).load().col();
            let xhat = to_f32(x.tile([bm, BN], [r0, 0]).load(), dtype) * rs;
            let d = to_f32(dy.tile([bm, BN], [r0, 0]).load(), dtype);
            // Read again each group (from L1/L2, not HBM): one more tile held across the
            // walk would cost the registers that keep more bytes in flight.
            let wt = to_f32(w.tile([BN], [0]).load(), dtype).row();
            let gw = d * wt;
            let c1 = (row_sum(&(gw * xhat)) / nf).col();
            dx.tile([bm, BN], [r0, 0])
                .store(from_f32((gw - xhat * c1) * rs, dtype));
            dw = dw + col_sum(&(d * xhat));
        }
        dw_part.tile([1, BN], [blk, 0]).store(dw.row());
    } else {
        let lc = if LC > 0 {
            LC
        } else {
            loop_cols(BM, BN, RB, NW, OCC, dtype)
        };
        let rs = rstd.tile([RB], [b0]).load().col();
        // Summed per element across the walk, the rows meeting once (see the layer norm's).
        let mut c1 = zeros::<f32>([RB, lc]);
        for j in pipelined((0..n).step_by(lc), stages = STAGES as u32) {
            let xhat = to_f32(x.tile([RB, lc], [b0, j]).load(), dtype) * rs;
            let wt = to_f32(w.tile([lc], [j]).load(), dtype).row();
            let g = to_f32(dy.tile([RB, lc], [b0, j]).load(), dtype) * wt;
            c1 = c1 + g * xhat;
        }
        let c1 = (row_sum(&c1) / nf).col();
        let last = (n - 1) / lc as i32 * lc as i32;
        for back in pipelined((0..n).step_by(lc), stages = STAGES as u32) {
            let j = last - back;
            let xhat = to_f32(x.tile([RB, lc], [b0, j]).load(), dtype) * rs;
            let wt = to_f32(w.tile([lc], [j]).load(), dtype).row();
            let d = to_f32(dy.tile([RB, lc], [b0, j]).load(), dtype);
            dx.tile([RB, lc], [b0, j])
                .store(from_f32((d * wt - xhat * c1) * rs, dtype));
            dw_part
                .tile([1, lc], [blk, j])
                .store(col_sum(&(d * xhat)).row());
        }
    }
}

/// Rows per tile of the one-tile walk: `BM`, unless that does not divide the block's `RB`
/// rows, then their largest common power of two (a tile never reaches the next block's rows,
/// whose column sums are that block's).
pub fn group_rows(bm: usize, rb: usize) -> usize {
    1 << bm.max(1).trailing_zeros().min(rb.max(1).trailing_zeros())
}

/// Columns per tile of a row longer than `BN`, walked with all `RB` rows of the block at
/// once: as many elements per tile as a one-tile group's (`group_rows x BN`, at least 32
/// columns), so the block's column sums are written once per column tile; a block asked to
/// share its multiprocessor with `occ - 1` others takes `1 / occ` of that, so that this walk
/// fits the registers the one-tile walk does. 16-bit elements alone on their multiprocessor
/// take up to twice as many, up to 16 a thread of the block's `nw` warps: a tile of fewer
/// bytes spent the walk on its barriers (layer norm's bf16 backward at 2048 x 128256 on the
/// H100: 697 GB/s at 512 columns, 866 at 1024); 32 a thread spill.
pub fn loop_cols(bm: usize, bn: usize, rb: usize, nw: usize, occ: usize, dtype: DType) -> usize {
    let elems = group_rows(bm, rb) * bn / occ.max(1);
    let per_thread = (elems / (32 * nw.max(1))).max(1);
    let wide = if occ <= 1 && dtype.size_bytes() == 2 {
        (16 / per_thread).clamp(1, 2)
    } else {
        1
    };
    (elems * wide / rb.max(1)).max(32)
}

/// `out[c] = sum_i part[i, c]` (f32 partials; `out` of element type `dtype`): the second
/// stage of the weight gradients. A block walks every partial row of its `BN` columns, its
/// loop `pipelined` `STAGES` deep (default 1: none). There are few partial rows and many
/// columns: narrower column tiles give more blocks, and pipelining more bytes in flight, to
/// a walk whose time is otherwise its loads' latency. Grid: `(cdiv(N, BN), 1, 1)`.
#[kernel(grid = [BN, 1, 1])]
pub fn sum_partials(
    part: Tensor<f32, 2>,
    out: TensorMut<dtype, 1>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 128)] BN: usize,
    #[comptime(default = 1)] STAGES: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let c0 = block_id().x * BN;
    let p = part.dim(0);
    let mut acc = zeros::<f32>([BN]);
    for i in pipelined((0..p).step_by(BM), stages = STAGES as u32) {
        // Rows past the last partial load as zeros.
        acc = acc + col_sum(&part.tile([BM, BN], [i, c0]).load());
    }
    out.tile([BN], [c0]).store(acc.cast_to(dtype));
}
