use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    struct P {
        x: usize,
    }
    let p = P { x: 128 };
    c.tile([128], [p.x]).store(a.tile([128], [0]).load());
}

fn main() {}
