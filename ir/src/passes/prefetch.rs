//! The `prefetch` pass: software-pipelines the register loads of a `pipelined(.., stages =
//! n)` loop that holds no `mma`, the loops the shared-memory rings (`memory_plan`, `pipeline`,
//! sm_80's `cp.async` plan) do not take. Each iteration issues the loads of the iteration
//! `n - 1` ahead and carries their tiles around the loop, so a block has loads in flight
//! while it computes on, and reduces, the tile it holds (an online softmax over a
//! vocabulary's columns waits on each tile's row maximum before its exponentials).
//!
//! In: verified IR after `strip_mine`. Out: for each load at the top of such a loop whose
//! coordinates are computed from the induction variable and values from outside the loop
//! alone (and depend on the induction variable: a tile read again each iteration stays),
//! `n - 1` loop-carried tiles: the first `n - 1` iterations' loaded before the loop, the load
//! in the body replaced by the carried tile, and the body issuing the load of iteration
//! `i + n - 1` first. A load past the loop's last iteration reads that iteration's tile again
//! (its coordinate clamped there: a cache hit, and no element the loop as written does not
//! read; a loop of no iteration reads its first tile, unused). A branch around the load would
//! do as well, but ptxas keeps more registers live across it, and spills.
//!
//! A loop that writes the tensor a load reads keeps that load where it is; one that holds an
//! atomic (whose ordering a moved load could break) keeps all of them. Distinct tensor
//! arguments do not overlap (`docs/dsl.md`, as the read-only loads of a `Tensor` assume).

use std::collections::{BTreeMap, BTreeSet};

use crate::diag::Diagnostic;
use crate::kernel::{BinaryOp, Block, Const, Kernel, Loc, OpId, OpKind, ValueDef, ValueId};
use crate::target::Target;
use crate::types::{DType, Type};

use super::edit::{add1, append_args, append_results, clone_op, constant, drop_dead, substitute};
use super::walk::ops_in_block_regions;

/// Rewrites every loop the module describes; then drops the loads it replaced and their
/// coordinates where nothing else reads them.
pub fn run(kernel: &mut Kernel, _target: Target) -> Result<(), Diagnostic> {
    let mut body = std::mem::take(&mut kernel.body);
    let done = visit(kernel, &mut body);
    kernel.body = body;
    if done? {
        drop_dead(kernel);
    }
    Ok(())
}

/// What one loop prefetches.
struct Plan {
    /// How many iterations ahead: the loop's stages less one.
    ahead: usize,
    /// The loads, in body order.
    loads: Vec<OpId>,
    /// The body ops their coordinates are computed by, in body order.
    coords: Vec<OpId>,
}

/// Rewrites the loops of `block` and its regions (inner ones first); whether any was.
fn visit(kernel: &mut Kernel, block: &mut Block) -> Result<bool, Diagnostic> {
    let mut changed = false;
    let mut out = Vec::with_capacity(block.ops.len());
    for op in std::mem::take(&mut block.ops) {
        let mut regions = std::mem::take(&mut kernel.ops[op].regions);
        let inner = regions
            .iter_mut()
            .map(|r| visit(kernel, r))
            .collect::<Result<Vec<bool>, Diagnostic>>();
        kernel.ops[op].regions = regions;
        changed |= inner?.into_iter().any(|c| c);
        if let Some(plan) = plan(kernel, op) {
            prefetch(kernel, op, &plan, &mut out)?;
            changed = true;
        }
        out.push(op);
    }
    block.ops = out;
    Ok(changed)
}

