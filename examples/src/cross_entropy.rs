//! Cross-entropy of logits against class indices, forward and backward: the loss of a
//! language model's vocabulary projection, one row per token.

use kiln::prelude::*;

/// `log2(e)`: exponentials are computed with `exp2`.
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln(2)`: turns `log2` into the natural logarithm.
const LN2: f32 = std::f32::consts::LN_2;

/// `loss[r] = logsumexp(x[r, :]) - x[r, target[r]]` and `lse[r] = logsumexp(x[r, :])` for
/// logits `x: [M, V]` (bf16, f16 or f32, the comptime `dtype`) and class indices `target: [M]`;
/// a negative target (PyTorch's `ignore_index = -100`) gives loss 0.
///
/// Each block owns `BM` rows and walks them in `BN`-wide column tiles with an online
/// maximum, as softmax does; the target's logit is picked from the tile holding it.
/// Grid: `(cdiv(M, BM), 1, 1)`. `NW` warps per block (default 2): each iteration's loads wait
/// on the previous tile's row reductions, so a thread carries more of each tile (at 2048
/// columns, 32 elements: 64 bytes in bf16, where 4 warps carried 32).
#[kernel(num_warps = NW, grid = [BM, 1, 1])]
pub fn cross_entropy(
    x: Tensor<dtype, 2>,
    target: Tensor<i32, 1>,
    loss: TensorMut<f32, 1>,
    lse: TensorMut<f32, 1>,
    #[comptime(default = 1)] BM: usize,
    #[comptime(default = 2048)] BN: usize,
    #[comptime(default = 2)] NW: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let r0 = block_id().x * BM;
    let v = x.dim(1);
    let t = target.tile([BM], [r0]).load();
    let tc = t.col();
    let mut m = full::<f32>([BM], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([BM]);
    let mut picked = zeros::<f32>([BM]);
    for j in (0..v).step_by(BN) {
        let cols = iota([BM, BN], 1) + j;
        let xt = select(
            cols < v,
            x.tile([BM, BN], [r0, j]).load().cast::<f32>(),
            f32::NEG_INFINITY,
        );
        let m_new = max(&m, &row_max(&xt));
        l = l * exp2(&((m - m_new) * LOG2E)) + row_sum(&exp2(&((xt - m_new.col()) * LOG2E)));
        picked = picked + row_sum(&select(cols == tc, xt, 0.0));
        m = m_new;
    }
    let lse_r = m + log2(&l) * LN2;
    loss.tile([BM], [r0])
        .store(select(t >= 0, lse_r - picked, 0.0));
    lse.tile([BM], [r0]).store(lse_r);
}

/// `dx[r, c] = (softmax(x[r, :])[c] - [c == target[r]]) * dloss[r]` (0 for a negative
/// target), with `lse` from [`cross_entropy`]. Grid: `(cdiv(M, BM), 1, 1)`.
#[kernel(num_warps = NW, grid = [BM, 1, 1])]
pub fn cross_entropy_backward(
    x: Tensor<dtype, 2>,
    target: Tensor<i32, 1>,
    lse: Tensor<f32, 1>,
    dloss: Tensor<f32, 1>,
    dx: TensorMut<dtype, 2>,
    #[comptime(default = 1)] BM: usize,
    #[comptime(default = 2048)] BN: usize,
    #[comptime(default = 4)] NW: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let r0 = block_id().x * BM;
    let v = x.dim(1);
    let t = target.tile([BM], [r0]).load();
    let tc = t.col();
    let scale = select(t >= 0, dloss.tile([BM], [r0]).load(), 0.0).col();
    let lc = lse.tile([BM], [r0]).load().col();
    for j in (0..v).step_by(BN) {
        let cols = iota([BM, BN], 1) + j;
        let xt = x.tile([BM, BN], [r0, j]).load().cast::<f32>();
        let p = exp2(&((xt - lc) * LOG2E));
        let g = (p - select(cols == tc, 1.0, 0.0)) * scale;
        dx.tile([BM, BN], [r0, j]).store(g.cast_to(dtype));
    }
}
