use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    let mut x = a.tile([128], [0]).load();
    while true {
        x = x * 2.0;
    }
    c.tile([128], [0]).store(x);
}

fn main() {}
