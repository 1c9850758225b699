//! `c = a @ b`: bf16 or f16 inputs and output (the comptime `dtype`), f32 accumulation.

use kiln::ir::dsl::Tensor;
use kiln::prelude::*;

/// `c[M, N] = a[M, K] @ B` for any `M`, `N`, `K`, where `B` is `b[K, N]` (row-major), or,
/// when `b_col_major`, `b[N, K]` holding `B` column-major (`B^T` row-major: each block loads
/// `[BN, BK]` tiles and multiplies by their transpose). Each block computes one `BM x BN`
/// tile of `c`, walking `K` in `BK` steps in a `STAGES`-deep pipelined loop; edge tiles load
/// as zeros, so a `K` tail adds exact zeros. Every tensor is of element type `dtype`.
///
/// Grid: `(cdiv(M, BM), cdiv(N, BN), 1)`. Comptime: `CLUSTER_M = 1`, `BM = 128`, `BN = 128`,
/// `BK = 64`, `STAGES = 3`, `b_col_major = false`, `dtype = bf16` (or `f16`); the autotuner
/// tries `CLUSTER_M` in {1, 2} (sm_90a: M-adjacent pairs share B's tiles, multicast), `BM` in
/// {64, 128, 192}, `BN` in {128, 256}, `BK` in {32, 64}, `STAGES` in {3, 4, 5} (what fits).
/// On sm_80: 4 warps of 64x64 (fewer ldmatrix per mma than 8 of 64x32), ~230 registers, 96 KiB
/// shared, 2 blocks/SM (H200, 4096^3: 352 TFLOP/s; BK = 32: 323; 8 warps: 314; 4 stages, 1/SM:
/// 285). On sm_90a: a persistent, warp-specialised wgmma kernel (README: figures vs cuBLAS).
#[kernel(num_warps = 4)]
pub fn gemm(
    a: Tensor<dtype, 2>,
    b: Tensor<dtype, 2>,
    c: TensorMut<dtype, 2>,
    #[comptime(default = 1, tune = [1, 2])] CLUSTER_M: usize,
    #[comptime(default = 128, tune = [64, 128, 192])] BM: usize,
    #[comptime(default = 128, tune = [128, 256])] BN: usize,
    #[comptime(default = 64, tune = [32, 64])] BK: usize,
    #[comptime(default = 3, tune = [3, 4, 5])] STAGES: usize,
    #[comptime(default = false)] b_col_major: bool,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let (mb, nb) = (block_id().x, block_id().y);
    let acc = mainloop(a, b, mb, nb, BM, BN, BK, STAGES, CLUSTER_M, b_col_major);
    c.tile([BM, BN], [mb * BM, nb * BN])
        .store(acc.cast_to(dtype));
}

/// The f32 `[BM, BN]` tile `(mb, nb)` of `a @ B` (`B`: `b[K, N]`, or `b[N, K]` if `b_col_major`):
/// `K` in `BK` steps `STAGES` deep, edge tiles zeros; `CLUSTER_M` blocks per cluster ([`cluster`]).
#[kernel_fn]
pub(crate) fn mainloop(
    a: Tensor,
    b: Tensor,
    mb: Value,
    nb: Value,
    BM: usize,
    BN: usize,
    BK: usize,
    STAGES: usize,
    CLUSTER_M: usize,
    b_col_major: bool,
) -> Value {
    cluster(CLUSTER_M);
    let k = a.dim(1);
    let mut acc = zeros::<f32>([BM, BN]);
    for kb in pipelined(0..cdiv(k, BK), stages = STAGES as u32) {
        let x = a.tile([BM, BK], [mb * BM, kb * BK]).load();
        acc = if b_col_major {
            let y = b.tile([BN, BK], [nb * BN, kb * BK]).load();
            mma_acc(&x, &y.t(), &acc)
        } else {
            let y = b.tile([BK, BN], [kb * BK, nb * BN]).load();
            mma_acc(&x, &y, &acc)
        };
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::gemm;
    use crate::testing::{build, loop_stages};

    #[test]
    fn builds_for_defaults_and_variants() {
        for overrides in [
            &[][..],
            &[("BM", "64"), ("BN", "64"), ("BK", "64")],
            &[("b_col_major", "true")],
        ] {
            let k = build(&gemm, overrides);
            assert_eq!(k.options.num_warps, 4);
            assert_eq!(loop_stages(&k), [Some(3)]);
        }
    }
}
