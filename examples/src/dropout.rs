//! Fused dropout: `y = rand(seed, i) > p ? x / (1 - p) : 0` over an f32 vector of any length,
//! with Philox4x32-10 random numbers drawn per element index (Triton's `tl.rand`), so the
//! mask depends only on `(seed, i)`: a backward pass regenerates it instead of storing it.

use kiln::prelude::*;

/// Keeps each element of `x` with probability `1 - p`, scaled by `1 / (1 - p)`, into `y`;
/// element `i`'s fate is `rand(seed, i) > p`. Any `n` (the last tile is masked by the load
/// and the store), `0 <= p < 1`.
///
/// Grid: `(cdiv(n, BLOCK), 1, 1)`.
#[kernel(grid = [BLOCK, 1, 1])]
pub fn dropout(
    x: Tensor<f32, 1>,
    y: TensorMut<f32, 1>,
    p: f32,
    seed: u32,
    #[comptime(default = 1024)] BLOCK: usize,
) {
    let start = block_id().x * BLOCK;
    let offsets = iota([BLOCK], 0) + start;
    let v = x.tile([BLOCK], [start]).load();
    let r = rand(seed, offsets);
    let scale = 1.0 / (1.0 - p);
    y.tile([BLOCK], [start])
        .store(select(r > p, v * scale, 0.0));
}
