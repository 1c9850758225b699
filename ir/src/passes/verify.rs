//! The `verify` pass: re-checks every op's operand and result types with the typing rules the
//! builder used ([`crate::infer::result_types`]).
//!
//! Placeholder until `kiln_ir::verify` (dominance, regions, spans) is merged; then this
//! pass calls it instead. It rewrites nothing.

use crate::diag::Diagnostic;
use crate::infer::result_types;
use crate::kernel::{Kernel, OpKind};
use crate::target::Target;

use super::walk::ops_in_order;

/// Checks the kernel; the first mismatch is reported at its op.
pub fn run(kernel: &mut Kernel, _target: Target) -> Result<(), Diagnostic> {
    for id in ops_in_order(kernel) {
        let op = &kernel.ops[id];
        if matches!(op.kind, OpKind::For { .. } | OpKind::If | OpKind::Yield) {
            continue;
        }
        let tys: Vec<_> = op.operands.iter().map(|&v| kernel.ty(v).clone()).collect();
        let hint = op.results.first().map(|&r| kernel.ty(r).clone());
        let want = result_types(&op.kind, &tys, &kernel.params, hint.as_ref())
            .map_err(|e| Diagnostic::internal(op.loc, format!("{id}: {e}")))?;
        let got: Vec<_> = op.results.iter().map(|&r| kernel.ty(r).clone()).collect();
        if want != got {
            return Err(Diagnostic::internal(
                op.loc,
                format!("{id} defines {got:?}, its operands give {want:?}"),
            ));
        }
    }
    Ok(())
}
