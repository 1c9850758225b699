//! Kernels on tiles of rank 3 and 4 (loads and stores per dimension, reductions over every
//! dimension, broadcasting, `reshape`, `permute`, casts), with their f64 references. Shared
//! by the CPU test (`tiles_3d`: interpreter, code generation, ptxas) and the GPU test
//! (`gpu_tiles_3d`).

#![allow(dead_code)]

use kiln::prelude::*;
use kiln_ir::HostTensor;

/// Multi-head RMS norm (the QK-norm of modern LLMs): for `x, y: [T, H, D]` and `w: [D]`,
/// `y[t, h, :] = x[t, h, :] * w / sqrt(mean(x[t, h, :]^2) + eps)`, each head of each token
/// normalised on its own. A block owns `BT` tokens with all their heads (`BH >= H`,
/// `BD >= D`): one `[BT, BH, BD]` tile, a sum over its last dimension, the statistic
/// broadcast back with `.unsqueeze(2)` and the `[BD]` weight by numpy's rule.
#[kernel(grid = [BT, 1, 1])]
pub fn qk_norm(
    x: Tensor<dtype, 3>,
    w: Tensor<dtype, 1>,
    y: TensorMut<dtype, 3>,
    eps: f32,
    #[comptime(default = 4)] BT: usize,
    #[comptime(default = 8)] BH: usize,
    #[comptime(default = 128)] BD: usize,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let t0 = block_id().x * BT;
    let d = x.dim(2).cast::<f32>();
    let xt = x.tile([BT, BH, BD], [t0, 0, 0]).load().cast::<f32>();
    let ms = reduce_sum(&(xt * xt), 2) / d;
    let inv = rsqrt(&(ms + eps)).unsqueeze(2);
    // `[BD]` against `[BT, BH, BD]`: numpy's rule reads it as `[1, 1, BD]`.
    let wt = w.tile([BD], [0]).load().cast::<f32>();
    y.tile([BT, BH, BD], [t0, 0, 0])
        .store((xt * inv * wt).cast_to(dtype));
}

/// The f64 reference of [`qk_norm`].
pub fn qk_norm_ref(x: &HostTensor, w: &HostTensor, eps: f64) -> Vec<f64> {
    let (t, h, d) = (x.shape[0], x.shape[1], x.shape[2]);
    let (xs, ws) = (x.to_f64_vec(), w.to_f64_vec());
    let mut out = vec![0.0; t * h * d];
    for row in 0..t * h {
        let v = &xs[row * d..(row + 1) * d];
        let ms = v.iter().map(|a| a * a).sum::<f64>() / d as f64;
        let r = 1.0 / (ms + eps).sqrt();
        for k in 0..d {
            out[row * d + k] = v[k] * r * ws[k];
        }
    }
    out
}

/// `y[b, h * D + d] = 2 x[b, h, d] + h` for `x: [B, H, D]`, `y: [B, H * D]`: the heads of
/// a `[BB, H, D]` tile merged into rows by `reshape` and stored as a 2-D tile.
#[kernel(grid = [BB, 1, 1])]
pub fn merge_heads(
    x: Tensor<f32, 3>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 8)] BB: usize,
    #[comptime(default = 4)] H: usize,
    #[comptime(default = 64)] D: usize,
) {
    let b0 = block_id().x * BB;
    let t = x.tile([BB, H, D], [b0, 0, 0]).load();
    let head = iota([BB, H, D], 1).cast::<f32>();
    y.tile([BB, H * D], [b0, 0])
        .store((t * 2.0 + head).reshape([BB, H * D]));
}

/// The f64 reference of [`merge_heads`] (`x` and the result are both row-major over
/// `b, h, d`).
pub fn merge_heads_ref(x: &HostTensor) -> Vec<f64> {
    let (h, d) = (x.shape[1], x.shape[2]);
    x.to_f64_vec()
        .iter()
        .enumerate()
        .map(|(i, v)| 2.0 * v + ((i / d) % h) as f64)
        .collect()
}

/// `y[b, h, d] = x[b, h * D + d] - d` for `x: [B, H * D]`, `y: [B, H, D]`: a 2-D tile split
/// into heads by `reshape`.
#[kernel(grid = [BB, 1, 1])]
pub fn split_heads(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 3>,
    #[comptime(default = 8)] BB: usize,
    #[comptime(default = 4)] H: usize,
    #[comptime(default = 64)] D: usize,
) {
    let b0 = block_id().x * BB;
    let t = x.tile([BB, H * D], [b0, 0]).load().reshape([BB, H, D]);
    y.tile([BB, H, D], [b0, 0, 0])
        .store(t - iota([BB, H, D], 2).cast::<f32>());
}

