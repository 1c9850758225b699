//! The `canonicalize` pass: folds `add(c, mma(a, b))`, where the mma result has no other use
//! and `c` has the result's type, into `mma(a, b, c)`, so the tensor cores update the
//! accumulator in place. In: verified IR. Out: verified IR with no such `add` and no dead pure
//! op (the steps: [`run`]).

use crate::diag::Diagnostic;
use crate::kernel::{BinaryOp, Kernel, OpId, OpKind};
use crate::target::Target;

use super::edit;
use super::walk::{defining_op, ops_in_order, uses};

/// Applies the fold everywhere. First, loads and stores of tiles of rank 3 and more become
/// the addressed accesses of the same elements (`passes::tiles_nd`). Each folded `add` op
/// becomes the `mma` (its result, and so every use, is kept) and the old `mma` op is unlinked
/// from its block; then ops without side effects whose results are never read are unlinked,
/// repeatedly, so no later pass or writer sees dead tiles.
pub fn run(kernel: &mut Kernel, _target: Target) -> Result<(), Diagnostic> {
    super::tiles_nd::run(kernel);
    let uses = uses(kernel);
    let mut dead: Vec<OpId> = Vec::new();
    for id in ops_in_order(kernel) {
        if kernel.ops[id].kind != OpKind::Binary(BinaryOp::Add) {
            continue;
        }
        let operands = kernel.ops[id].operands.clone();
        for (i, &m) in operands.iter().enumerate() {
            let (mop, is_result) = defining_op(kernel, m);
            let other = operands[1 - i];
            let fusable = is_result
                && kernel.ops[mop].kind == OpKind::Mma
                && kernel.ops[mop].operands.len() == 2
                && uses.get(&m).is_some_and(|u| u.len() == 1)
                && kernel.ty(other) == kernel.ty(m)
                && !dead.contains(&mop);
            if fusable {
                let mut ops = kernel.ops[mop].operands.clone();
                ops.push(other);
                kernel.ops[id].kind = OpKind::Mma;
                kernel.ops[id].operands = ops;
                dead.push(mop);
                break;
            }
        }
    }
    edit::unlink(kernel, &dead);
    edit::drop_dead(kernel);
    Ok(())
}
