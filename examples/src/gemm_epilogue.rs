//! GEMMs with fused epilogues, `act(a @ b + bias)` and `alpha * (a @ b) + beta * c`: bf16 or
//! f16 tensors, f32 accumulation and epilogue arithmetic. Both share
//! [`gemm`](crate::gemm::gemm)'s tile parameters, grid and pipelined `mainloop`, so the sm_90a
//! passes schedule them as the gemm; only what happens to `acc` after the loop differs.
//!
//! Both declare 8 warps for sm_80, each a 64x32 sub-tile: the gemm's 4 of 64x64 would take the
//! epilogue's tiles (`c`, an activation's temporaries) past 255 registers into spills. On sm_90a
//! wgmma fixes the warps, as for the gemm.

use kiln::prelude::*;

use crate::gemm::mainloop;

/// `act = 0`: the identity.
pub const ACT_NONE: usize = 0;
/// `act = 1`: `max(x, 0)`.
pub const ACT_RELU: usize = 1;
/// `act = 2`: GELU, tanh approximation (the DSL has no `erf`):
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
pub const ACT_GELU: usize = 2;
/// `act = 3`: SiLU, `x * sigmoid(x)`.
pub const ACT_SILU: usize = 3;

/// `sqrt(2/pi)`, the GELU tanh approximation's scale.
const GELU_SCALE: f32 = 0.797_884_6;
/// The GELU tanh approximation's cubic coefficient.
const GELU_CUBIC: f32 = 0.044_715;

/// `1 / (1 + e^-x)`, elementwise, as `min(u, 1) / (1 + min(u, 1/u))` with `u = e^x`: the
/// numerator is `e^min(x, 0)` and the denominator's term `e^-|x|`, so nothing overflows
/// (`u = inf` gives 1); below `x = -87.3`, where `e^x` leaves f32's normal range and the DSL's
/// `exp` gives 0, the sigmoid is 0. Two `min`s, not a `select`: no predicate per element
/// beside the accumulator's registers.
#[kernel_fn]
fn sigmoid(x: Value) -> Value {
    let u = exp(&x);
    min(&u, 1.0) * recip(&(min(&u, &recip(&u)) + 1.0))
}

/// Activation number `act` ([`ACT_NONE`], [`ACT_RELU`], [`ACT_GELU`], [`ACT_SILU`]) of `x`,
/// chosen while building. GELU uses `0.5 (1 + tanh(u)) = sigmoid(2u)`, so it needs one
/// exponential and two reciprocals per element, as SiLU does.
#[kernel_fn]
fn activation(x: Value, act: usize) -> Value {
    if act == ACT_RELU {
        max(&x, 0.0)
    } else if act == ACT_GELU {
        let u = (x + x * x * x * GELU_CUBIC) * (2.0 * GELU_SCALE);
        x * sigmoid(u)
    } else if act == ACT_SILU {
        x * sigmoid(x)
    } else if act == ACT_NONE {
        x
    } else {
        reject("`act` must be 0 (none), 1 (relu), 2 (gelu) or 3 (silu)")
    }
}

/// `c[M, N] = act(a[M, K] @ B + bias)` for any `M`, `N`, `K`: `bias[N]` is added to every
/// row, then activation number `act` is applied ([`ACT_NONE`] = 0, [`ACT_RELU`] = 1,
/// [`ACT_GELU`] = 2 (tanh approximation), [`ACT_SILU`] = 3; any other number is rejected).
/// `B` is `b[K, N]`, or `b[N, K]` when `b_col_major`, as in [`gemm`](crate::gemm::gemm).
///
/// Grid: `(cdiv(M, BM), cdiv(N, BN), 1)`. Comptime: `act = 0` and the gemm's `CLUSTER_M`,
/// tile, `b_col_major` and `dtype` (every tensor's element type), defaults and tune lists.
#[kernel(num_warps = 8, grid = [BM, BN, 1])]
pub fn gemm_bias_act(
    a: Tensor<dtype, 2>,
    b: Tensor<dtype, 2>,
    bias: Tensor<dtype, 1>,
    c: TensorMut<dtype, 2>,
    #[comptime(default = 1, tune = [1, 2])] CLUSTER_M: usize,
    #[comptime(default = 0)] act: usize,
    #[comptime(default = 128, tune = [64, 128])] BM: usize,
    #[comptime(default = 128, tune = [128, 256])] BN: usize,
    #[comptime(default = 64, tune = [32, 64])] BK: usize,
    #[comptime(default = 3, tune = [3, 4, 5])] STAGES: usize,
    #[comptime(default = false)] b_col_major: bool,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let acc = mainloop(a, b, mb, nb, BM, BN, BK, STAGES, CLUSTER_M, b_col_major);
    let bias_row = bias.tile([BN], [nb * BN]).load().cast::<f32>();
    let y = activation(acc + bias_row.row(), act);
    c.tile([BM, BN], [mb * BM, nb * BN]).store(y.cast_to(dtype));
}

/// `d[M, N] = alpha * (a[M, K] @ B) + beta * c[M, N]` for any `M`, `N`, `K` (BLAS's
/// `gemm` with a separate output; `c` is read once per element, in f32). `B` is `b[K, N]`,
/// or `b[N, K]` when `b_col_major`, as in [`gemm`](crate::gemm::gemm).
///
/// Grid: `(cdiv(M, BM), cdiv(N, BN), 1)`. Comptime: the gemm's `CLUSTER_M`, tile,
/// `b_col_major` and `dtype` (every tensor's element type), defaults and tune lists.
#[kernel(num_warps = 8, grid = [BM, BN, 1])]
pub fn gemm_alpha_beta(
    a: Tensor<dtype, 2>,
    b: Tensor<dtype, 2>,
    c: Tensor<dtype, 2>,
    d: TensorMut<dtype, 2>,
    #[comptime(default = 1, tune = [1, 2])] CLUSTER_M: usize,
    alpha: f32,
    beta: f32,
    #[comptime(default = 128, tune = [64, 128])] BM: usize,
    #[comptime(default = 128, tune = [128, 256])] BN: usize,
    #[comptime(default = 64, tune = [32, 64])] BK: usize,
    #[comptime(default = 3, tune = [3, 4, 5])] STAGES: usize,
    #[comptime(default = false)] b_col_major: bool,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let acc = mainloop(a, b, mb, nb, BM, BN, BK, STAGES, CLUSTER_M, b_col_major);
    let cs = c.tile([BM, BN], [mb * BM, nb * BN]).load().cast::<f32>();
    d.tile([BM, BN], [mb * BM, nb * BN])
        .store((acc * alpha + cs * beta).cast_to(dtype));
}
