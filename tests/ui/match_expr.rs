use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    let x = a.tile([128], [0]).load();
    let y = match 3 {
        3 => x,
        _ => x * 2.0,
    };
    c.tile([128], [0]).store(y);
}

fn main() {}
