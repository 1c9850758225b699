use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<u8, 1>, c: TensorMut<f64, 1>) {
    let _ = (a, c);
}

fn main() {}
