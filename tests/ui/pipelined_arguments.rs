use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    for i in pipelined(0..a.dim(0)) {
        c.tile([128], [i * 128]).store(a.tile([128], [i * 128]).load());
    }
}

fn main() {}
