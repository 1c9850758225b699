//! The expert computation of a mixture-of-experts layer: the tokens routed to each expert
//! gathered, multiplied by that expert's weights (a grouped GEMM, one GEMM per expert over
//! its own rows) and added back into each token's output scaled by its routing weight, in
//! one kernel ([`moe_experts`]); and the routing it reads, the router's top-k choices
//! grouped by expert on the GPU ([`moe_count`], then [`moe_scatter`]).

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

/// The first half of grouping a router's choices by expert: `counts[e] += ` the number of
/// routes to expert `e` among `experts` (each token's top-k expert indices, `[T, K]`
/// flattened row-major to `[S]`, i32; an index outside `0..E` is no route), and the block
/// that finishes last writes `offsets` (`[E + 1]`, i32): the exclusive prefix sum of the
/// counts, where [`moe_scatter`] and [`moe_experts`] find each expert's slots.
///
/// Each block counts its `BLOCK` routes with one atomic add through an index tile, then
/// takes a ticket (an acq_rel scalar atomic on `ticket[0]`, so every block's counts are
/// visible to the one that draws the last ticket); that block sums the counts `BE` at a
/// time (a lower-triangular mask and a row sum give a chunk's inclusive prefix, a carried
/// total joins the chunks) and resets `ticket[0]` to 0 for the next launch.
///
/// Grid: `(cdiv(S, BLOCK), 1, 1)`. `counts` and `ticket` start at 0. Comptime: `BLOCK`
/// (routes per block, default 256), `BE` (experts per prefix step, default 64).
#[kernel(grid = [BLOCK, 1, 1])]
pub fn moe_count(
    experts: Tensor<i32, 1>,
    counts: TensorMut<i32, 1>,
    offsets: TensorMut<i32, 1>,
    ticket: TensorMut<i32, 1>,
    #[comptime(default = 256)] BLOCK: usize,
    #[comptime(default = 64)] BE: usize,
) {
    let b = block_id().x;
    let e = experts.tile([BLOCK], [b * BLOCK]).load();
    let inside = iota([BLOCK], 0) + b * BLOCK < experts.dim(0);
    // Indices outside `counts` are skipped by the atomic itself.
    counts.elems([e]).atomic_add_masked(1, inside);
    let order = AtomicOpts::new().sem(MemSem::AcqRel);
    let done = ticket.at([0]).atomic(AtomicOp::Add, 1, None, order);
    if done == grid_dim().x - 1 {
        let ne = counts.dim(0);
        let below = iota([BE, BE], 1) <= iota([BE, BE], 0);
        let mut total = zeros::<i32>([1]);
        for c0 in (0..ne).step_by(BE) {
            // Past `E` the counts load as 0, and the stores past `offsets` are skipped.
            let cnt = counts.tile([BE], [c0]).load();
            let inclusive = row_sum(&select(below, cnt.row(), 0));
            offsets.tile([BE], [c0 + 1]).store(inclusive + total);
            total = total + row_sum(&cnt.row());
        }
        offsets.tile([1], [0]).store(zeros::<i32>([1]));
        ticket.at([0]).atomic_xchg(0);
    }
}

/// The second half: each route `s` (expert `experts[s]`, weight `weights[s]`, token
/// `s / topk`) gets a slot among its expert's, `offsets[e] + ` a rank from an atomic add on
/// `cursor[e]`, and writes `tokens[slot] = s / topk` and `gates[slot] = weights[s]`: the
/// routes grouped by expert as [`moe_experts`] reads them. Routes of one expert land in the
/// order their atomics apply (which varies from run to run on the GPU; the expert GEMM's
/// sum does not depend on it beyond rounding); routes to an expert outside `0..E` are
/// dropped.
///
/// Grid: `(cdiv(S, BLOCK), 1, 1)`. `cursor` (`[E]`, i32) starts at 0. Comptime: `BLOCK`
/// (routes per block, default 256).
#[kernel(grid = [BLOCK, 1, 1])]
#[allow(clippy::too_many_arguments)]
pub fn moe_scatter(
    experts: Tensor<i32, 1>,
    weights: Tensor<f32, 1>,
    offsets: Tensor<i32, 1>,
    cursor: TensorMut<i32, 1>,
    tokens: TensorMut<i32, 1>,
    gates: TensorMut<f32, 1>,
    topk: i32,
    #[comptime(default = 256)] BLOCK: usize,
) {
    let b = block_id().x;
    let s = iota([BLOCK], 0) + b * BLOCK;
    let e = experts.tile([BLOCK], [b * BLOCK]).load();
    let routed = s < experts.dim(0) && e >= 0 && e < cursor.dim(0);
    let rank = cursor.elems([e]).atomic_add_masked(1, routed);
    let base = offsets.elems([e]).load();
    // Slot -1 addresses nothing: a dropped route writes nowhere.
    let slot = select(routed, base + rank, -1);
    tokens.elems([slot]).store(s / topk);
    gates
        .elems([slot])
        .store(weights.tile([BLOCK], [b * BLOCK]).load());
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::build;

    #[test]
    fn the_routing_kernels_build() {
        build(&moe_count, MoeCountComptime { BLOCK: 256, BE: 64 });
        build(&moe_scatter, MoeScatterComptime { BLOCK: 256 });
    }

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
