//! Tiles of rank 3 and 4: how they lower (run at the start of `canonicalize`).
//!
//! A rank-3 or rank-4 register tile keeps its shape in the IR; every pass and backend sees it
//! as it is. Its blocked layout folds the leading dimensions into rows and its distribution
//! splits them back per dimension, so reductions, broadcasts and addressing work per dimension;
//! this module rewrites its plain loads and stores into addressed accesses (`gather`/`scatter`
//! with a coordinate per dimension). `mma` stays 2-D. The design in full (layouts, memory,
//! broadcasting, `reshape`/`permute`): `docs/pipeline.md`, "Inside the passes".

use crate::access::tile_dim;
use crate::kernel::{
    Access, BinaryOp, Block, Const, Kernel, Op, OpId, OpKind, Param, ValueData, ValueDef, ValueId,
};
use crate::types::{DType, Shape, Type};

/// Rewrites the loads and stores of tiles of rank 3 and more into addressed accesses.
pub(crate) fn run(kernel: &mut Kernel) {
    let mut body = std::mem::take(&mut kernel.body);
    rewrite_block(kernel, &mut body);
    kernel.body = body;
}

fn rewrite_block(kernel: &mut Kernel, block: &mut Block) {
    let mut out = Vec::with_capacity(block.ops.len());
    for &id in &block.ops {
        let mut regions = std::mem::take(&mut kernel.ops[id].regions);
        for r in &mut regions {
            rewrite_block(kernel, r);
        }
        kernel.ops[id].regions = regions;
        rewrite_op(kernel, id, &mut out);
        out.push(id);
    }
    block.ops = out;
}

/// Rewrites op `id` in place when it is a rank >= 3 load or store; ops it needs first are
/// pushed to `before`.
fn rewrite_op(kernel: &mut Kernel, id: OpId, before: &mut Vec<OpId>) {
    let op = kernel.ops[id].clone();
    match &op.kind {
        OpKind::Load { tensor, shape } if shape.rank() >= 3 => {
            let Some(Param::Tensor { dtype, rank, .. }) = kernel.params.get(*tensor).cloned()
            else {
                return;
            };
            let zero = if dtype.is_float() {
                Const::Float(0.0)
            } else {
                Const::Int(0)
            };
            let other = new_op(
                kernel,
                OpKind::Const(zero),
                vec![],
                Type::Scalar(dtype),
                &op,
                before,
            );
            let o = &mut kernel.ops[id];
            o.kind = OpKind::Gather {
                tensor: *tensor,
                shape: shape.clone(),
                access: Access::coords(rank),
            };
            o.operands.push(other);
        }
        OpKind::Store { tensor, bound } => {
            let Some(parts) = op.store_operands() else {
                return;
            };
            let Some(shape) = kernel.ty(parts.value).shape().cloned() else {
                return;
            };
            if shape.rank() < 3 {
                return;
            }
            let rank = parts.coords.len();
            let mut operands: Vec<ValueId> = parts.coords.to_vec();
            operands.push(parts.value);
            let mut access = Access::coords(rank);
            if let (Some((dim, limit)), Some(_)) = (parts.limit, *bound) {
                // Elements at `coords[dim] + i >= limit` along the bounded dimension are off.
                let Some(t) = tile_dim(dim, rank, shape.rank()).filter(|&t| t < shape.rank())
                else {
                    return;
                };
                let ity = Type::Tile {
                    dtype: DType::I32,
                    shape: shape_with_one(&shape, t),
                };
                let iota = new_op(
                    kernel,
                    OpKind::Iota {
                        shape: shape_with_one(&shape, t),
                        dim: t,
                    },
                    vec![],
                    ity.clone(),
                    &op,
                    before,
                );
                let at = new_op(
                    kernel,
                    OpKind::Binary(BinaryOp::Add),
                    vec![iota, parts.coords[dim]],
                    ity.clone(),
                    &op,
                    before,
                );
                let mask = new_op(
                    kernel,
                    OpKind::Binary(BinaryOp::Lt),
                    vec![at, limit],
                    ity.with_dtype(DType::Bool),
                    &op,
                    before,
                );
                operands.push(mask);
                access.masked = true;
            }
            let o = &mut kernel.ops[id];
            o.kind = OpKind::Scatter {
                tensor: *tensor,
                access,
            };
            o.operands = operands;
        }
        _ => {}
    }
}

/// `shape` with every extent but dimension `keep`'s set to 1 (a mask along one dimension,
/// broadcast over the others).
fn shape_with_one(shape: &Shape, keep: usize) -> Shape {
    Shape(
        shape
            .dims()
            .iter()
            .enumerate()
            .map(|(d, &n)| if d == keep { n } else { 1 })
            .collect(),
    )
}

/// A new op of one result of type `ty`, at `like`'s location, appended to `before`.
fn new_op(
    kernel: &mut Kernel,
    kind: OpKind,
    operands: Vec<ValueId>,
    ty: Type,
    like: &Op,
    before: &mut Vec<OpId>,
) -> ValueId {
    let op = kernel.ops.append(Op {
        kind,
        operands,
        results: Vec::new(),
        regions: Vec::new(),
        loc: like.loc,
    });
    let v = kernel.values.append(ValueData {
        ty,
        def: ValueDef::Op(op, 0),
    });
    kernel.ops[op].results.push(v);
    before.push(op);
    v
}
