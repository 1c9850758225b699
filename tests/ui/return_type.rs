use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) -> Value {
    a.tile([128], [0]).load()
}

fn main() {}
