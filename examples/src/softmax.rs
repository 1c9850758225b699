//! Row-wise softmax of an `[M, N]` f32 tensor, any `N`, with an online max/sum pass.

use kiln::prelude::*;

/// `log2(e)`: softmax is computed with `exp2`, so exponents are scaled by it.
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// `y[r, :] = softmax(x[r, :])` for `x, y: [M, N]` f32, any `M` and `N`.
///
/// Each block owns `BM` rows. A first runtime loop walks the row in `BN`-wide column tiles
/// keeping the running maximum `m` and the running sum `l` of `exp(x - m)` (rescaled when
/// `m` grows); columns past `N` are masked to `-inf` so they add nothing. A second loop writes
/// `exp2((x - m) * log2e) / l`.
///
/// Grid: `(cdiv(M, BM), 1, 1)`. Comptime: `BM` (rows per block, default 4), `BN` (columns
/// per tile, default 512); both powers of two.
#[kernel(grid = [BM, 1, 1])]
pub fn softmax(
    x: Tensor<f32, 2>,
    y: TensorMut<f32, 2>,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 512)] BN: usize,
) {
    let row0 = block_id().x * BM;
    let n = x.dim(1);
    let mut m = full::<f32>([BM], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([BM]);
    for j in (0..n).step_by(BN) {
        let cols = iota([BM, BN], 1) + j;
        let t = select(
            cols < n,
            x.tile([BM, BN], [row0, j]).load(),
            f32::NEG_INFINITY,
        );
        let m_new = max(&m, &row_max(&t));
        let p = exp2(&((t - m_new.col()) * LOG2E));
        l = l * exp2(&((m - m_new) * LOG2E)) + row_sum(&p);
        m = m_new;
    }
    for j in (0..n).step_by(BN) {
        let t = x.tile([BM, BN], [row0, j]).load();
        y.tile([BM, BN], [row0, j])
            .store(exp2(&((t - m.col()) * LOG2E)) / l.col());
    }
}

/// Softmax's backward: `dx[r, :] = y[r, :] * (dy[r, :] - sum_c(dy[r, c] * y[r, c]))` for
/// `y` (the forward's output), `dy`, `dx: [M, N]` of element type `dtype`, any `M` and `N`.
/// Grid: `(cdiv(M, BM), 1, 1)`.
#[kernel(grid = [BM, 1, 1])]
pub fn softmax_backward(
    y: Tensor<dtype, 2>,
    dy: Tensor<dtype, 2>,
    dx: TensorMut<dtype, 2>,
    #[comptime(default = 4)] BM: usize,
    #[comptime(default = 1024)] BN: usize,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    let row0 = block_id().x * BM;
    let n = y.dim(1);
    let mut s = zeros::<f32>([BM]);
    for j in (0..n).step_by(BN) {
        // Columns past `N` load as zeros and add nothing.
        let yt = y.tile([BM, BN], [row0, j]).load().cast::<f32>();
        let dt = dy.tile([BM, BN], [row0, j]).load().cast::<f32>();
        s = s + row_sum(&(yt * dt));
    }
    for j in (0..n).step_by(BN) {
        let yt = y.tile([BM, BN], [row0, j]).load().cast::<f32>();
        let dt = dy.tile([BM, BN], [row0, j]).load().cast::<f32>();
        dx.tile([BM, BN], [row0, j])
            .store((yt * (dt - s.col())).cast_to(dtype));
    }
}

#[cfg(test)]
mod tests {
    use kiln::ir::print::print_kernel;

    use super::{SoftmaxComptime, softmax};
    use crate::testing::{build, loop_stages};

    #[test]
    fn builds_for_defaults_and_variants() {
        for (bm, bn) in [(4, 512), (1, 1024), (8, 128)] {
            let k = build(&softmax, SoftmaxComptime { BM: bm, BN: bn });
            assert_eq!(loop_stages(&k).len(), 2, "two passes over the row");
            assert!(print_kernel(&k).contains(&format!("rt<f32,{bm}x{bn}>")));
        }
    }
}