/// The f64 reference of [`split_heads`].
pub fn split_heads_ref(x: &HostTensor, d: usize) -> Vec<f64> {
    x.to_f64_vec()
        .iter()
        .enumerate()
        .map(|(i, v)| v - (i % d) as f64)
        .collect()
}

/// For `x: [B, H, D]`: `hb[h, b, d] = x[b, h, d]` (`permute([1, 0, 2])`) and
/// `bdh[b, d, h] = x[b, h, d]` (`permute([0, 2, 1])`), in bf16 or f32; a block owns `BB`
/// rows of `B` with every head and column (`BH >= H`, `BD >= D`).
#[kernel(grid = [BB, 1, 1])]
pub fn permute_heads(
    x: Tensor<dtype, 3>,
    hb: TensorMut<dtype, 3>,
    bdh: TensorMut<dtype, 3>,
    #[comptime(default = 4)] BB: usize,
    #[comptime(default = 8)] BH: usize,
    #[comptime(default = 8)] BD: usize,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let b0 = block_id().x * BB;
    let t = x.tile([BB, BH, BD], [b0, 0, 0]).load();
    hb.tile([BH, BB, BD], [0, b0, 0])
        .store(t.permute([1, 0, 2]));
    bdh.tile([BB, BD, BH], [b0, 0, 0])
        .store(t.permute([0, 2, 1]));
}

/// The f64 references of [`permute_heads`]: `(hb, bdh)`.
pub fn permute_heads_ref(x: &HostTensor) -> (Vec<f64>, Vec<f64>) {
    let (b, h, d) = (x.shape[0], x.shape[1], x.shape[2]);
    let xs = x.to_f64_vec();
    let mut hb = vec![0.0; b * h * d];
    let mut bdh = vec![0.0; b * h * d];
    for i in 0..b {
        for j in 0..h {
            for k in 0..d {
                let v = xs[(i * h + j) * d + k];
                hb[(j * b + i) * d + k] = v;
                bdh[(i * d + k) * h + j] = v;
            }
        }
    }
    (hb, bdh)
}

/// Reductions over each dimension of `x: [T, H, D]`, a block owning `BT` tokens with every
/// head and column: `tok_sum[blk, h, d]` sums block `blk`'s tokens; `head_max[t, d]` is the
/// maximum over heads; `col_min[t, h]` the minimum over the columns, read with a masked load
/// (`+inf` outside) while the maximum masks the plain load with `select`.
#[kernel(grid = [BT, 1, 1])]
pub fn reduce_dims(
    x: Tensor<f32, 3>,
    tok_sum: TensorMut<f32, 3>,
    head_max: TensorMut<f32, 2>,
    col_min: TensorMut<f32, 2>,
    #[comptime(default = 4)] BT: usize,
    #[comptime(default = 8)] BH: usize,
    #[comptime(default = 8)] BD: usize,
) {
    let blk = block_id().x;
    let t0 = blk * BT;
    let inside = iota([BT, BH, BD], 0) + t0 < x.dim(0)
        && iota([BT, BH, BD], 1) < x.dim(1)
        && iota([BT, BH, BD], 2) < x.dim(2);
    let t = x.tile([BT, BH, BD], [t0, 0, 0]).load();
    tok_sum
        .tile([1, BH, BD], [blk, 0, 0])
        .store(reduce_sum(&t, 0).unsqueeze(0));
    head_max
        .tile([BT, BD], [t0, 0])
        .store(reduce_max(&select(inside, t, f32::NEG_INFINITY), 1));
    let m = x
        .tile([BT, BH, BD], [t0, 0, 0])
        .load_masked(inside, f32::INFINITY);
    col_min.tile([BT, BH], [t0, 0]).store(reduce_min(&m, 2));
}

/// The f64 references of [`reduce_dims`] with `bt` tokens a block: `(tok_sum, head_max,
/// col_min)`.
pub fn reduce_dims_ref(x: &HostTensor, bt: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (t, h, d) = (x.shape[0], x.shape[1], x.shape[2]);
    let xs = x.to_f64_vec();
    let at = |i: usize, j: usize, k: usize| xs[(i * h + j) * d + k];
    let blocks = t.div_ceil(bt);
    let mut sum = vec![0.0; blocks * h * d];
    for i in 0..t {
        for j in 0..h {
            for k in 0..d {
                sum[((i / bt) * h + j) * d + k] += at(i, j, k);
            }
        }
    }
    let mut mx = vec![f64::NEG_INFINITY; t * d];
    let mut mn = vec![f64::INFINITY; t * h];
    for i in 0..t {
        for j in 0..h {
            for k in 0..d {
                mx[i * d + k] = mx[i * d + k].max(at(i, j, k));
                mn[i * h + j] = mn[i * h + j].min(at(i, j, k));
            }
        }
    }
    (sum, mx, mn)
}

