use kiln::prelude::*;

// Every error is reported in one compile, each at its own token.
#[kernel(num_warps = 4, grid = 3)]
pub fn k<T>(a: Tensor<f32, 9>, c: TensorMut<f32, 1>) {
    let mut x = a.tile([128], [0]).load();
    while x.is_poison() {
        x = x + 1.0;
    }
    let y = match 1 {
        _ => x,
    };
    c.tile([128], [0]).store(y);
}

fn main() {}
