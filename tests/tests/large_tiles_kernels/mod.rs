//! Kernels written with one tile far larger than a thread's registers (a whole row of up to
//! 65536 elements, a 64 x 8192 block) and no loop of their own: the `strip_mine` pass
//! streams them in chunks. With their f64 references. Shared by the CPU test
//! (`large_tiles`: interpreter before and after the pass, PTX size, ptxas) and the GPU test
//! (`gpu_large_tiles`).

#![allow(dead_code)]

use kiln::prelude::*;
use kiln_ir::HostTensor;

/// `log2(e)`: exponentials are computed with `exp2`.
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// `y[r, :] = softmax(x[r, :])` for `x, y: [M, N]` f32, `N <= BN`: each block's `[BM, BN]`
/// tile holds its rows whole; columns past `N` are masked to `-inf`.
#[kernel(grid = [BM, 1, 1])]
pub fn whole_row_softmax(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 1)] BM: usize,
    #[comptime(default = 16384)] BN: usize,
) {
    let row0 = block_id().x * BM;
    let n = x.dim(1);
    let t = select(
        iota([BM, BN], 1) < n,
        x.tile([BM, BN], [row0, 0]).load(), // MARK-softmax-load
        f32::NEG_INFINITY,
    );
    let m = row_max(&t);
    let p = exp2(&((t - m.col()) * LOG2E));
    let inv = recip(&row_sum(&p));
    y.tile([BM, BN], [row0, 0]).store(p * inv.col());
}

pub fn softmax_ref(x: &HostTensor) -> Vec<f64> {
    let (m, n) = (x.shape[0], x.shape[1]);
    let v = x.to_f64_vec();
    let mut out = vec![0.0; m * n];
    for r in 0..m {
        let row = &v[r * n..(r + 1) * n];
        let mx = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = row.iter().map(|&a| (a - mx).exp()).sum();
        for c in 0..n {
            out[r * n + c] = (row[c] - mx).exp() / s;
        }
    }
    out
}

/// Layer norm over whole rows: `y = (x - mean) * rstd * w + b` with the biased variance,
/// `mean[r]` and `rstd[r]` kept; `x, y: [M, N]`, `w, b: [N]` f32, `N <= BN`.
#[kernel(grid = [BM, 1, 1])]
pub fn whole_row_layer_norm(
    x: Tensor<f32, 2>,
    w: Tensor<f32, 1>,
    b: Tensor<f32, 1>,
    y: TensorMut<f32, 2>,
    mean: TensorMut<f32, 1>,
    rstd: TensorMut<f32, 1>,
    eps: f32,
    #[comptime(default = 2)] BM: usize,
    #[comptime(default = 32768)] BN: usize,
) {
    let row0 = block_id().x * BM;
    let n = x.dim(1);
    let count = n.cast::<f32>();
    let inside = iota([BM, BN], 1) < n;
    let t = x.tile([BM, BN], [row0, 0]).load();
    // The mean as the row's maximum plus the mean offset from it: exact for a constant row,
    // whose deviations are then exactly 0.
    let shift = row_max(&select(inside, t, f32::NEG_INFINITY));
    let mu = shift + row_sum(&select(inside, t - shift.col(), 0.0)) / count;
    let dev = select(inside, t - mu.col(), 0.0);
    let r = rsqrt(&(row_sum(&(dev * dev)) / count + eps));
    mean.tile([BM], [row0]).store(mu);
    rstd.tile([BM], [row0]).store(r);
    let wt = w.tile([BN], [0]).load().row();
    let bt = b.tile([BN], [0]).load().row();
    y.tile([BM, BN], [row0, 0]).store(dev * r.col() * wt + bt);
}

/// `(y, mean, rstd)` of [`whole_row_layer_norm`].
pub fn layer_norm_ref(
    x: &HostTensor,
    w: &HostTensor,
    b: &HostTensor,
    eps: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (m, n) = (x.shape[0], x.shape[1]);
    let (v, wv, bv) = (x.to_f64_vec(), w.to_f64_vec(), b.to_f64_vec());
    let (mut y, mut mu, mut rs) = (vec![0.0; m * n], vec![0.0; m], vec![0.0; m]);
    for r in 0..m {
        let row = &v[r * n..(r + 1) * n];
        let mean = row.iter().sum::<f64>() / n as f64;
        let var = row.iter().map(|a| (a - mean) * (a - mean)).sum::<f64>() / n as f64;
        let rstd = 1.0 / (var + eps).sqrt();
        mu[r] = mean;
        rs[r] = rstd;
        for c in 0..n {
            y[r * n + c] = (row[c] - mean) * rstd * wv[c] + bv[c];
        }
    }
    (y, mu, rs)
}

