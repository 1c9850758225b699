use kiln::prelude::*;

#[kernel_fn(inline)]
fn helper(x: Value) -> Value {
    let mut y = x;
    loop {
        y = y * 2.0;
    }
}

fn main() {}
