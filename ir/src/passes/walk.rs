//! Traversals and lookups shared by the passes: ops in program order, use lists, definitions,
//! whether every tensor is 16-byte aligned, which scalars a later iteration can recompute, and
//! where a schedule-wide error is reported.

use std::collections::{BTreeMap, BTreeSet};

use crate::kernel::{Block, Kernel, Loc, OpId, OpKind, Param, ValueDef, ValueId};

/// Every op reachable from the body, in program order (an op before its regions' ops).
pub fn ops_in_order(kernel: &Kernel) -> Vec<OpId> {
    let mut out = Vec::new();
    push_block(kernel, &kernel.body, &mut out);
    out
}

/// Every op of `block` and its regions, in program order.
pub fn ops_in_block(kernel: &Kernel, block: &Block) -> Vec<OpId> {
    let mut out = Vec::new();
    push_block(kernel, block, &mut out);
    out
}

/// The `mma` ops directly in `block`, in order.
pub fn mmas(kernel: &Kernel, block: &Block) -> Vec<OpId> {
    let is_mma = |o: &OpId| kernel.ops[*o].kind == OpKind::Mma;
    block.ops.iter().copied().filter(is_mma).collect()
}

/// Every op inside the regions of `op` (not `op` itself), in program order.
pub fn ops_in_block_regions(kernel: &Kernel, op: OpId) -> Vec<OpId> {
    let mut out = Vec::new();
    for region in &kernel.ops[op].regions {
        push_block(kernel, region, &mut out);
    }
    out
}

fn push_block(kernel: &Kernel, block: &Block, out: &mut Vec<OpId>) {
    for &op in &block.ops {
        out.push(op);
        for region in &kernel.ops[op].regions {
            push_block(kernel, region, out);
        }
    }
}

/// For every value, the ops reading it, in program order.
pub fn uses(kernel: &Kernel) -> BTreeMap<ValueId, Vec<OpId>> {
    let mut out: BTreeMap<ValueId, Vec<OpId>> = BTreeMap::new();
    for op in ops_in_order(kernel) {
        for &v in &kernel.ops[op].operands {
            out.entry(v).or_default().push(op);
        }
    }
    out
}

/// The op defining `v` (the owning op for a block argument) and whether it is its result.
pub fn defining_op(kernel: &Kernel, v: ValueId) -> (OpId, bool) {
    match kernel.values[v].def {
        ValueDef::Op(op, _) => (op, true),
        ValueDef::BlockArg { op, .. } => (op, false),
    }
}

/// Where an error about the schedule as a whole is reported: its loop's `for`, or the
/// default location when there is no schedule.
pub fn sched_loc(kernel: &Kernel) -> Loc {
    kernel
        .schedule
        .sched
        .as_ref()
        .map(|s| kernel.ops[s.for_op].loc)
        .unwrap_or_default()
}

/// Whether every tensor parameter is `aligned16` (so TMA may load it on sm_90a).
pub fn all_aligned16(kernel: &Kernel) -> bool {
    kernel.params.iter().all(|p| match p {
        Param::Tensor { aligned16, .. } => *aligned16,
        Param::Scalar { .. } => true,
    })
}

/// Whether scalar `v` can be recomputed for a later iteration: it is the loop's induction
/// variable, defined outside the loop, or a pure scalar op of such values.
pub fn hoistable(kernel: &Kernel, v: ValueId, for_op: OpId, inside: &BTreeSet<OpId>) -> bool {
    let (def, is_result) = defining_op(kernel, v);
    if !is_result {
        return def != for_op || kernel.ops[for_op].regions[0].args.first() == Some(&v);
    }
    if !inside.contains(&def) {
        return true;
    }
    let op = &kernel.ops[def];
    // Splat and iota make tiles, which the scalar test below leaves out.
    let pure = op.kind.is_scalar_source() || op.kind.is_elementwise();
    pure && kernel.ty(v).shape().is_none()
        && op
            .operands
            .iter()
            .all(|&o| hoistable(kernel, o, for_op, inside))
}
