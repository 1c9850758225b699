use kiln::prelude::*;

#[kernel]
pub fn k(
    a: Tensor<f32, 1>,
    #[comptime(default = 64, tune = 64)] n: usize,
    #[comptime(default = 1, tune = [])] m: usize,
) {
    let _ = (a, n, m);
}

fn main() {}