/// `out[r] = sum(x[r, :])` in `dtype` (a 16-bit float sum accumulates in f32), `N <= BN`.
#[kernel(grid = [BM, 1, 1])]
pub fn whole_row_sums(
    x: Tensor<dtype, 2>,
    out: TensorMut<dtype, 1>,
    #[comptime(default = 1)] BM: usize,
    #[comptime(default = 65536)] BN: usize,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let row0 = block_id().x * BM;
    out.tile([BM], [row0])
        .store(row_sum(&x.tile([BM, BN], [row0, 0]).load()));
}

pub fn row_sums_ref(x: &HostTensor) -> Vec<f64> {
    let (m, n) = (x.shape[0], x.shape[1]);
    let v = x.to_f64_vec();
    (0..m).map(|r| v[r * n..(r + 1) * n].iter().sum()).collect()
}

/// Dropout over one `[BLOCK]` tile a block: `y = rand(seed, i) > p ? x / (1 - p) : 0`.
#[kernel(grid = [BLOCK, 1, 1])]
pub fn big_dropout(
    x: Tensor<f32, 1>,
    y: TensorMut<f32, 1>,
    p: f32,
    seed: u32,
    #[comptime(default = 65536)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let offsets = iota([BLOCK], 0) + start;
    let v = x.tile([BLOCK], [start]).load();
    let r = rand(seed, offsets);
    let scale = 1.0 / (1.0 - p);
    y.tile([BLOCK], [start])
        .store(select(r > p, v * scale, 0.0));
}

/// `y = randn(seed, i) + sin(x)` over `[BM, BN]` tiles: the long per-element sequences
/// (Philox rounds, Box-Muller, sine's range reduction) on a tile of 512 elements a thread.
#[kernel(grid = [BM, BN, 1])]
pub fn big_randn_sin(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    seed: u32,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 8192)] BN: usize,
) {
    let (r0, c0) = (block_id().x * BM, block_id().y * BN);
    let n = x.dim(1);
    let offsets = (iota([BM, BN], 0) + r0) * n + iota([BM, BN], 1) + c0;
    let t = x.tile([BM, BN], [r0, c0]).load();
    y.tile([BM, BN], [r0, c0])
        .store(randn(seed, offsets) + sin(&t));
}

/// Double centering of a whole `[M, N]` matrix in one `[BM, BN]` tile (`M <= BM`,
/// `N <= BN`): `y = x - colmean(x) - rowmean(x) + mean(x)`. The column sums reduce the
/// dimension the pass does not chunk, the row sums the one it does; both broadcast back.
#[kernel(grid = [BM, 1, 1])]
pub fn double_center(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 8192)] BN: usize,
) {
    let (m, n) = (x.dim(0), x.dim(1));
    let t = x.tile([BM, BN], [0, 0]).load();
    let cm = col_sum(&t) / m.cast::<f32>();
    let rm = row_sum(&t) / n.cast::<f32>();
    // The grand mean: the mean of the row means (rows past `M` hold zeros).
    let all = col_sum(&rm.col()) / m.cast::<f32>();
    y.tile([BM, BN], [0, 0])
        .store(t - cm.row() - rm.col() + all.row());
}

pub fn double_center_ref(x: &HostTensor) -> Vec<f64> {
    let (m, n) = (x.shape[0], x.shape[1]);
    let v = x.to_f64_vec();
    let rm: Vec<f64> = (0..m)
        .map(|r| v[r * n..(r + 1) * n].iter().sum::<f64>() / n as f64)
        .collect();
    let cm: Vec<f64> = (0..n)
        .map(|c| (0..m).map(|r| v[r * n + c]).sum::<f64>() / m as f64)
        .collect();
    let all = rm.iter().sum::<f64>() / m as f64;
    (0..m * n)
        .map(|e| v[e] - cm[e % n] - rm[e / n] + all)
        .collect()
}

/// `y[0, :] = sum_j x[j, :]` with the whole `[1, BN]` row carried around a loop over the
/// rows: the pass runs the user's loop once per chunk of the row (the loop inside the chunk
/// loop), as no thread can hold the row at `BN = 65536`.
#[kernel(grid = [1, 1, 1])]
pub fn carried_row(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 65536)] BN: usize,
) {
    let mut acc = zeros::<f32>([1, BN]);
    for j in 0..x.dim(0) {
        acc = acc + x.tile([1, BN], [j, 0]).load();
    }
    y.tile([1, BN], [0, 0]).store(acc);
}