/// A rank-4 tile: `y[b, h, s, :] = x[b, h, s, :] - mean_s x[b, h, s, :]` for
/// `x, y: [B, H, S, D]`, a block owning one `b` with all `BH x BS x BD` of it, the mean over
/// dimension 2 (every `s` of a head) broadcast back.
#[kernel(grid = [1, 1, 1])]
pub fn center_seq(
    x: Tensor<f32, 4>,
    y: TensorMut<f32, 4>,
    #[comptime(default = 4)] BH: usize,
    #[comptime(default = 8)] BS: usize,
    #[comptime(default = 16)] BD: usize,
) {
    let b = block_id().x;
    let t = x.tile([1, BH, BS, BD], [b, 0, 0, 0]).load();
    let mean = reduce_sum(&t, 2) / x.dim(2).cast::<f32>();
    y.tile([1, BH, BS, BD], [b, 0, 0, 0])
        .store(t - mean.unsqueeze(2));
}

/// The f64 reference of [`center_seq`].
pub fn center_seq_ref(x: &HostTensor) -> Vec<f64> {
    let (b, h, s, d) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let xs = x.to_f64_vec();
    let mut out = vec![0.0; xs.len()];
    for i in 0..b * h {
        for k in 0..d {
            let mean = (0..s).map(|j| xs[(i * s + j) * d + k]).sum::<f64>() / s as f64;
            for j in 0..s {
                out[(i * s + j) * d + k] = xs[(i * s + j) * d + k] - mean;
            }
        }
    }
    out
}

/// `y[b, :, d] = x[b, :, d] - max_s x[b, s, d]` for `x, y: [B, S, D]`, the `[BB, BS, BD]`
/// tile's middle extent a multiple of 32 that is no power of two (96): the layout keeps each
/// thread's rows inside whole leading indices.
#[kernel(grid = [BB, 1, 1])]
pub fn sub_max_mid(
    x: Tensor<f32, 3>,
    y: TensorMut<f32, 3>,
    #[comptime(default = 2)] BB: usize,
    #[comptime(default = 96)] BS: usize,
    #[comptime(default = 32)] BD: usize,
) {
    let b0 = block_id().x * BB;
    let inside = iota([BB, BS, BD], 1) < x.dim(1);
    let t = x
        .tile([BB, BS, BD], [b0, 0, 0])
        .load_masked(inside, f32::NEG_INFINITY);
    let m = reduce_max(&t, 1).unsqueeze(1);
    y.tile([BB, BS, BD], [b0, 0, 0]).store(t - m);
}

/// The f64 reference of [`sub_max_mid`].
pub fn sub_max_mid_ref(x: &HostTensor) -> Vec<f64> {
    let (b, s, d) = (x.shape[0], x.shape[1], x.shape[2]);
    let xs = x.to_f64_vec();
    let mut out = vec![0.0; xs.len()];
    for i in 0..b {
        for k in 0..d {
            let m = (0..s)
                .map(|j| xs[(i * s + j) * d + k])
                .fold(f64::NEG_INFINITY, f64::max);
            for j in 0..s {
                out[(i * s + j) * d + k] = xs[(i * s + j) * d + k] - m;
            }
        }
    }
    out
}

/// `y[j, i] = x[i, j] + 1` for `x: [M, N]`, `y: [N, M]`: a register tile transposed with
/// `.t()` (not feeding `mma`), its elements exchanged between threads; and
/// `z[j, b, i] = x[i, j]`-style permutes of a 3-D view, `z: [N, 1, M]`.
#[kernel(grid = [BM, BN, 1])]
pub fn transpose_tile(
    x: Tensor<dtype, 2>,
    y: TensorMut<dtype, 2>,
    z: TensorMut<dtype, 3>,
    #[comptime(default = 32)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let (i0, j0) = (block_id().x * BM, block_id().y * BN);
    let t = x.tile([BM, BN], [i0, j0]).load();
    let one = full::<f32>([BN, BM], 1.0).cast_to(dtype);
    y.tile([BN, BM], [j0, i0]).store(t.t() + one);
    z.tile([BN, 1, BM], [j0, 0, i0])
        .store(t.reshape([BM, 1, BN]).permute([2, 1, 0]));
}

