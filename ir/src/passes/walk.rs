//! Traversals and lookups shared by the passes: ops in program order, use lists, definitions,
//! whether every tensor is 16-byte aligned, and where a ring-wide error is reported.

use std::collections::BTreeMap;

use crate::kernel::{Block, Kernel, Loc, OpId, Param, ValueDef, ValueId};
use crate::ring::Ring;

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

/// Where an error about the stage rings as a whole is reported: the first ring's `for`, or
/// the default location when there is no ring.
pub fn first_ring_loc(kernel: &Kernel, rings: &BTreeMap<OpId, Ring>) -> Loc {
    rings
        .keys()
        .next()
        .map(|&f| kernel.ops[f].loc)
        .unwrap_or_default()
}

/// Whether every tensor parameter is `aligned16` (so TMA may load it on sm_90a).
pub fn all_aligned16(kernel: &Kernel) -> bool {
    kernel.params.iter().all(|p| match p {
        Param::Tensor { aligned16, .. } => *aligned16,
        Param::Scalar { .. } => true,
    })
}