/// [`carried_row`]'s reference, in f64: the column sums of `x: [m, n]`.
pub fn carried_row_ref(x: &HostTensor) -> Vec<f64> {
    let (m, n) = (x.shape[0], x.shape[1]);
    let v = x.to_f64_vec();
    (0..n)
        .map(|col| (0..m).map(|r| v[r * n + col]).sum())
        .collect()
}

/// `y[r, :] = (r + 1) x[0, :]` for every row of `y`: the whole `[1, BN]` row of `x` loaded
/// once and read inside a loop over the rows that does not carry it; the pass runs that
/// loop once per chunk of the row, as it does a loop carrying chunks.
#[kernel(grid = [1, 1, 1])]
pub fn scaled_rows(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 65536)] BN: usize,
) {
    let t = x.tile([1, BN], [0, 0]).load();
    for r in 0..y.dim(0) {
        y.tile([1, BN], [r, 0]).store(t * (r + 1).cast::<f32>());
    }
}

pub fn scaled_rows_ref(x: &HostTensor, m: usize) -> Vec<f64> {
    let n = x.shape[1];
    let v = x.to_f64_vec();
    (0..m * n).map(|e| v[e % n] * (e / n + 1) as f64).collect()
}

/// `y[0, :] = x[0, :]` from a whole row stored inside a branch of a loop over `y`'s rows:
/// the loop cannot run once per chunk (its branch would too), so the row is not streamed.
#[kernel(grid = [1, 1, 1])]
pub fn row_stored_in_a_branch(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 65536)] BN: usize,
) {
    let t = x.tile([1, BN], [0, 0]).load(); // MARK-branch
    for r in 0..y.dim(0) {
        if r == 0 {
            y.tile([1, BN], [r, 0]).store(t);
        }
    }
}

/// Stores of one whole row into two rows of `y` that are one row when `y` has one, each
/// followed by a one-element store into it: `y[0, :] = x[0, :]`, `y[0, 0] = -1`, then
/// `y[m - 1, :] = 2 x[0, :]`, `y[m - 1, 1] = 7`. Streamed, the two row stores go in two
/// chunk loops (chunks of one loop would interleave them) and the one-element stores between
/// and after them.
#[kernel(grid = [1, 1, 1])]
pub fn overlapping_rows(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 65536)] BN: usize,
) {
    let t = x.tile([1, BN], [0, 0]).load();
    y.tile([1, BN], [0, 0]).store(t);
    y.tile([1, 1], [0, 0]).store(full::<f32>([1, 1], -1.0));
    let last = y.dim(0) - 1;
    y.tile([1, BN], [last, 0]).store(t * 2.0);
    y.tile([1, 1], [last, 1]).store(full::<f32>([1, 1], 7.0));
}

/// [`overlapping_rows`]' result for `y` of `m` (1 or 2) rows, in f64.
pub fn overlapping_rows_ref(x: &HostTensor, m: usize) -> Vec<f64> {
    let n = x.shape[1];
    let v = x.to_f64_vec();
    let mut y = vec![0.0; m * n];
    y[..n].copy_from_slice(&v);
    y[0] = -1.0;
    let last = (m - 1) * n;
    for c in 0..n {
        y[last + c] = 2.0 * v[c];
    }
    if n > 1 {
        y[last + 1] = 7.0;
    }
    y
}

/// Running sums of `[BM, BN]` blocks of rows: `y[i BM + r, c] = sum_{j <= i} x[j BM + r, c]`
/// for `c < BN` (block `b` of the grid takes columns `b BN ..`), each written inside the loop
/// that carries the sum. The carried block, the loads and the stores are chunked together.
#[kernel(grid = [BN, 1, 1])]
pub fn running_blocks(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 1024)] BN: usize,
) {
    let c0 = block_id().x * BN;
    let mut acc = zeros::<f32>([BM, BN]);
    let blocks = (x.dim(0) + BM as i32 - 1) / BM as i32;
    for i in 0..blocks {
        acc = acc + sin(&x.tile([BM, BN], [i * BM as i32, c0]).load());
        y.tile([BM, BN], [i * BM as i32, c0]).store(acc);
    }
}

