use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    const B: usize = 128;
    let shape = [B];
    let x = a.tile::<B>([B], [0]).load();
    let y = a.tile(shape, [0]).load();
    let z = zeros::<f32>([B; 1]);
    c.tile([B], [0]).store(x + y + z);
}

fn main() {}
