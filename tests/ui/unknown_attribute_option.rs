use kiln::prelude::*;

#[kernel(num_threads = 128)]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    c.tile([128], [0]).store(a.tile([128], [0]).load());
}

fn main() {}
