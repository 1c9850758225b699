//! Rotary position embedding (RoPE) of the GPT-NeoX ("rotate half") form, FlashAttention's
//! `apply_rotary_emb` with `interleaved = False`: for `x: [batch, seqlen, heads, D]` and
//! tables `cos, sin: [seqlen_ro, R / 2]` (`R` the rotary dim, at most `D`), position `t`
//! rotates the pairs `(x[i], x[i + R/2])` for `i < R/2` by the angle of row `t + offset`:
//! `y[i] = x[i] cos - x[i + R/2] sin`, `y[i + R/2] = x[i + R/2] cos + x[i] sin`; dimensions
//! from `R` on are copied.

use kiln::prelude::*;

/// `y = rope(x)` (see the module doc) for `x`, `y` of element type `dtype`, `cos`, `sin` of
/// element type `dtype` too. Each block rotates `BH` heads of one token of one sequence;
/// `offset` shifts the positions (decoding a continuation). Grid:
/// `(seqlen, batch, cdiv(heads, BH))`. `NW` warps per block (default 2): at 8 heads of 128,
/// each thread then holds 8 elements of each half, one 16-byte vector in bf16 (4 warps
/// held 4, 8-byte vectors, and half the bytes in flight).
#[kernel(num_warps = NW, grid = [1, 1, BH])]
#[allow(clippy::too_many_arguments)]
pub fn rotary(
    x: Tensor<dtype, 4>,
    cos: Tensor<dtype, 2>,
    sin: Tensor<dtype, 2>,
    y: TensorMut<dtype, 4>,
    offset: i32,
    #[comptime(default = 128)] D: usize,
    #[comptime(default = 128)] R: usize,
    #[comptime(default = 8)] BH: usize,
    #[comptime(default = 2)] NW: usize,
    #[comptime(default = DType::Bf16)] dtype: DType,
) {
    let t = block_id().x;
    let b = block_id().y;
    let h0 = block_id().z * BH;
    let half = R / 2;
    let pos = t + offset;
    let c = cos.tile([half], [pos, 0]).load().cast::<f32>().row();
    let s = sin.tile([half], [pos, 0]).load().cast::<f32>().row();
    let x1 = x.tile([BH, half], [b, t, h0, 0]).load().cast::<f32>();
    let x2 = x.tile([BH, half], [b, t, h0, half]).load().cast::<f32>();
    y.tile([BH, half], [b, t, h0, 0])
        .store((x1 * c - x2 * s).cast_to(dtype));
    y.tile([BH, half], [b, t, h0, half])
        .store((x2 * c + x1 * s).cast_to(dtype));
    if R < D {
        let rest = x.tile([BH, D - R], [b, t, h0, R]).load();
        y.tile([BH, D - R], [b, t, h0, R]).store(rest);
    }
}
