//! The `prefetch` pass: software-pipelines the register loads of a `pipelined(.., stages =
//! n)` loop that holds no `mma`, the loops the shared-memory rings of mma operands
//! (`memory_plan`, `pipeline`, sm_80's `cp.async` plan) do not take. Each iteration issues the
//! copies of the iteration `n - 1` ahead into a ring of `n` stages in shared memory, each
//! thread copying the elements of its own registers ([`crate::schedule::ThreadSlab`]), and
//! reads its own stage back when the body reaches the load: a block has loads in flight while
//! it computes on, and reduces, the tile it holds (an online softmax over a vocabulary's
//! columns waits on each tile's row maximum before its exponentials), and no register holds a
//! tile ahead. A thread reads only what it copied, so the ring needs no barrier.
//!
//! In: verified IR after `strip_mine`. Out: the same ops; for each such loop a
//! [`LoopPlan`] naming the loads at the top of its body whose coordinates are computed from
//! the induction variable and values from outside the loop alone (and depend on the
//! induction variable: a tile read again each iteration stays). `memory_plan` places their
//! rings; the backend issues the first `n - 1` iterations' copies before the loop. A copy past
//! the loop's last iteration is bounded by the tensor as any load is, and its tile unused.
//!
//! A loop that writes the tensor a load reads keeps that load where it is; one that holds an
//! atomic (whose ordering a moved load could break) keeps all of them. Distinct tensor
//! arguments do not overlap (`docs/dsl.md`, as the read-only loads of a `Tensor` assume).

use std::collections::{BTreeMap, BTreeSet};

use crate::diag::Diagnostic;
use crate::kernel::{Kernel, OpId, OpKind, ValueDef, ValueId};
use crate::schedule::LoopPlan;
use crate::target::Target;

use super::walk::{ops_in_block_regions, ops_in_order};

/// Records the plan of every loop the module describes.
pub fn run(kernel: &mut Kernel, _target: Target) -> Result<(), Diagnostic> {
    for f in ops_in_order(kernel) {
        if let Some(plan) = plan(kernel, f) {
            kernel.schedule.loops.insert(f, plan);
        }
    }
    Ok(())
}

/// The loads loop `f` can prefetch (see the module), if it is such a loop and has any.
fn plan(kernel: &Kernel, f: OpId) -> Option<LoopPlan> {
    let OpKind::For {
        stages: Some(stages),
    } = kernel.ops[f].kind
    else {
        return None;
    };
    if stages < 2 {
        return None;
    }
    let inside: BTreeSet<OpId> = ops_in_block_regions(kernel, f).into_iter().collect();
    let mut written = BTreeSet::new();
    for &o in &inside {
        match kernel.ops[o].kind {
            OpKind::Mma | OpKind::Atomic { .. } | OpKind::ScalarAtomic { .. } => return None,
            OpKind::Store { tensor, .. } | OpKind::Scatter { tensor, .. } => {
                written.insert(tensor);
            }
            _ => {}
        }
    }
    let body = kernel.ops[f].regions.first()?;
    let top: BTreeSet<OpId> = body.ops.iter().copied().collect();
    let iv = *body.args.first()?;
    let prefetched: Vec<OpId> = body
        .ops
        .iter()
        .copied()
        .filter(|&o| match kernel.ops[o].kind {
            OpKind::Load { tensor, .. } if !written.contains(&tensor) => {
                // A load that reads the same tile every iteration (no coordinate from the
                // induction variable) gains nothing from being read ahead but the
                // shared memory it would take.
                let mut cone = BTreeMap::new();
                let mut moves = Some(false);
                for &v in &kernel.ops[o].operands {
                    moves = moves.and_then(|m| {
                        coordinate(kernel, v, (f, iv), (&top, &inside), &mut cone).map(|d| m | d)
                    });
                }
                moves == Some(true)
            }
            _ => false,
        })
        .collect();
    (!prefetched.is_empty()).then_some(LoopPlan { stages, prefetched })
}

/// Whether scalar `v` is computed from loop `f`'s induction variable `iv` and values from
/// outside the loop alone, by ops at the top of its body (`top`; `inside` all of its ops)
/// that read no memory (those ops join `cone`): `Some(true)` when it depends on `iv`,
/// `Some(false)` when on neither, `None` when on anything else.
fn coordinate(
    kernel: &Kernel,
    v: ValueId,
    (f, iv): (OpId, ValueId),
    (top, inside): (&BTreeSet<OpId>, &BTreeSet<OpId>),
    cone: &mut BTreeMap<OpId, bool>,
) -> Option<bool> {
    if v == iv {
        return Some(true);
    }
    match kernel.values[v].def {
        ValueDef::BlockArg { op, .. } => (op != f && !inside.contains(&op)).then_some(false),
        ValueDef::Op(o, _) if !inside.contains(&o) => Some(false),
        ValueDef::Op(o, _) => {
            if let Some(&d) = cone.get(&o) {
                return Some(d);
            }
            let kind = &kernel.ops[o].kind;
            let computes = kind.is_elementwise()
                || matches!(
                    kind,
                    OpKind::Const(_)
                        | OpKind::ScalarParam(_)
                        | OpKind::BlockId(_)
                        | OpKind::GridDim(_)
                        | OpKind::TensorDim { .. }
                );
            if !top.contains(&o) || !computes {
                return None;
            }
            let mut depends = false;
            for &x in &kernel.ops[o].operands {
                depends |= coordinate(kernel, x, (f, iv), (top, inside), cone)?;
            }
            cone.insert(o, depends);
            Some(depends)
        }
    }
}
