use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    let double = |v: Value| v * 2.0;
    c.tile([128], [0]).store(double(a.tile([128], [0]).load()));
}

fn main() {}
