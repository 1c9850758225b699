//! A second kernel of attention's shape, written in the DSL for the tests: attention with a
//! logit soft-cap (scores `cap * tanh(s / cap)`, as in Gemma 2), masked past `sk` in every key
//! block. Nothing in the compiler knows it; the `overlap` pass must find its schedule (head
//! mma, register code, tail mma into the carried accumulator) by structure.

use kiln::ir::dsl::Spec;
use kiln::prelude::*;

/// Query rows per block.
const BM: usize = 128;
/// Keys per block.
const BN: usize = 64;
/// `log2(e)`: the softmax runs in base 2.
const LOG2E: f32 = std::f32::consts::LOG2_E;

/// `o = softmax(cap * tanh(q k^T * scale / cap)) v` over `q: [batch, heads, sq, d]` and
/// `k, v: [batch, heads, sk, d]`, `sk >= 1`. Grid: `(cdiv(sq, 128), heads, batch)`.
#[kernel(num_warps = 4)]
pub fn softcap_attention<const d: usize = 128>(
    q: Tensor<bf16, 4>,
    k: Tensor<bf16, 4>,
    v: Tensor<bf16, 4>,
    o: TensorMut<bf16, 4>,
    scale: f32,
    cap: f32,
) {
    let (mb, h, b) = (block_id().x, block_id().y, block_id().z);
    let sk = k.dim(2);
    let q0 = mb * BM;
    let qs = q.tile([BM, d], [b, h, q0, 0]).load();
    let mut acc = zeros::<f32>([BM, d]);
    let mut m = full::<f32>([BM], f32::NEG_INFINITY);
    let mut l = zeros::<f32>([BM]);
    for j in pipelined(0..cdiv(sk, BN), stages = 2) {
        let k0 = j * BN;
        let ks = k.tile([BN, d], [b, h, k0, 0]).load();
        let vs = v.tile([BN, d], [b, h, k0, 0]).load();
        // tanh(y) = 1 - 2 / (e^(2y) + 1); the capped score is kept in base 2 (times log2 e).
        let y = mma(&qs, &ks.t()) * (scale / cap);
        let capped = (1.0 - 2.0 / (exp2(&(y * (2.0 * LOG2E))) + 1.0)) * (cap * LOG2E);
        let s = select((iota([BM, BN], 1) + k0) < sk, capped, f32::NEG_INFINITY);
        let m_new = max(&m, &row_max(&s));
        let p = exp2(&(s - m_new.col()));
        let alpha = exp2(&(m - m_new));
        l = l * alpha + row_sum(&p);
        acc = acc * alpha.col() + mma(&p.cast::<bf16>(), &vs);
        m = m_new;
    }
    o.tile([BM, d], [b, h, q0, 0])
        .store((acc / l.col()).cast::<bf16>());
}

/// The specialisation for head dim `d` with every tensor 16-byte aligned (the TMA path).
pub fn spec(d: usize) -> Spec<SoftcapAttentionComptime> {
    Spec::uniform(
        SoftcapAttentionComptime { d },
        softcap_attention.signature(),
        true,
    )
}
