use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    let mut x = a.tile([128], [0]).load();
    let r = &mut x;
    c.tile([128], [0]).store(*r);
}

fn main() {}