/// The loads loop `f` can prefetch (see the module), if it is such a loop and has any.
fn plan(kernel: &Kernel, f: OpId) -> Option<Plan> {
    let OpKind::For {
        stages: Some(stages),
    } = kernel.ops[f].kind
    else {
        return None;
    };
    let ahead = usize::try_from(stages).ok()?.checked_sub(1)?;
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
    let mut coords = BTreeSet::new();
    let loads: Vec<OpId> = body
        .ops
        .iter()
        .copied()
        .filter(|&o| match kernel.ops[o].kind {
            OpKind::Load { tensor, .. } if !written.contains(&tensor) => {
                // A load that reads the same tile every iteration (no coordinate from the
                // induction variable) gains nothing from being read ahead but the
                // registers it would hold.
                let mut cone = BTreeMap::new();
                let mut moves = Some(false);
                for &v in &kernel.ops[o].operands {
                    moves = moves.and_then(|m| {
                        coordinate(kernel, v, (f, iv), (&top, &inside), &mut cone).map(|d| m | d)
                    });
                }
                if moves == Some(true) {
                    coords.extend(cone.into_keys());
                }
                moves == Some(true)
            }
            _ => false,
        })
        .collect();
    if ahead == 0 || loads.is_empty() {
        return None;
    }
    let coords = body
        .ops
        .iter()
        .copied()
        .filter(|o| coords.contains(o))
        .collect();
    Some(Plan {
        ahead,
        loads,
        coords,
    })
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

/// Rewrites loop `f` by `plan`; the loads before it go to `out`.
fn prefetch(
    kernel: &mut Kernel,
    f: OpId,
    plan: &Plan,
    out: &mut Vec<OpId>,
) -> Result<(), Diagnostic> {
    let loc = kernel.ops[f].loc;
    let (lo, hi, step) = match kernel.ops[f].operands[..] {
        [lo, hi, step, ..] => (lo, hi, step),
        _ => return Err(Diagnostic::internal(loc, "prefetch: a loop without bounds")),
    };
    let iv = kernel.ops[f].regions[0].args[0];
    // The last iteration's induction variable, `lo + (hi - 1 - lo) / step * step`, or `lo`
    // for a loop of no iteration.
    let one = constant(kernel, out, Const::Int(1), DType::I32, loc)?;
    let mut last = hi;
    let steps = [
        (BinaryOp::Sub, one),
        (BinaryOp::Sub, lo),
        (BinaryOp::Div, step),
        (BinaryOp::Mul, step),
        (BinaryOp::Add, lo),
        (BinaryOp::Max, lo),
    ];
    for (op, x) in steps {
        last = binary(kernel, out, op, last, x, loc)?;
    }
    // The first iterations' tiles, before the loop: `first[k][i]` is load `i` at `lo + k
    // step`.
    let mut first = Vec::with_capacity(plan.ahead);
    for k in 0..plan.ahead {
        let at = if k == 0 {
            lo
        } else {
            offset(kernel, out, lo, step, k, loc)?
        };
        first.push(loads_at(kernel, out, plan, (iv, at, last), loc)?);
    }
    // In the body, first: the tiles of iteration `i + ahead`.
    let mut head = Vec::new();
    let at = offset(kernel, &mut head, iv, step, plan.ahead, loc)?;
    let next = loads_at(kernel, &mut head, plan, (iv, at, last), loc)?;
    // Carried: load `i`'s tile `s` iterations ahead is argument `i * ahead + s` of those
    // added.
    let tys: Vec<Type> = plan
        .loads
        .iter()
        .flat_map(|&l| std::iter::repeat_n(kernel.ty(kernel.ops[l].results[0]).clone(), plan.ahead))
        .collect();
    let args = append_args(kernel, f, 0, tys.clone());
    let mut subst = BTreeMap::new();
    let mut yields = Vec::with_capacity(args.len());
    for (i, &l) in plan.loads.iter().enumerate() {
        let carried = &args[i * plan.ahead..(i + 1) * plan.ahead];
        subst.insert(kernel.ops[l].results[0], carried[0]);
        yields.extend(&carried[1..]);
        yields.push(next[i]);
        kernel.ops[f]
            .operands
            .extend(first.iter().map(|tiles| tiles[i]));
    }
    append_results(kernel, f, tys);
    let body_ops = std::mem::take(&mut kernel.ops[f].regions[0].ops);
    let mut ops = head;
    for o in body_ops {
        if plan.loads.contains(&o) {
            continue;
        }
        substitute(kernel, o, &subst);
        if kernel.ops[o].kind == OpKind::Yield {
            kernel.ops[o].operands.extend(&yields);
        }
        ops.push(o);
    }
    kernel.ops[f].regions[0].ops = ops;
    Ok(())
}

/// `base + k step`, appended to `out`.
fn offset(
    kernel: &mut Kernel,
    out: &mut Vec<OpId>,
    base: ValueId,
    step: ValueId,
    k: usize,
    loc: Loc,
) -> Result<ValueId, Diagnostic> {
    let by = if k == 1 {
        step
    } else {
        let k = constant(kernel, out, Const::Int(k as i64), DType::I32, loc)?;
        binary(kernel, out, BinaryOp::Mul, step, k, loc)?
    };
    binary(kernel, out, BinaryOp::Add, base, by, loc)
}

/// `a op b` on i32 scalars, appended to `out`.
fn binary(
    kernel: &mut Kernel,
    out: &mut Vec<OpId>,
    op: BinaryOp,
    a: ValueId,
    b: ValueId,
    loc: Loc,
) -> Result<ValueId, Diagnostic> {
    add1(kernel, out, OpKind::Binary(op), vec![a, b], loc)
}

/// The plan's loads with the induction variable `iv` at `min(at, last)`, appended to `out`
/// (their coordinates recomputed there).
fn loads_at(
    kernel: &mut Kernel,
    out: &mut Vec<OpId>,
    plan: &Plan,
    (iv, at, last): (ValueId, ValueId, ValueId),
    loc: Loc,
) -> Result<Vec<ValueId>, Diagnostic> {
    let at = binary(kernel, out, BinaryOp::Min, at, last, loc)?;
    let mut map = BTreeMap::from([(iv, at)]);
    for &o in &plan.coords {
        clone_op(kernel, out, o, &mut map);
    }
    let mut tiles = Vec::with_capacity(plan.loads.len());
    for &l in &plan.loads {
        let o = kernel.ops[l].clone();
        let operands = o
            .operands
            .iter()
            .map(|x| *map.get(x).unwrap_or(x))
            .collect();
        tiles.push(add1(kernel, out, o.kind, operands, o.loc)?);
    }
    Ok(tiles)
}
