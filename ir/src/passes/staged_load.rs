//! Which loads the sm_80 lowering can stage in shared memory with `cp.async`: a plain `load`,
//! and a masked load of tile coordinates (`load_masked`, a `gather` without index tiles)
//! whose mask only bounds one tile dimension, `iota(.., dim) (+ shift) < limit`, and whose
//! fill is 0. Such a mask keeps exactly the elements whose tensor coordinate along that
//! dimension is below `coord + limit - shift`: the copy clips the tensor's extent there and
//! zero-fills the rest as it does past the tensor's edge, so nothing past the bound is read
//! (a packed varlen batch's next sequence). Any other masked or gathered load is read into
//! registers and, as an `mma` operand, staged from there ([`super::mma_operands`]).

use crate::entities::{Addr, BinaryOp, Const};
use crate::kernel::{Kernel, OpId, OpKind, ValueId};
use crate::types::Shape;

use super::walk::defining_op;

/// A load the lowering may copy into shared memory (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StagedLoad {
    /// Parameter index of the tensor.
    pub tensor: usize,
    /// Tile shape.
    pub shape: Shape,
    /// The tile's first element, one scalar per tensor dimension.
    pub coords: Vec<ValueId>,
    /// The bound a masked load keeps its elements below.
    pub bound: Option<Bound>,
}

/// Of a masked [`StagedLoad`]: element `i` along tile dimension `dim` is read iff `i +
/// shift < limit` (`shift` 0 when `None`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// The tile dimension bounded.
    pub dim: usize,
    /// The scalar added to the element's index, if any.
    pub shift: Option<ValueId>,
    /// The scalar the shifted index stays below.
    pub limit: ValueId,
}

impl StagedLoad {
    /// Every scalar the copy reads, in order: the coordinates, then the bound's shift and
    /// limit. A prefetch recomputes these for a later iteration.
    pub fn scalars(&self) -> Vec<ValueId> {
        let bound = self
            .bound
            .iter()
            .flat_map(|b| b.shift.into_iter().chain([b.limit]));
        self.coords.iter().copied().chain(bound).collect()
    }

    /// The tensor dimension the bound clips, for a tensor of rank `rank`.
    pub fn bound_dim(&self, rank: usize) -> Option<usize> {
        self.bound.map(|b| rank - self.shape.rank() + b.dim)
    }
}

/// Op `id` as a load the lowering can stage in shared memory, if it is one (a plain `load`,
/// or a masked load of the form in the module doc).
pub fn of(kernel: &Kernel, id: OpId) -> Option<StagedLoad> {
    let op = &kernel.ops[id];
    match &op.kind {
        OpKind::Load { tensor, shape } => Some(StagedLoad {
            tensor: *tensor,
            shape: shape.clone(),
            coords: op.operands.clone(),
            bound: None,
        }),
        OpKind::Gather {
            tensor,
            shape,
            access,
        } if access.masked && access.dims.iter().all(|d| *d == Addr::Coord) => {
            let parts = op.access_operands()?;
            if !is_zero(kernel, parts.other?) {
                return None;
            }
            let bound = row_bound(kernel, parts.mask?, shape)?;
            Some(StagedLoad {
                tensor: *tensor,
                shape: shape.clone(),
                coords: parts.addr.to_vec(),
                bound: Some(bound),
            })
        }
        _ => None,
    }
}

/// Whether `v` is the constant 0.
fn is_zero(kernel: &Kernel, v: ValueId) -> bool {
    let (def, is_result) = defining_op(kernel, v);
    is_result
        && match kernel.ops[def].kind {
            OpKind::Const(Const::Int(0)) => true,
            OpKind::Const(Const::Float(x)) => x == 0.0,
            _ => false,
        }
}

/// The bound of mask `m` on a tile of `shape`: `m` is `x < limit` (or `limit > x`) with `x`
/// an `iota` along one dimension, plus a scalar or not, every other dimension of the `iota`
/// the tile's or 1.
fn row_bound(kernel: &Kernel, m: ValueId, shape: &Shape) -> Option<Bound> {
    let scalar = |v: ValueId| kernel.ty(v).shape().is_none();
    let (def, is_result) = defining_op(kernel, m);
    if !is_result {
        return None;
    }
    let op = &kernel.ops[def];
    let (x, limit) = match op.kind {
        OpKind::Binary(BinaryOp::Lt) => (op.operands[0], op.operands[1]),
        OpKind::Binary(BinaryOp::Gt) => (op.operands[1], op.operands[0]),
        _ => return None,
    };
    if !scalar(limit) {
        return None;
    }
    let (x_def, is_result) = defining_op(kernel, x);
    if !is_result {
        return None;
    }
    let x_op = &kernel.ops[x_def];
    let (iota, shift) = match x_op.kind {
        OpKind::Iota { .. } => (x, None),
        OpKind::Binary(BinaryOp::Add) => {
            let [a, b] = [x_op.operands[0], x_op.operands[1]];
            match (scalar(a), scalar(b)) {
                (false, true) => (a, Some(b)),
                (true, false) => (b, Some(a)),
                _ => return None,
            }
        }
        _ => return None,
    };
    let (iota_def, is_result) = defining_op(kernel, iota);
    let OpKind::Iota {
        shape: ref ishape,
        dim,
    } = kernel.ops[iota_def].kind
    else {
        return None;
    };
    let fits = is_result
        && ishape.rank() == shape.rank()
        && ishape.dims()[dim] == shape.dims()[dim]
        && ishape
            .dims()
            .iter()
            .zip(shape.dims())
            .all(|(&i, &s)| i == s || i == 1);
    fits.then_some(Bound { dim, shift, limit })
}
