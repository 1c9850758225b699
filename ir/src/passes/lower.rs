//! The `lower` pass: target-specific lowering plans.
//!
//! sm_80: for every `for` with `stages = Some(n)`, records in `kernel.schedule.loops` which
//! loads of its body (those staged in shared memory, with coordinates computed from the
//! induction variable and values defined before the loop) the writer issues `n - 1`
//! iterations ahead as cp.async groups. sm_90a: the same, except for loops the `pipeline`
//! pass scheduled as TMA rings; a kernel whose `mma`s are not all in rings is reported as not
//! implemented unless a tensor is not 16-byte aligned (then the sm_80 lowering is the
//! documented fallback). sm_100a: the same as sm_90a (its rings' mmas become tcgen05.mma,
//! planned by the `tmem` pass).
//! Rewrites no op.

use std::collections::BTreeSet;

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, ValueId};
use crate::schedule::LoopPlan;
use crate::target::Target;

use super::walk::{defining_op, ops_in_order};

/// Records pipelining plans for sm_80; fails for targets without a backend.
pub fn run(kernel: &mut Kernel, target: Target) -> Result<(), Diagnostic> {
    match target {
        Target::Sm80 => {}
        Target::Sm90a | Target::Sm100a => super::pipeline::check_covered(kernel, target)?,
    }
    // The `persistent` pass clusters the rings that can be; a request it did not meet (no
    // ring, or a target without the pass) is reported here.
    let clustered = kernel.schedule.rings.values().any(|r| r.cluster.is_some());
    if kernel.options.cluster > 1 && !clustered {
        return Err(Diagnostic::new(
            kernel.options.cluster_loc,
            format!(
                "this kernel cannot run in clusters of {} on {target}: only a persistent \
                 sm_90a or sm_100a GEMM-shaped TMA ring is clustered",
                kernel.options.cluster
            ),
        )
        .note("ask for `cluster(1)`, or leave clusters to the autotuner, which skips this"));
    }
    let mut loops = std::collections::BTreeMap::new();
    for id in ops_in_order(kernel) {
        let OpKind::For { stages: Some(n) } = kernel.ops[id].kind else {
            continue;
        };
        if kernel.schedule.rings.contains_key(&id) {
            continue;
        }
        if n < 2 {
            continue;
        }
        let body = &kernel.ops[id].regions[0];
        let inside: BTreeSet<OpId> = body.ops.iter().copied().collect();
        let prefetched: Vec<OpId> = body
            .ops
            .iter()
            .copied()
            .filter(|&l| {
                matches!(kernel.ops[l].kind, OpKind::Load { .. })
                    && kernel.schedule.buffer(l).is_some()
                    && kernel.ops[l]
                        .operands
                        .iter()
                        .all(|&c| hoistable(kernel, c, id, &inside))
            })
            .collect();
        if !prefetched.is_empty() {
            loops.insert(
                id,
                LoopPlan {
                    stages: n,
                    prefetched,
                },
            );
        }
    }
    kernel.schedule.loops = loops;
    Ok(())
}

/// Whether scalar `v` can be recomputed for a later iteration: it is the loop's induction
/// variable, defined outside the loop, or a pure scalar op of such values.
pub(super) fn hoistable(
    kernel: &Kernel,
    v: ValueId,
    for_op: OpId,
    inside: &BTreeSet<OpId>,
) -> bool {
    let (def, is_result) = defining_op(kernel, v);
    if !is_result {
        return def != for_op || kernel.ops[for_op].regions[0].args.first() == Some(&v);
    }
    if !inside.contains(&def) {
        return true;
    }
    let op = &kernel.ops[def];
    let pure = matches!(
        op.kind,
        OpKind::Const(_)
            | OpKind::ScalarParam(_)
            | OpKind::BlockId(_)
            | OpKind::GridDim(_)
            | OpKind::TensorDim { .. }
            | OpKind::Binary(_)
            | OpKind::Unary(_)
            | OpKind::Select
            | OpKind::Cast { .. }
    );
    pure && kernel.ty(v).shape().is_none()
        && op
            .operands
            .iter()
            .all(|&o| hoistable(kernel, o, for_op, inside))
}
