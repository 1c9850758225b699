//! Kernels whose tiles change layout between ops (a loaded vector broadcast along rows, a
//! reduction feeding a loop-carried tile made elsewhere) or whose reductions span warps (a
//! one-row tile, a column sum over many rows), with their f64 references. Shared by the
//! CPU test (`lowering_general`: interpreter, code generation, ptxas) and the GPU test
//! (`gpu_lowering`).

#![allow(dead_code)]

use kiln::prelude::*;
use kiln_ir::HostTensor;

/// Per block of `BN` values, how many fall in each of `BINS` bins (`out[block * BINS + b]`):
/// a one-hot `[BN, BINS]` comparison of the loaded values broadcast along the bins, summed
/// over the values. Values outside `[0, BINS)` and past the end count nowhere.
#[kernel(grid = [BN, 1, 1])]
pub fn block_counts(
    data: Tensor<i32, 1>,
    out: TensorMut<i32, 1>,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 128)] BINS: usize,
) {
    let j0 = block_id().x * BN;
    let n = data.dim(0);
    let v = data.tile([BN], [j0]).load();
    let hit = (iota([BN, BINS], 0) + j0) < n && v.col() == iota([BN, BINS], 1);
    out.tile([BINS], [block_id().x * BINS])
        .store(col_sum(&select(hit, 1, 0)));
}

/// `y[r, c] = x[r, c] * w[r]`: a loaded vector broadcast along the columns.
#[kernel(grid = [BM, 1, 1])]
pub fn scale_rows(
    x: Tensor<f32, 2>,
    w: Tensor<f32, 1>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
) {
    let r0 = block_id().x * BM;
    let s = w.tile([BM], [r0]).load();
    for j in (0..x.dim(1)).step_by(BN) {
        let t = x.tile([BM, BN], [r0, j]).load();
        y.tile([BM, BN], [r0, j]).store(t * s.col());
    }
}

/// `sum[r] = sum_c x[r, c]` and `max[r] = max_c x[r, c]`, accumulated over column tiles
/// into loop-carried `[BM]` tiles.
#[kernel(grid = [BM, 1, 1])]
pub fn row_stats(
    x: Tensor<f32, 2>,
    sum: TensorMut<f32, 1>,
    max_out: TensorMut<f32, 1>,
    #[comptime(default = 1)] BM: usize,
    #[comptime(default = 2048)] BN: usize,
) {
    let r0 = block_id().x * BM;
    let n = x.dim(1);
    let mut s = zeros::<f32>([BM]);
    let mut m = full::<f32>([BM], f32::NEG_INFINITY);
    for j in (0..n).step_by(BN) {
        let inside = (iota([BM, BN], 1) + j) < n;
        let t = x.tile([BM, BN], [r0, j]).load();
        s = s + row_sum(&select(inside, t, 0.0));
        m = max(&m, &row_max(&select(inside, t, f32::NEG_INFINITY)));
    }
    sum.tile([BM], [r0]).store(s);
    max_out.tile([BM], [r0]).store(m);
}

/// `out[c] = sum_r x[r, c]`: a column sum over every row, `BN` columns per block.
#[kernel(grid = [BN, 1, 1])]
pub fn col_sums(
    x: Tensor<f32, 2>,
    out: TensorMut<f32, 1>,
    #[comptime(default = 256)] BM: usize,
    #[comptime(default = 32)] BN: usize,
) {
    let c0 = block_id().x * BN;
    let m = x.dim(0);
    let mut acc = zeros::<f32>([BN]);
    for i in (0..m).step_by(BM) {
        let inside = (iota([BM, BN], 0) + i) < m;
        acc = acc + col_sum(&select(inside, x.tile([BM, BN], [i, c0]).load(), 0.0));
    }
    out.tile([BN], [c0]).store(acc);
}

/// `out[r] = sum_c x[r, c]` for `x` of element type `dtype` (bf16 or f16) and at most `BN`
/// columns, reduced in that type (f32 accumulation, one rounding): with one row a block,
/// across the block's warps.
#[kernel(grid = [BM, 1, 1])]
pub fn row_sums_half(
    x: Tensor<dtype, 2>,
    out: TensorMut<dtype, 1>,
    #[comptime(default = 1)] BM: usize,
    #[comptime(default = 2048)] BN: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let r0 = block_id().x * BM;
    out.tile([BM], [r0])
        .store(row_sum(&x.tile([BM, BN], [r0, 0]).load()));
}

/// Reference of `block_counts`.
pub fn block_counts_ref(data: &HostTensor, bn: usize, bins: usize) -> Vec<f64> {
    let n = data.shape[0];
    let blocks = n.div_ceil(bn);
    let mut out = vec![0.0; blocks * bins];
    for i in 0..n {
        let v = data.data.get_f64(i);
        if v >= 0.0 && v < bins as f64 {
            out[(i / bn) * bins + v as usize] += 1.0;
        }
    }
    out
}

/// Reference of `scale_rows`.
pub fn scale_rows_ref(x: &HostTensor, w: &HostTensor) -> Vec<f64> {
    let n = x.shape[1];
    (0..x.shape.iter().product::<usize>())
        .map(|i| x.data.get_f64(i) * w.data.get_f64(i / n))
        .collect()
}

/// Reference of `row_stats`: (sums, maxima).
pub fn row_stats_ref(x: &HostTensor) -> (Vec<f64>, Vec<f64>) {
    let (m, n) = (x.shape[0], x.shape[1]);
    let row = |r: usize| (0..n).map(move |c| x.data.get_f64(r * n + c));
    (
        (0..m).map(|r| row(r).sum()).collect(),
        (0..m)
            .map(|r| row(r).fold(f64::NEG_INFINITY, f64::max))
            .collect(),
    )
}

/// Reference of `col_sums`.
pub fn col_sums_ref(x: &HostTensor) -> Vec<f64> {
    let (m, n) = (x.shape[0], x.shape[1]);
    (0..n)
        .map(|c| (0..m).map(|r| x.data.get_f64(r * n + c)).sum())
        .collect()
}