/// [`running_blocks`]' reference, in f64.
pub fn running_blocks_ref(x: &HostTensor, bm: usize) -> Vec<f64> {
    let (m, n) = (x.shape[0], x.shape[1]);
    let v = x.to_f64_vec();
    let mut out = vec![0.0; m * n];
    for r in 0..m {
        for c in 0..n {
            let prev = if r >= bm { out[(r - bm) * n + c] } else { 0.0 };
            out[r * n + c] = prev + v[r * n + c].sin();
        }
    }
    out
}

/// A `[1, BN]` row carried around a loop that rescales it by its own maximum each step: a
/// reduction along the row inside the loop needs the whole row at once, so the pass keeps
/// it whole, which no thread can hold at `BN = 65536`.
#[kernel(grid = [1, 1, 1])]
pub fn carried_rescaled_row(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 65536)] BN: usize,
) {
    let mut acc = zeros::<f32>([1, BN]); // MARK-carried
    for j in 0..x.dim(0) {
        let s = acc + x.tile([1, BN], [j, 0]).load();
        acc = s * recip(&(row_max(&abs(&s)) + 1.0)).col();
    }
    y.tile([1, BN], [0, 0]).store(acc);
}

/// `x[r, :] = x[r, :] / max(|x[r, :]|)` in place over whole rows (`N <= BN`): the row is
/// read twice (the maximum, then the scaled store) from the tensor the kernel writes.
#[kernel(grid = [1, 1, 1])]
pub fn normalise_in_place(x: TensorMut<f32, 2>, #[comptime(default = 65536)] BN: usize) {
    let r = block_id().x;
    let t = x.tile([1, BN], [r, 0]).load(); // MARK-in-place
    let inv = recip(&row_max(&abs(&t)));
    x.tile([1, BN], [r, 0]).store(t * inv.col());
}

/// `x[r, :] = 2 x[r, :] + 1` in place over whole rows: each chunk reads and writes only its
/// own elements.
#[kernel(grid = [1, 1, 1])]
pub fn affine_in_place(x: TensorMut<f32, 2>, #[comptime(default = 65536)] BN: usize) {
    let r = block_id().x;
    let t = x.tile([1, BN], [r, 0]).load();
    x.tile([1, BN], [r, 0]).store(t * 2.0 + 1.0);
}

/// [`whole_row_softmax`] of every row by one block, in a loop of the user's over the rows:
/// the whole-row tiles live inside that loop's body.
#[kernel(grid = [1, 1, 1])]
pub fn softmax_rows_loop(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 32768)] BN: usize,
) {
    let n = x.dim(1);
    for r in 0..x.dim(0) {
        let t = select(
            iota([1, BN], 1) < n,
            x.tile([1, BN], [r, 0]).load(),
            f32::NEG_INFINITY,
        );
        let p = exp2(&((t - row_max(&t).col()) * LOG2E));
        y.tile([1, BN], [r, 0]).store(p * recip(&row_sum(&p)).col());
    }
}

/// `out[0] = sum(x)`: a loop of the user's over the rows carries the running total, each
/// row summed from one whole-row tile (the chunk loop's result is what the user's loop
/// yields).
#[kernel(grid = [1, 1, 1])]
pub fn total_by_rows(
    x: Tensor<f32, 2>,
    out: TensorMut<f32, 1>,
    #[comptime(default = 65536)] BN: usize,
) {
    let mut total = zeros::<f32>([1]);
    for r in 0..x.dim(0) {
        total = total + row_sum(&x.tile([1, BN], [r, 0]).load());
    }
    out.tile([1], [0]).store(total);
}

/// `y[dst[r], :] = 2 x[src[r], :] + 1` over `[BM, BN]` tiles of whole rows (`N <= BN`):
/// the rows gathered and scattered through index tiles, which the chunks share (a chunk
/// of columns reads every row's index).
#[kernel(grid = [BM, 1, 1])]
pub fn big_row_permute(
    x: Tensor<f32, 2>,
    src: Tensor<i32, 1>,
    dst: Tensor<i32, 1>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 16384)] BN: usize,
) {
    let r0 = block_id().x * BM;
    let from = src.tile([BM], [r0]).load();
    // Rows past the index tensors go nowhere (-1 is outside `y`), not to row 0.
    let to = select(
        iota([BM], 0) + r0 < dst.dim(0),
        dst.tile([BM], [r0]).load(),
        -1,
    );
    let t = x.rows(&from, BN, [0, 0]).load();
    y.rows(&to, BN, [0, 0]).store(t * 2.0 + 1.0);
}

