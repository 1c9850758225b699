//! Type rules of the addressed memory ops ([`OpKind::Gather`], [`OpKind::Scatter`],
//! [`OpKind::Atomic`]): which tensor, how each dimension is addressed, the tile's shape, the
//! mask's and the index tiles' broadcasting, and which atomics each dtype has.

use crate::entities::tensor_param;
use crate::kernel::{Access, Addr, AtomicOp, OpKind, Param};
use crate::types::check_shape;
use crate::types::{DType, Shape, Type};

/// Whether tensors of `dtype` support atomic `op`. bf16 and f16 have only `add` (the
/// hardware's packed and 16-bit float adds); a new integer dtype is one more arm.
pub fn atomic_supported(op: AtomicOp, dtype: DType) -> bool {
    match dtype {
        DType::F32 | DType::I32 | DType::U32 => true,
        DType::Bf16 | DType::F16 => op == AtomicOp::Add,
        DType::Bool => false,
    }
}

/// The result type of a [`OpKind::ScalarAtomic`] on tensor `tensor`: scalar i32 coordinates,
/// one per dimension, then (for `cas`) the compare value and the value, scalars of the
/// tensor's dtype; the result is the old value, of that dtype too.
pub(crate) fn scalar_atomic_types(
    params: &[Param],
    tensor: usize,
    op: AtomicOp,
    operands: &[Type],
) -> Result<Vec<Type>, String> {
    let (dtype, rank, mutable) = tensor_param(params, tensor)?;
    let want = rank + 1 + usize::from(op == AtomicOp::Cas);
    if operands.len() != want {
        return Err(format!(
            "expects {want} operand(s), found {}",
            operands.len()
        ));
    }
    if !mutable {
        return Err(format!(
            "tensor `{}` is read-only; declare it `TensorMut` to write it",
            params[tensor].name()
        ));
    }
    for (d, t) in operands[..rank].iter().enumerate() {
        if *t != Type::Scalar(DType::I32) {
            return Err(format!(
                "coordinate {d} is {}, expected an i32 scalar",
                t.words()
            ));
        }
    }
    for t in &operands[rank..] {
        if *t != Type::Scalar(dtype) {
            return Err(format!(
                "a scalar atomic on a {dtype} tensor takes {dtype} scalars, found {}",
                t.words()
            ));
        }
    }
    if !atomic_supported(op, dtype) {
        return Err(format!(
            "atomic {} is not available on {dtype} tensors",
            op.name()
        ));
    }
    Ok(vec![Type::Scalar(dtype)])
}

