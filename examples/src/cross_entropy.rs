//! Cross-entropy of logits against class indices, forward and backward: the loss of a
//! language model's vocabulary projection, one row per token.
//!
//! Class indices come as `target: [M, W]` i32 words, the class in column 0: an int32 tensor
//! viewed `[M, 1]`, or an int64 one viewed as its `[M, 2]` little-endian words (the low word
//! is the class for every index an i32 holds: `-100` reads `-100`), so the caller's targets
//! are read where they lie, with no conversion kernel. A row is ignored (loss 0, out of the
//! mean, no gradient) when its class is negative or `ignore_index`.

use kiln::ir::dsl::Tensor;
use kiln::prelude::*;

/// `log2(e)`: exponentials are computed with `exp2`.
const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln(2)`: turns `log2` into the natural logarithm.
const LN2: f32 = std::f32::consts::LN_2;

/// `loss[r] = logsumexp(x[r, :]) - x[r, target[r]]` and `lse[r] = logsumexp(x[r, :])` for
/// logits `x: [M, V]` (bf16, f16 or f32, the comptime `dtype`) and class indices `target`
/// (see the module); an ignored row gives loss 0.
///
/// Each block owns `BM` rows and walks them in `BN`-wide column tiles with an online
/// maximum, as softmax does; the target's logit is read by itself, an element gather.
/// Grid: `(cdiv(M, BM), 1, 1)`. `NW` warps per block (default 2): each tile's row maximum
/// comes before its exponentials, so a thread carries more of each tile (at 2048 columns,
/// 32 elements: 64 bytes in bf16, where 4 warps carried 32). The loop is `pipelined`
/// `STAGES` deep: the compiler issues the loads `STAGES - 1` tiles ahead of the reductions.
#[kernel(num_warps = NW, grid = [BM, 1, 1])]
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy(
    x: Tensor<dtype, 2>,
    target: Tensor<i32, 2>,
    loss: TensorMut<f32, 1>,
    lse: TensorMut<f32, 1>,
    ignore_index: i32,
    #[comptime(default = 1)] BM: usize,
    #[comptime(default = 2048)] BN: usize,
    #[comptime(default = 2)] NW: usize,
    #[comptime(default = 1)] STAGES: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let r0 = block_id().x * BM;
    let v = x.dim(1);
    let t = classes(target, r0, BM);
    let mut m = full::<f32>([BM], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([BM]);
    // A class outside the row reads 0 (its loss is that of a logit 0, as documented).
    let picked = x.elems([iota([BM], 0) + r0, t]).load().cast::<f32>();
    for j in pipelined((0..v).step_by(BN), stages = STAGES as u32) {
        let raw = x.tile([BM, BN], [r0, j]).load();
        let cols = iota([BM, BN], 1) + j;
        let xt = select(cols < v, raw.cast::<f32>(), f32::NEG_INFINITY);
        let m_new = max(&m, &row_max(&xt));
        l = l * exp2(&((m - m_new) * LOG2E)) + row_sum(&exp2(&((xt - m_new.col()) * LOG2E)));
        m = m_new;
    }
    let lse_r = m + log2(&l) * LN2;
    loss.tile([BM], [r0])
        .store(select(counted(t, ignore_index), lse_r - picked, 0.0));
    lse.tile([BM], [r0]).store(lse_r);
}

/// The classes of rows `r0..r0 + bm` (`[bm]`, column 0 of `target`; rows past `M` read 0).
#[kernel_fn]
fn classes(target: Tensor, r0: Value, bm: usize) -> Value {
    target.tile([bm, 1], [r0, 0]).load().reshape([bm])
}

/// Whether each class of `t` counts: not negative, not `ignore_index`.
#[kernel_fn]
fn counted(t: Value, ignore_index: Value) -> Value {
    t >= 0 && t != ignore_index
}

/// The batch's loss from [`cross_entropy`]'s per-row `loss: [M]`: `out[0]` their sum, or with
/// `MEAN` their mean over the rows that count (NaN when none does, as PyTorch's), and
/// `out[1]` how many rows count (the mean's divisor, which [`cross_entropy_backward`] reads).
/// One block, `BM` rows a step, in a fixed order: the same bits every call. The loop is
/// `pipelined` `STAGES` deep: one block walks every row, so each step's load latency is the
/// kernel's time unless the next step's loads are already in flight.
/// Grid: `(1, 1, 1)`.
#[kernel(num_warps = NW, grid = [1, 1, 1])]
pub fn cross_entropy_reduce(
    loss: Tensor<f32, 1>,
    target: Tensor<i32, 2>,
    out: TensorMut<f32, 1>,
    ignore_index: i32,
    #[comptime(default = false)] MEAN: bool,
    #[comptime(default = 1024)] BM: usize,
    #[comptime(default = 4)] NW: usize,
    #[comptime(default = 1)] STAGES: usize,
) {
    let m = loss.dim(0);
    let mut total = zeros::<f32>([BM]);
    let mut count = zeros::<f32>([BM]);
    for i in pipelined((0..m).step_by(BM), stages = STAGES as u32) {
        // Past `M`, loss reads 0 and the row is no row.
        total = total + loss.tile([BM], [i]).load();
        let row = iota([BM], 0) + i < m;
        count = count
            + select(
                row && counted(classes(target, i, BM), ignore_index),
                1.0,
                0.0,
            );
    }
    let total = row_sum(&total.row());
    let count = row_sum(&count.row());
    out.tile([1], [0])
        .store(if MEAN { total / count } else { total });
    out.tile([1], [1]).store(count);
}

/// `dx[r, c] = (softmax(x[r, :])[c] - [c == target[r]]) * g[r]` (0 for an ignored row), with
/// `lse` from [`cross_entropy`] and `g` the loss's gradient as the reduction gave it:
/// `dloss[r]` (`REDUCED` false: no reduction), the one `dloss[0]` (a sum), or that over the
/// counted rows `stats[1]` from [`cross_entropy_reduce`] (`MEAN`); `stats` is read only then.
/// Grid: `(cdiv(M, BM), 1, 1)`. The loop is `pipelined` `STAGES` deep, as the forward's.
#[kernel(num_warps = NW, grid = [BM, 1, 1])]
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_backward(
    x: Tensor<dtype, 2>,
    target: Tensor<i32, 2>,
    lse: Tensor<f32, 1>,
    dloss: Tensor<f32, 1>,
    stats: Tensor<f32, 1>,
    dx: TensorMut<dtype, 2>,
    ignore_index: i32,
    #[comptime(default = false)] REDUCED: bool,
    #[comptime(default = false)] MEAN: bool,
    #[comptime(default = 1)] BM: usize,
    #[comptime(default = 2048)] BN: usize,
    #[comptime(default = 4)] NW: usize,
    #[comptime(default = 1)] STAGES: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let r0 = block_id().x * BM;
    let v = x.dim(1);
    let t = classes(target, r0, BM);
    let tc = t.col();
    let g = if REDUCED {
        let g = full::<f32>([BM], dloss.scalar([0]));
        if MEAN { g / stats.scalar([1]) } else { g }
    } else {
        dloss.tile([BM], [r0]).load()
    };
    let scale = select(counted(t, ignore_index), g, 0.0).col();
    let lc = lse.tile([BM], [r0]).load().col();
    for j in pipelined((0..v).step_by(BN), stages = STAGES as u32) {
        let cols = iota([BM, BN], 1) + j;
        let xt = x.tile([BM, BN], [r0, j]).load().cast::<f32>();
        let p = exp2(&((xt - lc) * LOG2E));
        let g = (p - select(cols == tc, 1.0, 0.0)) * scale;
        dx.tile([BM, BN], [r0, j]).store(g.cast_to(dtype));
    }
}