/// [`big_row_permute`]'s reference: `y` as given, with `y[dst[r]] = 2 x[src[r]] + 1` for
/// every row `r` of `src` and `dst` whose indices fall inside the tensors.
pub fn row_permute_ref(x: &HostTensor, src: &[i32], dst: &[i32], y: &HostTensor) -> Vec<f64> {
    let (m, n) = (x.shape[0] as i64, x.shape[1]);
    let my = y.shape[0] as i64;
    let (xv, mut out) = (x.to_f64_vec(), y.to_f64_vec());
    for (&s, &d) in src.iter().zip(dst) {
        if !(0..my).contains(&i64::from(d)) {
            continue;
        }
        for c in 0..n {
            // A row outside `x` loads as 0.
            let v = if (0..m).contains(&i64::from(s)) {
                f64::from(xv[s as usize * n + c] as f32 * 2.0 + 1.0)
            } else {
                1.0
            };
            out[d as usize * n + c] = v;
        }
    }
    out
}

/// A histogram of `BLOCK` values a block: `hist[bin(x)] += 1` by atomics through an index
/// tile, the bin `floor(x * bins)` clamped into `[0, bins)`; the values past `n` are
/// masked off.
#[kernel(grid = [BLOCK, 1, 1])]
pub fn big_histogram(
    x: Tensor<f32, 1>,
    hist: TensorMut<i32, 1>,
    #[comptime(default = 65536)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let bins = hist.dim(0);
    let inside = iota([BLOCK], 0) + start < x.dim(0);
    let v = x.tile([BLOCK], [start]).load();
    let b = (v * bins.cast::<f32>()).cast::<i32>();
    let b = min(max(b, 0), bins - 1);
    hist.elems([b]).atomic_add_masked(1, inside);
}

/// [`big_histogram`]'s reference counts.
pub fn histogram_ref(x: &HostTensor, bins: usize) -> Vec<f64> {
    let mut h = vec![0.0; bins];
    for v in x.to_f64_vec() {
        let b = ((v as f32) * bins as f32) as i64;
        h[b.clamp(0, bins as i64 - 1) as usize] += 1.0;
    }
    h
}

/// `y[0, c] = log(2 + |sum_j cos(x[j, c])|)` over `[1, BN]` column blocks: the sums are
/// carried around the user's loop, so the tile stays whole (64 elements a thread), and its
/// cosines, written inline, would take thousands of lines: each element calls the function.
#[kernel(grid = [BN, 1, 1], num_warps = 8)]
pub fn carried_cos_log(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 16384)] BN: usize,
) {
    let c0 = block_id().x * BN;
    let mut acc = zeros::<f32>([1, BN]);
    for j in 0..x.dim(0) {
        acc = acc + cos(&x.tile([1, BN], [j, c0]).load());
    }
    y.tile([1, BN], [0, c0]).store(log(&(abs(&acc) + 2.0)));
}

/// [`carried_cos_log`]'s reference, in f64.
pub fn cos_log_ref(x: &HostTensor) -> Vec<f64> {
    let (m, n) = (x.shape[0], x.shape[1]);
    let v = x.to_f64_vec();
    (0..n)
        .map(|c| {
            let s: f64 = (0..m).map(|j| v[j * n + c].cos()).sum();
            (2.0 + s.abs()).ln()
        })
        .collect()
}

/// [`big_histogram`] over `[BM, BN]` tiles of a matrix, chunked along its rows: the index
/// tile has more dimensions than the histogram, so no tensor coordinate follows the rows.
#[kernel(grid = [BM, BN, 1])]
pub fn big_histogram_2d(
    x: Tensor<f32, 2>,
    hist: TensorMut<i32, 1>,
    #[comptime(default = 4096)] BM: usize,
    #[comptime(default = 16)] BN: usize,
) {
    let (r0, c0) = (block_id().x * BM, block_id().y * BN);
    let bins = hist.dim(0);
    let inside = iota([BM, BN], 0) + r0 < x.dim(0) && iota([BM, BN], 1) + c0 < x.dim(1);
    let v = x.tile([BM, BN], [r0, c0]).load();
    let b = (v * bins.cast::<f32>()).cast::<i32>();
    let b = min(max(b, 0), bins - 1);
    // A tile of ones (not the scalar 1): the added values are chunked with the indices.
    hist.elems([b]).atomic_add_masked(b * 0 + 1, inside);
}
