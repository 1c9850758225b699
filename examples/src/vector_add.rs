//! `c = a + b` over f32 vectors of any length.

use kiln::prelude::*;

/// Adds two f32 vectors of equal length `n` into `c`; any `n` (the last tile's edge is masked
/// by the load and store).
///
/// Grid: `(cdiv(n, 1024), 1, 1)`.
#[kernel]
pub fn vector_add(a: Tensor<f32, 1>, b: Tensor<f32, 1>, c: TensorMut<f32, 1>) {
    const B: usize = 1024;
    let i = block_id().x;
    let x = a.tile([B], [i * B]).load();
    let y = b.tile([B], [i * B]).load();
    c.tile([B], [i * B]).store(x + y);
}

#[cfg(test)]
mod tests {
    use kiln::ir::dsl::{KernelDef, Spec};
    use kiln::ir::{OpKind, print::print_kernel};

    use super::vector_add;

    #[test]
    fn builds_to_ir() {
        let k = vector_add
            .build(&Spec::default())
            .unwrap_or_else(|d| panic!("{d}"));
        let text = print_kernel(&k);
        println!("{text}");
        let kinds: Vec<&OpKind> = k.body.ops.iter().map(|&o| &k.ops[o].kind).collect();
        assert_eq!(
            kinds
                .iter()
                .filter(|k| matches!(k, OpKind::Load { .. }))
                .count(),
            2
        );
        assert_eq!(
            kinds
                .iter()
                .filter(|k| matches!(k, OpKind::Store { .. }))
                .count(),
            1
        );
        assert!(
            kinds
                .iter()
                .any(|k| matches!(k, OpKind::BlockId(kiln::ir::Axis::X)))
        );
        assert!(
            !kinds
                .iter()
                .any(|k| matches!(k, OpKind::BlockId(kiln::ir::Axis::Y)))
        );
    }
}
