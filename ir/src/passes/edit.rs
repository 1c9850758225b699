//! Editing the IR inside a pass: new ops typed from their operands, results and block
//! arguments added to an op, operand substitution, and the removal of ops (dead ones, or a
//! list).

use std::collections::BTreeMap;

use crate::diag::Diagnostic;
use crate::infer::result_types;
use crate::kernel::{Block, Const, Kernel, Loc, Op, OpId, OpKind, ValueData, ValueDef, ValueId};
use crate::types::{DType, Type};

use super::walk::{ops_in_order, uses};

/// Appends an op typed from its operands to `out`; its results. `const_ty` types a
/// [`OpKind::Const`].
pub(crate) fn add(
    kernel: &mut Kernel,
    out: &mut Vec<OpId>,
    kind: OpKind,
    operands: Vec<ValueId>,
    loc: Loc,
    const_ty: Option<&Type>,
) -> Result<Vec<ValueId>, Diagnostic> {
    let tys: Vec<Type> = operands.iter().map(|&v| kernel.ty(v).clone()).collect();
    let results = result_types(&kind, &tys, &kernel.params, const_ty)
        .map_err(|e| Diagnostic::internal(loc, format!("a pass built an ill-typed op: {e}")))?;
    let op = kernel.ops.append(Op {
        kind,
        operands,
        results: Vec::new(),
        regions: Vec::new(),
        loc,
    });
    let rs = append_results(kernel, op, results);
    out.push(op);
    Ok(rs)
}

/// [`add`] for an op of one result.
pub(crate) fn add1(
    kernel: &mut Kernel,
    out: &mut Vec<OpId>,
    kind: OpKind,
    operands: Vec<ValueId>,
    loc: Loc,
) -> Result<ValueId, Diagnostic> {
    add(kernel, out, kind, operands, loc, None)?
        .first()
        .copied()
        .ok_or_else(|| Diagnostic::internal(loc, "a pass built an op without a result"))
}

/// Appends a scalar constant to `out`.
pub(crate) fn constant(
    kernel: &mut Kernel,
    out: &mut Vec<OpId>,
    c: Const,
    dtype: DType,
    loc: Loc,
) -> Result<ValueId, Diagnostic> {
    let ty = Type::Scalar(dtype);
    add(kernel, out, OpKind::Const(c), Vec::new(), loc, Some(&ty))?
        .first()
        .copied()
        .ok_or_else(|| Diagnostic::internal(loc, "a pass built a constant without a value"))
}

/// Appends to the arena a loop op of `kind` over `operands` whose body's arguments are typed
/// `arg_tys` (the induction variable's first); the op and those arguments. [`close_loop`]
/// gives it its body and results.
pub(crate) fn open_loop(
    kernel: &mut Kernel,
    kind: OpKind,
    operands: Vec<ValueId>,
    arg_tys: Vec<Type>,
    loc: Loc,
) -> (OpId, Vec<ValueId>) {
    let f = kernel.ops.append(Op {
        kind,
        operands,
        results: Vec::new(),
        regions: vec![Block::default()],
        loc,
    });
    let args = append_args(kernel, f, 0, arg_tys);
    (f, args)
}

/// Gives loop `f` from [`open_loop`] its `body` and a result per carried argument (every
/// body argument after the induction variable), of its type; the results.
pub(crate) fn close_loop(kernel: &mut Kernel, f: OpId, body: Vec<OpId>) -> Vec<ValueId> {
    kernel.ops[f].regions[0].ops = body;
    let tys = kernel.ops[f].regions[0].args[1..]
        .iter()
        .map(|&a| kernel.ty(a).clone())
        .collect();
    append_results(kernel, f, tys)
}

/// Adds results of types `tys` after `op`'s others; the new values.
pub(crate) fn append_results(kernel: &mut Kernel, op: OpId, tys: Vec<Type>) -> Vec<ValueId> {
    let first = kernel.ops[op].results.len();
    let rs: Vec<ValueId> = tys
        .into_iter()
        .enumerate()
        .map(|(i, ty)| {
            kernel.values.append(ValueData {
                ty,
                def: ValueDef::Op(op, first + i),
            })
        })
        .collect();
    kernel.ops[op].results.extend(&rs);
    rs
}

/// Adds arguments of types `tys` after the others of region `region` of `op` (which must
/// exist); the new values.
pub(crate) fn append_args(
    kernel: &mut Kernel,
    op: OpId,
    region: usize,
    tys: Vec<Type>,
) -> Vec<ValueId> {
    let first = kernel.ops[op].regions[region].args.len();
    let args: Vec<ValueId> = tys
        .into_iter()
        .enumerate()
        .map(|(i, ty)| {
            kernel.values.append(ValueData {
                ty,
                def: ValueDef::BlockArg {
                    op,
                    region,
                    index: first + i,
                },
            })
        })
        .collect();
    kernel.ops[op].regions[region].args.extend(&args);
    args
}

/// Replaces, in `op` and its regions, every operand found in `subst`.
pub(crate) fn substitute(kernel: &mut Kernel, op: OpId, subst: &BTreeMap<ValueId, ValueId>) {
    for x in kernel.ops[op].operands.iter_mut() {
        if let Some(&n) = subst.get(x) {
            *x = n;
        }
    }
    let inner: Vec<OpId> = kernel.ops[op]
        .regions
        .iter()
        .flat_map(|r| r.ops.iter().copied())
        .collect();
    for o in inner {
        substitute(kernel, o, subst);
    }
}

/// Takes `ops` out of the kernel's blocks, wherever they are.
pub(crate) fn unlink(kernel: &mut Kernel, ops: &[OpId]) {
    fn walk(kernel: &mut Kernel, block: &mut Block, dead: &[OpId]) {
        block.ops.retain(|op| !dead.contains(op));
        for &op in &block.ops {
            let mut regions = std::mem::take(&mut kernel.ops[op].regions);
            for r in &mut regions {
                walk(kernel, r, dead);
            }
            kernel.ops[op].regions = regions;
        }
    }
    if !ops.is_empty() {
        let mut body = std::mem::take(&mut kernel.body);
        walk(kernel, &mut body, ops);
        kernel.body = body;
    }
}

/// Unlinks the ops without side effects whose results nothing reads, repeatedly, so no later
/// pass or writer sees dead tiles.
pub(crate) fn drop_dead(kernel: &mut Kernel) {
    loop {
        let uses = uses(kernel);
        let dead: Vec<OpId> = ops_in_order(kernel)
            .into_iter()
            .filter(|&op| {
                let o = &kernel.ops[op];
                let pure = !matches!(
                    o.kind,
                    OpKind::Store { .. }
                        | OpKind::Scatter { .. }
                        | OpKind::Atomic { .. }
                        | OpKind::ScalarAtomic { .. }
                        | OpKind::Print { .. }
                        | OpKind::For { .. }
                        | OpKind::If
                        | OpKind::Yield
                );
                pure && o.results.iter().all(|r| !uses.contains_key(r))
            })
            .collect();
        if dead.is_empty() {
            return;
        }
        unlink(kernel, &dead);
    }
}
