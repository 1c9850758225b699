use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, data: Vec<f32>) {
    let _ = a;
}

fn main() {}
