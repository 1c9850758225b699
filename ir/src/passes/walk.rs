//! Traversals shared by the passes: ops in program order and use lists.

use std::collections::BTreeMap;

use crate::kernel::{Block, Kernel, OpId, ValueId};

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
        crate::kernel::ValueDef::Op(op, _) => (op, true),
        crate::kernel::ValueDef::BlockArg { op, .. } => (op, false),
    }
}
