//! The `verify` pass: runs [`crate::verify::verify`] (types, shapes, dominance, regions) so
//! every later pass may assume a well-formed kernel. It rewrites nothing.

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, Loc};
use crate::target::Target;

/// Checks the kernel; the first broken invariant becomes an internal diagnostic at its op,
/// with the annotated listing as a note.
pub fn run(kernel: &mut Kernel, _target: Target) -> Result<(), Diagnostic> {
    crate::verify::verify(kernel).map_err(|errs| {
        let first = errs.errors.first();
        let loc = first
            .filter(|e| e.op.index() < kernel.ops.len())
            .map_or(Loc::default(), |e| kernel.ops[e.op].loc);
        // The headline names the user's op; the IR listing is for a bug report.
        let what = first.map_or("the verifier failed".to_string(), |e| {
            format!("{}: {}", crate::diag::op_words(kernel, e.op), e.message)
        });
        Diagnostic::internal(loc, what).note(format!("the kernel's IR, for a bug report:\n{errs}"))
    })
}
