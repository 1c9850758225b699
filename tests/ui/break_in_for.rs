use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    let n = a.dim(0);
    for i in 0..n {
        if i > 4 {
            break;
        }
    }
}

fn main() {}
