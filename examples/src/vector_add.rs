//! `c = a + b` over f32 vectors of any length.

use kiln::prelude::*;

/// Adds two f32 vectors of equal length `n` into `c`; any `n` (the last tile's edge is masked
/// by the load and store).
///
/// Grid: `(cdiv(n, 1024), 1, 1)`.
#[kernel(grid = [1024, 1, 1])]
pub fn vector_add(a: Tensor<f32, 1>, b: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    const B: usize = 1024;
    let i = block_id().x;
    let x = a.tile([B], [i * B]).load();
    let y = b.tile([B], [i * B]).load();
    c.tile([B], [i * B]).store(x + y);
}

#[cfg(test)]
mod tests {
    use kiln::ir::{Axis, OpKind};

    use super::vector_add;
    use crate::testing::{build, top_level};

    #[test]
    fn builds_to_ir() {
        let k = build(&vector_add, ());
        let kinds = top_level(&k);
        let count = |f: fn(&OpKind) -> bool| kinds.iter().filter(|k| f(k)).count();
        assert_eq!(count(|k| matches!(k, OpKind::Load { .. })), 2);
        assert_eq!(count(|k| matches!(k, OpKind::Store { .. })), 1);
        assert!(count(|k| matches!(k, OpKind::BlockId(Axis::X))) > 0);
        assert_eq!(count(|k| matches!(k, OpKind::BlockId(Axis::Y))), 0);
    }
}
