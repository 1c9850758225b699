use kiln::prelude::*;

#[kernel]
pub fn k(a: Tensor<f32, 1>, #[comptime] name: &str, #[comptime(size = 4)] n: usize) {
    let _ = (a, name, n);
}

fn main() {}
