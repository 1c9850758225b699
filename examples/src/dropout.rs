//! Fused dropout: `y = u(seed, e) > p ? x / (1 - p) : 0` over a vector of any length and float
//! dtype. Element `e`'s uniform `u(seed, e)` is word `e % 4` of Philox4x32-10 of counter `e / 4`
//! (`rand4x`, Triton's `tl.rand4x`): one Philox call serves four elements, and the mask depends
//! only on `(seed, e)`, never on `BLOCK` or the grid, so a backward pass regenerates it instead
//! of storing it.

use kiln::prelude::*;

/// Keeps each element of `x` with probability `1 - p`, scaled by `1 / (1 - p)`, into `y`;
/// element `e`'s fate is `rand4x(seed, e / 4)[e % 4] > p`. `x` and `y` hold `dtype` (f32,
/// bf16 or f16), the arithmetic is f32. Any `n` (the last tile is masked by the load and the
/// store), `0 <= p < 1`; `BLOCK` a multiple of one 16-byte vector (4 f32, 8 bf16 or f16).
///
/// Grid: `(cdiv(n, BLOCK), 1, 1)`.
#[kernel(grid = [BLOCK, 1, 1])]
pub fn dropout(
    x: Tensor<dtype, 1>,
    y: TensorMut<dtype, 1>,
    p: f32,
    seed: u32,
    #[comptime(default = 1024)] BLOCK: usize,
    #[comptime(default = DType::F32)] dtype: DType,
) {
    if !dtype.is_float() {
        reject("dropout: dtype must be f32, bf16 or f16");
    }
    // The block as rows of one 16-byte vector, `w` elements: the tile's first 2-D value is x
    // in those rows, so the 2-D tiles take the load's distribution (a thread's vector is its
    // row) and neither reshape moves an element between threads.
    let w = 16 / dtype.size_bytes();
    if !BLOCK.is_multiple_of(w) {
        reject("dropout: BLOCK must be a multiple of one 16-byte vector (4 f32, 8 bf16 or f16)");
    }
    let rows = BLOCK / w;
    let start = block_id().x * BLOCK;
    let v = x
        .tile([BLOCK], [start])
        .load()
        .reshape([rows, w])
        .cast::<f32>();
    // Row `i` holds elements `start + w * i + j`: counter `start / 4 + (w / 4) * i + j / 4`,
    // word `j % 4`.
    let counter = iota([rows, 1], 0) * (w / 4) + block_id().x * (BLOCK / 4);
    let mut words = Vec::new();
    for c in unroll(0..w / 4) {
        words.extend(rand4x(seed, counter + c));
    }
    let col = iota([rows, w], 1);
    let mut u = words[w - 1];
    for j in unroll((0..w - 1).rev()) {
        u = select(col == j, words[j], u);
    }
    let scale = 1.0 / (1.0 - p);
    let kept = select(u > p, v * scale, 0.0);
    y.tile([BLOCK], [start])
        .store(kept.cast_to(dtype).reshape([BLOCK]));
}
