use kiln::prelude::*;

#[kernel(num_warps = WARPS)]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>, #[comptime(default = 4)] NW: usize) {
    c.tile([128], [0]).store(a.tile([128], [0]).load());
}

fn main() {}
