//! FlashAttention-2 forward: `o = softmax(q k^T * scale) v`, optionally causal.

use kiln::prelude::*;

/// Query rows per block.
const BM: usize = 128;
/// `log2(e)`: the softmax runs in base 2.
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// Masks the score tile `s` (rows `q0..`, keys `k0..`) to `-inf` where a key lies past `sk`
/// or, if `causal`, after the last key the row may see: query `i` sees key `j` iff
/// `j <= i + sk - sq` (causal aligned bottom-right, as FlashAttention-2).
#[kernel_fn]
fn mask(s: Value, q0: Value, k0: Value, sq: Value, sk: Value, bn: usize, causal: bool) -> Value {
    let cols = iota([BM, bn], 1) + k0;
    let keep = cols < sk;
    let keep = if causal {
        let rows = iota([BM, bn], 0) + q0;
        keep && cols <= rows + (sk - sq)
    } else {
        keep
    };
    select(keep, s, f32::NEG_INFINITY)
}

/// Folds one block of scaled scores `s` (and its values `vs`) into the running row maximum
/// `m`, row sum `l` and unnormalised output `acc`; returns the updated three.
#[kernel_fn]
fn online_update(s: Value, vs: Value, acc: Value, m: Value, l: Value) -> (Value, Value, Value) {
    let m_new = max(&m, &row_max(&s));
    // A row with no visible key so far has m_new = -inf; exponentiate against 0 so its terms
    // are exp2(-inf) = 0 rather than NaN.
    let m_use = select(m_new == f32::NEG_INFINITY, 0.0, m_new);
    let p = exp2(&(s - m_use.col()));
    let alpha = exp2(&(m - m_use));
    let l = l * alpha + row_sum(&p);
    let acc = acc * alpha.col() + mma(&p.cast::<bf16>(), &vs);
    (acc, m_new, l)
}

/// Attention over `q: [batch, heads, sq, d]` and `k, v: [batch, heads / kv_group, sk, d]`
/// (bf16, `sq` and `sk` may differ) into `o: [batch, heads, sq, d]`, scores scaled by `scale`.
///
/// Online softmax (FlashAttention-2): a block owns `BM = 128` query rows and walks key blocks
/// of `BN` in a 2-stage pipelined loop, keeping the running row maximum `m`, row sum `l` and
/// unnormalised output `acc`. Key blocks in which no key is masked for any of the block's rows
/// skip the mask (a block-uniform branch); the rest (the causal diagonal and the block holding
/// key `sk - 1`) apply it. When `causal`, the walk stops after the last key block any of its
/// rows may see (it never skips a block the maths needs); rows that see no key at all
/// (`sq > sk`) get `m = -inf` (0 is used in the exponent) and `l = 0`, and their output is 0.
/// Grouped-query attention: query head `h` reads key/value head `h / kv_group` ([`kv_head`]).
///
/// Grid: `(cdiv(sq, 128), heads, batch)`. Comptime: `d` (head dim, default 128), `causal`
/// (default false), `block_n` (keys per block, a multiple of 16; default 0: what fits sm_80's
/// registers best, 128 for `d <= 64`, else 64; the autotuner tries 64 and 128), `kv_group`.
#[kernel(num_warps = 4)]
pub fn attention<const d: usize = 128>(
    q: Tensor<bf16, 4>,
    k: Tensor<bf16, 4>,
    v: Tensor<bf16, 4>,
    o: TensorMut<bf16, 4>,
    scale: f32,
    #[comptime(default = false)] causal: bool,
    #[comptime(default = 0, tune = [64, 128])] block_n: usize,
    #[comptime(default = 1)] kv_group: usize,
) {
    let bn: usize = if block_n > 0 {
        block_n
    } else if d <= 64 {
        128
    } else {
        64
    };
    let (mb, h, b) = (block_id().x, block_id().y, block_id().z);
    let (sq, sk) = (q.dim(2), k.dim(2));
    let q0 = mb * BM;
    let qs = q.tile([BM, d], [b, h, q0, 0]).load();
    let qk_scale = scale * LOG2E;
    let mut acc = zeros::<f32>([BM, d]);
    let mut m = full::<f32>([BM], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([BM]);
    // Blocks wholly below `sk` need no bound mask; when causal, blocks whose last key every row
    // of this block may see need no causal mask either: key k0 + bn - 1 <= q0 + sk - sq.
    let all_blocks = cdiv(sk, bn);
    let (n_blocks, n_unmasked) = if causal {
        // The last row of this block sees keys up to (q0 + BM - 1) + sk - sq.
        let n_blocks = min(all_blocks, max(cdiv(q0 + BM + sk - sq, bn), 0));
        (n_blocks, min(sk / bn, max((q0 + 1 + sk - sq) / bn, 0)))
    } else {
        (all_blocks, sk / bn)
    };
    for j in pipelined(0..n_blocks, stages = 2) {
        let k0 = j * bn;
        let ks = k.tile([bn, d], [b, kv_head(h, kv_group), k0, 0]).load();
        let vs = v.tile([bn, d], [b, kv_head(h, kv_group), k0, 0]).load();
        let s = mma(&qs, &ks.t()) * qk_scale;
        // Uniform across the block: only the causal diagonal and the last key block pay for it.
        let s = if j >= n_unmasked {
            mask(s, q0, k0, sq, sk, bn, causal)
        } else {
            s
        };
        (acc, m, l) = online_update(s, vs, acc, m, l);
    }
    // Fully masked rows have l = 0 and acc = 0: scale by 1 so they output 0. One reciprocal
    // per row, then a product per element (not a division per element).
    let inv_l = recip(&select(l == 0.0, 1.0, l));
    o.tile([BM, d], [b, h, q0, 0])
        .store((acc * inv_l.col()).cast::<bf16>());
}

/// The key/value head query head `h` reads when `kv_group` query heads share one (grouped-
/// query attention; `kv_group = heads` is multi-query): `h / kv_group`. Resolved while
/// building, so `kv_group = 1` (every query head has its own) adds no instruction.
#[kernel_fn]
fn kv_head(h: Value, kv_group: usize) -> Value {
    if kv_group == 1 { h } else { h / kv_group }
}

/// The key block (`block_n`) to launch `attention` with for head dim `d` on `target`: 128 at
/// d = 128 on sm_90a, whose rotated wgmma schedule has the registers and shared memory for
/// it; otherwise 0, the kernel's own choice.
pub fn tuned_block_n(target: kiln::ir::Target, d: usize) -> usize {
    if target == kiln::ir::Target::Sm90a && d == 128 {
        128
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use kiln::ir::print::print_kernel;

    use super::attention;
    use crate::testing::{build, loop_stages};

    #[test]
    fn builds_for_documented_variants() {
        for d in ["64", "128"] {
            for causal in ["false", "true"] {
                let k = build(&attention, &[("d", d), ("causal", causal)]);
                let bn = if d == "64" { 128 } else { 64 };
                assert!(
                    print_kernel(&k).contains(&format!("rt<f32,128x{bn}>")),
                    "score tile 128x{bn}"
                );
                assert_eq!(loop_stages(&k), [Some(2)]);
            }
        }
    }
}
