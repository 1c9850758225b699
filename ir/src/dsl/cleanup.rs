//! Removes the grid queries the frontend emits but the kernel never reads.
//!
//! `block_id()` and `grid_dim()` return all three axes at once (so `block_id().x` reads like
//! CUDA), which emits three ops per call; the unused ones are deleted after tracing so that
//! IR dumps show only what the kernel uses. Nothing else is removed: dead user code stays
//! visible in dumps.

use std::collections::HashSet;

use crate::kernel::{Block, Kernel, OpKind, ValueId};

/// Deletes `block_id`/`grid_dim` ops whose result no op reads.
pub(crate) fn remove_unused_grid_queries(kernel: &mut Kernel) {
    let mut used = HashSet::new();
    collect_uses(kernel, &kernel.body, &mut used);
    let mut body = std::mem::take(&mut kernel.body);
    prune(kernel, &mut body, &used);
    kernel.body = body;
}

fn collect_uses(kernel: &Kernel, block: &Block, used: &mut HashSet<ValueId>) {
    for &op in &block.ops {
        used.extend(kernel.ops[op].operands.iter().copied());
        for region in &kernel.ops[op].regions {
            collect_uses(kernel, region, used);
        }
    }
}

fn prune(kernel: &mut Kernel, block: &mut Block, used: &HashSet<ValueId>) {
    block.ops.retain(|&op| {
        let o = &kernel.ops[op];
        let query = matches!(o.kind, OpKind::BlockId(_) | OpKind::GridDim(_));
        !query || o.results.iter().any(|r| used.contains(r))
    });
    for &op in &block.ops {
        let mut regions = std::mem::take(&mut kernel.ops[op].regions);
        for region in &mut regions {
            prune(kernel, region, used);
        }
        kernel.ops[op].regions = regions;
    }
}
