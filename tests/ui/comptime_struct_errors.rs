use kiln::prelude::*;

#[comptime(size = 4)]
#[derive(Debug)]
pub struct Bad {
    #[comptime(default = 1.0)]
    scale: f64,
    #[comptime(sise = 2)]
    n: usize,
}

#[comptime]
pub struct Tuple(usize);

#[comptime]
pub struct Good {
    #[comptime(default = 1)]
    n: usize,
}

#[kernel(grid = [m, 1, 1])]
pub fn mixed(
    a: Tensor<f32, 1>,
    #[comptime(default = 1)] p: Good,
    #[comptime] q: Good,
    #[comptime(default = 2)] n: usize,
) {
    let _ = (a, p, q, n);
}

#[kernel(grid = [bn, 1, 1])]
pub fn tiled(a: Tensor<f32, 1>, #[comptime(default = 4)] bm: usize) {
    let _ = (a, bm);
}

fn main() {}
