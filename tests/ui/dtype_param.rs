use kiln::prelude::*;

#[kernel]
pub fn k(
    a: Tensor<T, 1>,
    b: Tensor<n, 1>,
    c: TensorMut<U, 1>,
    d: TensorMut<V, 1>,
    #[comptime(default = DType::Bf16)] T: DType,
    #[comptime] U: DType,
    #[comptime(default = 4)] n: usize,
) {
    let _ = (a, b, c, d);
}

fn main() {}
