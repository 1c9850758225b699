use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 7>, c: TensorMut<f32, 0>) {
    let _ = (a, c);
}

fn main() {}
