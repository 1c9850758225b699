// A `#[comptime]` parameter of a type that is neither a comptime value nor a comptime struct.
use kiln::prelude::*;

#[kernel]
pub fn named(a: Tensor<f32, 1>, #[comptime] name: String) {
    let _ = (a, name);
}

fn main() {}
