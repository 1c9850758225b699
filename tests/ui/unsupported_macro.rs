use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    let v = vec![1, 2];
    assert!(v.len() == 2);
    c.tile([128], [0]).store(a.tile([128], [0]).load());
}

fn main() {}