/// The result types of an addressed memory op (see [`crate::infer::result_types`]).
pub(crate) fn result_types(
    kind: &OpKind,
    operands: &[Type],
    params: &[Param],
) -> Result<Vec<Type>, String> {
    let (tensor, access, what) = match kind {
        OpKind::Gather { tensor, access, .. } => (*tensor, access, "gather"),
        OpKind::Scatter { tensor, access } => (*tensor, access, "scatter"),
        OpKind::Atomic { tensor, access, .. } => (*tensor, access, "atomic"),
        _ => return Err("not a memory access".into()),
    };
    let (dtype, rank, mutable) = tensor_param(params, tensor)?;
    if access.dims.len() != rank {
        return Err(format!(
            "a rank-{rank} tensor needs {rank} coordinates or index tiles, found {}",
            access.dims.len()
        ));
    }
    let cas = matches!(
        kind,
        OpKind::Atomic {
            op: AtomicOp::Cas,
            ..
        }
    );
    let extra = match kind {
        OpKind::Gather { .. } => 1,
        OpKind::Scatter { .. } => 1,
        _ => 1 + usize::from(cas),
    } + usize::from(access.masked);
    if operands.len() != rank + extra {
        return Err(format!(
            "expects {} operand(s), found {}",
            rank + extra,
            operands.len()
        ));
    }
    if !matches!(kind, OpKind::Gather { .. }) && !mutable {
        return Err(format!(
            "tensor `{}` is read-only; declare it `TensorMut` to write it",
            params[tensor].name()
        ));
    }
    let rest = &operands[rank..];
    // The accessed tile's shape, and what follows the addresses.
    let (shape, mask, tail) = match kind {
        OpKind::Gather { shape, .. } => {
            check_shape(shape)?;
            let other = &rest[rest.len() - 1];
            if *other != Type::Scalar(dtype) {
                return Err(format!(
                    "the fill value `other` is {other}, expected a scalar {dtype} (the tensor's dtype)"
                ));
            }
            (shape.clone(), access.masked.then(|| &rest[0]), None)
        }
        _ => {
            let value = &rest[usize::from(cas)];
            let shape = value.shape().cloned().ok_or_else(|| {
                format!("`{what}` needs a tile of values, found {}", value.words())
            })?;
            if value.dtype() != dtype {
                return Err(format!(
                    "writing a {} tile into a {dtype} tensor; cast it with `.cast::<{dtype}>()` first",
                    value.dtype()
                ));
            }
            let compare = cas.then(|| &rest[0]);
            if let Some(c) = compare
                && (c.dtype() != dtype || !broadcasts(c, &shape))
            {
                return Err(format!(
                    "the compare operand of `atomic_cas` is {}, expected {dtype} broadcast to {shape}",
                    c.words()
                ));
            }
            (
                shape,
                access.masked.then(|| &rest[rest.len() - 1]),
                Some(value),
            )
        }
    };
    if let Some(m) = mask
        && (m.dtype() != DType::Bool || !broadcasts(m, &shape))
    {
        return Err(format!(
            "the mask is {}, expected a bool scalar or tile that broadcasts to the {shape} tile",
            m.words()
        ));
    }
    check_addresses(access, &operands[..rank], &shape)?;
    if let OpKind::Atomic { op, .. } = kind
        && !atomic_supported(*op, dtype)
    {
        return Err(format!(
            "atomic {} is not available on {dtype} tensors",
            op.name()
        ));
    }
    Ok(match (kind, tail) {
        (OpKind::Gather { .. }, _) => vec![Type::Tile { dtype, shape }],
        (OpKind::Atomic { .. }, Some(v)) => vec![v.clone()],
        _ => vec![],
    })
}

/// Coordinates are scalar i32, index tiles i32 tiles broadcasting to `shape`; the tile covers
/// the tensor's last dimensions unless every dimension is an index tile.
fn check_addresses(access: &Access, addr: &[Type], shape: &Shape) -> Result<(), String> {
    let rank = access.dims.len();
    for (d, (a, t)) in access.dims.iter().zip(addr).enumerate() {
        match a {
            Addr::Coord if *t != Type::Scalar(DType::I32) => {
                return Err(format!(
                    "coordinate {d} is {}, expected an i32 scalar",
                    t.words()
                ));
            }
            Addr::Index if t.dtype() != DType::I32 || t.shape().is_none() => {
                return Err(format!(
                    "the index of dimension {d} is {}, expected an i32 tile",
                    t.words()
                ));
            }
            Addr::Index if !broadcasts(t, shape) => {
                return Err(format!(
                    "the index tile of dimension {d} is {}, which does not broadcast to the {shape} tile",
                    t.words()
                ));
            }
            _ => {}
        }
    }
    if access.dims.contains(&Addr::Coord) && shape.rank() > rank {
        return Err(format!(
            "a {}-D tile cannot be taken from a rank-{rank} tensor",
            shape.rank()
        ));
    }
    Ok(())
}

/// Whether `t` is a scalar or a tile of `shape`'s rank whose extents are `shape`'s or 1.
pub fn broadcasts(t: &Type, shape: &Shape) -> bool {
    match t.shape() {
        None => true,
        Some(s) => {
            s.rank() == shape.rank()
                && s.dims()
                    .iter()
                    .zip(shape.dims())
                    .all(|(&a, &b)| a == b || a == 1)
        }
    }
}

/// The tile dimension that tensor dimension `dim` maps to for a tile of rank `tile_rank` on a
/// rank-`rank` tensor (the tile covers the last dimensions), if any.
pub fn tile_dim(dim: usize, rank: usize, tile_rank: usize) -> Option<usize> {
    (dim + tile_rank).checked_sub(rank)
}
