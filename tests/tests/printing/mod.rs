//! A kernel that prints, for the in-kernel print tests: scalars (the block index and a
//! parameter) and single elements of register tiles of several layouts and dtypes.

use kiln::ir::{DType, HostTensor};
use kiln::prelude::*;

/// Rows of `x` each block reads.
pub const ROWS: usize = 64;
/// Columns of `x`.
pub const COLS: usize = 64;

/// Scales block `b`'s `[64, 64]` tile of `x` into `y` and prints what it saw.
#[kernel(num_warps = 4)]
pub fn print_probe(x: Tensor<f32, 2>, y: TensorMut<f32, 2>, scale: f32) {
    let b = block_id().x;
    let t = x.tile([ROWS, COLS], [b * ROWS, 0]).load();
    let s = t * scale;
    kprint!("block {} scale {} s[3, 5] = {}", b, scale, at(&s, [3, 5]));
    let m = row_max(&s);
    kprint!(
        "m[7] = {} ({}% of the rows), {{braces}}",
        at(&m, [7]),
        b + 100
    );
    let h = s.cast::<bf16>();
    // Comparisons are traced outside macros only.
    let positive = s > 0.0;
    kprint!(
        "bf16 h[63, 62] = {}, positive: {}",
        at(&h, [63, 62]),
        at(&positive, [63, 62])
    );
    y.tile([ROWS, COLS], [b * ROWS, 0]).store(s);
}

/// `x` for `blocks` blocks, element `(r, c)` = `r - c / 2`: every printed value is exact, so
/// its expected text is easy to write.
pub fn input(blocks: usize) -> HostTensor {
    HostTensor::from_fn(&[blocks * ROWS, COLS], DType::F32, |i| {
        (i / COLS) as f64 - (i % COLS) as f64 / 2.0
    })
}