/// The f64 references of [`transpose_tile`]: `(y, z)`.
pub fn transpose_tile_ref(x: &HostTensor) -> (Vec<f64>, Vec<f64>) {
    let (m, n) = (x.shape[0], x.shape[1]);
    let xs = x.to_f64_vec();
    let mut y = vec![0.0; m * n];
    let mut z = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            y[j * m + i] = xs[i * n + j] + 1.0;
            z[j * m + i] = xs[i * n + j];
        }
    }
    (y, z)
}

/// `y[t, h, d] = select(x[t, h, d] > b[d], x[t, h, d], 0) + g[h, d]` for `x, y: [T, H, D]`,
/// `b: [D]` and `g: [H, D]`: operands of lower rank broadcast by numpy's rule (leading
/// extents of 1) in arithmetic, comparisons and `select`; `full` and `zeros` of rank 3.
#[kernel(grid = [BT, 1, 1])]
pub fn broadcast_ranks(
    x: Tensor<f32, 3>,
    b: Tensor<f32, 1>,
    g: Tensor<f32, 2>,
    y: TensorMut<f32, 3>,
    #[comptime(default = 2)] BT: usize,
    #[comptime(default = 8)] BH: usize,
    #[comptime(default = 32)] BD: usize,
) {
    let t0 = block_id().x * BT;
    let xt = x.tile([BT, BH, BD], [t0, 0, 0]).load();
    let bt = b.tile([BD], [0]).load();
    let gt = g.tile([BH, BD], [0, 0]).load();
    let kept = select(xt > bt, xt, zeros::<f32>([BT, BH, BD]));
    y.tile([BT, BH, BD], [t0, 0, 0])
        .store(kept * full::<f32>([BT, BH, BD], 1.0) + gt);
}

/// The f64 reference of [`broadcast_ranks`].
pub fn broadcast_ranks_ref(x: &HostTensor, b: &HostTensor, g: &HostTensor) -> Vec<f64> {
    let (h, d) = (x.shape[1], x.shape[2]);
    let (bs, gs) = (b.to_f64_vec(), g.to_f64_vec());
    x.to_f64_vec()
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let (j, k) = ((i / d) % h, i % d);
            (if v > bs[k] { v } else { 0.0 }) + gs[j * d + k]
        })
        .collect()
}

/// `y[t, h, :] = x[t, h, :] * 3` for the heads `h < keep` only (a bounded store along the
/// tile's middle dimension): `y`'s other heads keep what they held.
#[kernel(grid = [BT, 1, 1])]
pub fn keep_heads(
    x: Tensor<f32, 3>,
    y: TensorMut<f32, 3>,
    keep: i32,
    #[comptime(default = 2)] BT: usize,
    #[comptime(default = 8)] BH: usize,
    #[comptime(default = 32)] BD: usize,
) {
    let t0 = block_id().x * BT;
    let v = x.tile([BT, BH, BD], [t0, 0, 0]).load() * 3.0;
    y.tile([BT, BH, BD], [t0, 0, 0]).store_bounded(v, 1, keep);
}

/// Per token and head of `x: [T, H, D]`, any `D`: `sum[t, h]` and `max[t, h]` over `d`,
/// walking `d` in `BD`-wide chunks with a 3-D accumulator and a 2-D running maximum carried
/// through the loop.
#[kernel(grid = [BT, 1, 1])]
pub fn chunk_stats(
    x: Tensor<f32, 3>,
    sum: TensorMut<f32, 2>,
    max_out: TensorMut<f32, 2>,
    #[comptime(default = 2)] BT: usize,
    #[comptime(default = 8)] BH: usize,
    #[comptime(default = 64)] BD: usize,
) {
    let t0 = block_id().x * BT;
    let n = x.dim(2);
    let mut acc = zeros::<f32>([BT, BH, BD]);
    let mut m = full::<f32>([BT, BH], f32::NEG_INFINITY);
    for j in (0..n).step_by(BD) {
        let inside = iota([BT, BH, BD], 2) + j < n;
        let t = x.tile([BT, BH, BD], [t0, 0, j]).load();
        acc = acc + t;
        m = max(&m, &reduce_max(&select(inside, t, f32::NEG_INFINITY), 2));
    }
    sum.tile([BT, BH], [t0, 0]).store(reduce_sum(&acc, 2));
    max_out.tile([BT, BH], [t0, 0]).store(m);
}

/// The f64 references of [`chunk_stats`]: `(sum, max)`.
pub fn chunk_stats_ref(x: &HostTensor) -> (Vec<f64>, Vec<f64>) {
    let d = x.shape[2];
    let xs = x.to_f64_vec();
    xs.chunks(d)
        .map(|r| {
            (
                r.iter().sum::<f64>(),
                r.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            )
        })
        .unzip()
}
