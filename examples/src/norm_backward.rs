//! Backward passes of layer norm and RMS norm over the last dimension: `dx` per row, and the
//! weight (and bias) gradients as per-block partial sums that [`sum_partials`] adds up (two
//! deterministic stages, no atomics).

use kiln::prelude::*;

/// Layer norm's backward for `y = (x - mean) * rstd * w + b` over rows of `x: [M, N]`:
/// with `xhat = (x - mean) * rstd` and `g = w * dy`,
/// `dx = (g - mean_c(g * xhat) * xhat - mean_c(g)) * rstd`; block `i` (rows
/// `BM i .. BM (i + 1)`) writes `dw_part[i, :] = sum_r dy * xhat` and
/// `db_part[i, :] = sum_r dy`. `x`, `dy`, `dx` and `w` are of element type `dtype`; `mean`,
/// `rstd` (from the forward) and the partials f32. Grid: `(cdiv(M, BM), 1, 1)`.
#[kernel(grid = [BM, 1, 1])]
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
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let blk = block_id().x;
    let r0 = blk * BM;
    let n = x.dim(1);
    let nf = n.cast::<f32>();
    let mu = mean.tile([BM], [r0]).load().col();
    let rs = rstd.tile([BM], [r0]).load().col();
    let mut c1 = zeros::<f32>([BM]);
    let mut c2 = zeros::<f32>([BM]);
    for j in (0..n).step_by(BN) {
        let xhat = (x.tile([BM, BN], [r0, j]).load().cast::<f32>() - mu) * rs;
        let wt = w.tile([BN], [j]).load().cast::<f32>().row();
        // Columns past `N` load as zeros, so `g` is zero there.
        let g = dy.tile([BM, BN], [r0, j]).load().cast::<f32>() * wt;
        c1 = c1 + row_sum(&(g * xhat));
        c2 = c2 + row_sum(&g);
    }
    let c1 = (c1 / nf).col();
    let c2 = (c2 / nf).col();
    for j in (0..n).step_by(BN) {
        let xhat = (x.tile([BM, BN], [r0, j]).load().cast::<f32>() - mu) * rs;
        let wt = w.tile([BN], [j]).load().cast::<f32>().row();
        let d = dy.tile([BM, BN], [r0, j]).load().cast::<f32>();
        let g = d * wt;
        dx.tile([BM, BN], [r0, j])
            .store(((g - xhat * c1 - c2) * rs).cast_to(dtype));
        // Rows past `M` load `dy` as zeros: they add nothing.
        dw_part
            .tile([1, BN], [blk, j])
            .store(col_sum(&(d * xhat)).row());
        db_part.tile([1, BN], [blk, j]).store(col_sum(&d).row());
    }
}

/// RMS norm's backward for `y = x * rstd * w`: with `xhat = x * rstd` and `g = w * dy`,
/// `dx = (g - mean_c(g * xhat) * xhat) * rstd`; block `i` writes
/// `dw_part[i, :] = sum_r dy * xhat`. Grid: `(cdiv(M, BM), 1, 1)`.
#[kernel(grid = [BM, 1, 1])]
pub fn rms_norm_backward(
    x: Tensor<dtype, 2>,
    w: Tensor<dtype, 1>,
    rstd: Tensor<f32, 1>,
    dy: Tensor<dtype, 2>,
    dx: TensorMut<dtype, 2>,
    dw_part: TensorMut<f32, 2>,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 1024)] BN: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let blk = block_id().x;
    let r0 = blk * BM;
    let n = x.dim(1);
    let nf = n.cast::<f32>();
    let rs = rstd.tile([BM], [r0]).load().col();
    let mut c1 = zeros::<f32>([BM]);
    for j in (0..n).step_by(BN) {
        let xhat = x.tile([BM, BN], [r0, j]).load().cast::<f32>() * rs;
        let wt = w.tile([BN], [j]).load().cast::<f32>().row();
        let g = dy.tile([BM, BN], [r0, j]).load().cast::<f32>() * wt;
        c1 = c1 + row_sum(&(g * xhat));
    }
    let c1 = (c1 / nf).col();
    for j in (0..n).step_by(BN) {
        let xhat = x.tile([BM, BN], [r0, j]).load().cast::<f32>() * rs;
        let wt = w.tile([BN], [j]).load().cast::<f32>().row();
        let d = dy.tile([BM, BN], [r0, j]).load().cast::<f32>();
        dx.tile([BM, BN], [r0, j])
            .store(((d * wt - xhat * c1) * rs).cast_to(dtype));
        dw_part
            .tile([1, BN], [blk, j])
            .store(col_sum(&(d * xhat)).row());
    }
}

/// `out[c] = sum_i part[i, c]` (f32 partials; `out` of element type `dtype`): the second
/// stage of the weight gradients. Grid: `(cdiv(N, BN), 1, 1)`.
#[kernel(grid = [BN, 1, 1])]
pub fn sum_partials(
    part: Tensor<f32, 2>,
    out: TensorMut<dtype, 1>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 128)] BN: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let c0 = block_id().x * BN;
    let p = part.dim(0);
    let mut acc = zeros::<f32>([BN]);
    for i in (0..p).step_by(BM) {
        // Rows past the last partial load as zeros.
        acc = acc + col_sum(&part.tile([BM, BN], [i, c0]).load());
    }
    out.tile([BN], [c0]).store(acc.cast_to(dtype));
}
