// A comptime parameter is a field of the kernel's comptime struct: a misspelled (or renamed)
// one is a compile error where it is named, not a run-time one.
use kiln::prelude::*;

#[kernel(grid = [block, 1, 1])]
pub fn scale(x: Tensor<f32, 1>, y: TensorMut<f32, 1>, #[comptime(default = 64)] block: usize) {
    let i = block_id().x;
    y.tile([block], [i * block]).store(x.tile([block], [i * block]).load() * 2.0);
}

/// Comptime values several kernels share.
#[comptime]
pub struct Params {
    #[comptime(default = 128)]
    rows: usize,
    #[comptime(default = DType::F16)]
    dtype: DType,
}

#[kernel(grid = [row, 1, 1])]
pub fn copy(x: Tensor<dtyp, 1>, y: TensorMut<dtype, 1>, #[comptime] p: Params) {
    let i = block_id().x;
    y.tile([p.rows], [i * p.rows]).store(x.tile([p.rows], [i * p.rows]).load());
}

fn main() {
    let _ = ScaleComptime { blokc: 128 };
    let _ = Params { rows: 64, dtype: DType::Bf16, cols: 1 };
}
