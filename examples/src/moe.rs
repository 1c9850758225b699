//! The expert computation of a mixture-of-experts layer: the tokens routed to each expert
//! gathered, multiplied by that expert's weights (a grouped GEMM, one GEMM per expert over
//! its own rows) and added back into each token's output scaled by its routing weight, in
//! one kernel.

use kiln::prelude::*;

/// `out[t, :] += sum_{routes (t, e, g)} g * x[t, :] @ w[e]` for `x: [T, H]` tokens and
/// `w: [E, H, N]` expert weights (element type `dtype`), `out: [T, N]` f32.
///
/// The routes come sorted by expert, as a router's top-k followed by a counting sort gives
/// them: slot `s` of the `S` slots routes token `tokens[s]` (i32) with weight `gates[s]`
/// (f32), and expert `e` owns slots `offsets[e]..offsets[e + 1]` (`offsets: [E + 1]` i32,
/// the exclusive prefix sum of the experts' route counts; an expert may own none). A token
/// may appear under several experts (top-k); any `T`, `E`, `H`, `N`, none a multiple of the
/// tiles.
///
/// Block `(e, nb, z)` computes columns `nb BN ..` of expert `e`'s rows: its row blocks
/// `z, z + SPLIT, ..` (`SPLIT = grid.z`) of `BM` slots each. For each it gathers the
/// slots' token rows of `x` straight into the mma's A operand (`x.rows(..)`), multiplies
/// them by `w[e]` `BK` rows of `H` at a time in f32, scales row `s` by `gates[s]` and adds
/// the tile into `out`'s token rows atomically (`out.rows(..).atomic_add(..)`), since the
/// token's other experts add to the same row from other blocks. Slots past the expert's end
/// address no row, so nothing of theirs is read or written.
///
/// Grid: `(E, cdiv(N, BN), SPLIT)` for any `SPLIT >= 1` (more splits spread an expert with
/// many rows over more blocks). `out` accumulates: zero it first (or pass the residual).
/// Comptime: `BM`, `BN` (tile of slots and output columns, default 64 each; `BM` a multiple
/// of 64, 16 rows for each of the 4 warps), `BK` (the K step, default 32), `dtype` (bf16 or
/// f16, default bf16).
#[kernel(num_warps = 4)]
#[allow(clippy::too_many_arguments)]
pub fn moe_experts(
    x: Tensor<dtype, 2>,
    w: Tensor<dtype, 3>,
    offsets: Tensor<i32, 1>,
    tokens: Tensor<i32, 1>,
    gates: Tensor<f32, 1>,
    out: TensorMut<f32, 2>,
    #[comptime(default = 64)] BM: usize,
    #[comptime(default = 64)] BN: usize,
    #[comptime(default = 32)] BK: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let (e, nb, z) = (block_id().x, block_id().y, block_id().z);
    let n0 = nb * BN;
    let lo = offsets.scalar([e]);
    let hi = offsets.scalar([e + 1]);
    let h = x.dim(1);
    for r0 in (lo + z * BM..hi).step_by(grid_dim().z * BM) {
        // The block's slots past the expert's end belong to the next expert (or to none):
        // token -1 addresses no row of `x` or `out`.
        let live = iota([BM], 0) + r0 < hi;
        let tok = select(live, tokens.tile([BM], [r0]).load(), -1);
        let mut acc = zeros::<f32>([BM, BN]);
        for k0 in (0..h).step_by(BK) {
            let a = x.rows(&tok, BK, [0, k0]).load();
            let b = w.tile([BK, BN], [e, k0, n0]).load();
            acc = mma_acc(&a, &b, &acc);
        }
        let g = gates.tile([BM], [r0]).load().col();
        out.rows(&tok, BN, [0, n0]).atomic_add(acc * g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::build;

    #[test]
    fn builds_with_its_defaults_and_small_tiles() {
        build(
            &moe_experts,
            MoeExpertsComptime {
                BM: 64,
                BN: 64,
                BK: 32,
                dtype: DType::Bf16,
            },
        );
        build(
            &moe_experts,
            MoeExpertsComptime {
                BM: 64,
                BN: 32,
                BK: 16,
                dtype: DType::F16,
            },
        );
    }
}
