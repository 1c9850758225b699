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
#[kernel(num_warps = 4, grid = [BM, BN, 1])]
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

/// `base` with the tile `gemm` launches with on `target` for `c[m, n] = a[m, k] @ B` when
/// nothing chose one (`BM`, `BN`, `BK` and `STAGES`; the rest, `dtype` included, is `base`'s),
/// for a GPU of `sms` multiprocessors. On sm_90a:
/// - a row stride of `a`, `b` or `c` that is not a multiple of 16 bytes (no TMA: elementwise
///   loads) gets `64 x 128`, 3 stages, best on both odd shapes of the autotuned sweep;
/// - enough `128 x 256` tiles for every multiprocessor gets `128 x 256`, 4 stages: on the 11
///   shapes from 4096^3 up it ran 1.00-1.10x faster than `128 x 128` in two same-job A/B runs:
///   half the operand traffic per flop of the narrower tile;
/// - else enough `128 x 128` tiles gets those, 4 stages (2048^3: 128 wide tiles would leave 4
///   SMs idle);
/// - otherwise `64 x 128`, 5 stages, so every SM has a tile (1024^3: 1.31x faster than
///   `128 x 128`).
///
/// Other targets keep `base` (sm_80's default 3 stages fit two CTAs per SM). The H200 runs
/// behind these choices are named in `bench/results/README.md`.
pub fn tuned_tile(
    target: kiln::ir::Target,
    [m, n, k]: [usize; 3],
    base: GemmComptime,
    sms: usize,
) -> GemmComptime {
    if target != kiln::ir::Target::Sm90a {
        return base;
    }
    // a's rows are K long, c's N, and b's one of the two whichever its layout.
    let aligned = [k, n]
        .iter()
        .all(|&cols| (cols * base.dtype.size_bytes()).is_multiple_of(16));
    let fills = |bm: usize, bn: usize| m.div_ceil(bm) * n.div_ceil(bn) >= sms;
    let (bm, bn, stages) = if !aligned {
        (64, 128, 3)
    } else if fills(128, 256) {
        (128, 256, 4)
    } else if fills(128, 128) {
        (128, 128, 4)
    } else {
        (64, 128, 5)
    };
    GemmComptime {
        BM: bm,
        BN: bn,
        BK: 64,
        STAGES: stages,
        ..base
    }
}

#[cfg(test)]
mod tests {
    use kiln::ir::Target;

    use super::{GemmComptime, gemm, tuned_tile};
    use crate::testing::{build, loop_stages};

    #[test]
    fn tuned_tiles_fill_the_gpu_and_fall_back_without_tma() {
        let tile = |mnk| {
            let t = tuned_tile(Target::Sm90a, mnk, GemmComptime::default(), 132);
            (t.BM, t.BN, t.STAGES)
        };
        assert_eq!(tile([4096; 3]), (128, 256, 4));
        assert_eq!(tile([16384, 14336, 14336]), (128, 256, 4));
        // 128 tiles of 128 x 256 would leave 4 of the 132 SMs idle; 256 of 128 x 128 do not.
        assert_eq!(tile([2048; 3]), (128, 128, 4));
        assert_eq!(tile([1000, 3000, 4096]), (128, 128, 4));
        // 64 tiles of 128 x 128 would leave 68 of the 132 SMs idle.
        assert_eq!(tile([1024; 3]), (64, 128, 5));
        // 777 bf16 columns are 1554 bytes: no TMA for a's rows; 4095 for c's.
        assert_eq!(tile([1000, 3000, 777]), (64, 128, 3));
        assert_eq!(tile([127, 4095, 4096]), (64, 128, 3));
        assert_eq!(tile([8192, 8192, 8196]), (64, 128, 3));
        let base = GemmComptime {
            b_col_major: true,
            ..GemmComptime::default()
        };
        assert!(tuned_tile(Target::Sm90a, [4096; 3], base, 132).b_col_major);
        assert_eq!(tuned_tile(Target::Sm80, [4096; 3], base, 132), base);
    }

    #[test]
    fn tuned_tiles_build_with_their_stages() {
        for mnk in [[4096; 3], [2048; 3], [1024; 3], [1000, 3000, 777]] {
            let t = tuned_tile(Target::Sm90a, mnk, GemmComptime::default(), 132);
            assert_eq!(loop_stages(&build(&gemm, t)), [Some(t.STAGES as u32)]);
        }
    }

    #[test]
    fn builds_for_defaults_and_variants() {
        let base = GemmComptime::default();
        for c in [
            base,
            GemmComptime {
                BM: 64,
                BN: 64,
                BK: 64,
                ..base
            },
            GemmComptime {
                b_col_major: true,
                ..base
            },
        ] {
            let k = build(&gemm, c);
            assert_eq!(k.options.num_warps, 4);
            assert_eq!(loop_stages(&k), [Some(3)]);
        }
    }
}
