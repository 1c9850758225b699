//! Result-type rules of every operation. The builder uses them to type new operations and
//! the verifier to re-check a kernel after a pass; one function serves both.

use crate::entities::tensor_param;
use crate::kernel::{BinaryOp, Const, OpKind, Param, UnaryOp};
use crate::types::{DType, Shape, Type, check_shape};

/// The result types of an operation of `kind` applied to operands of types `operands`, or a
/// sentence saying why the operands do not fit. `params` are the kernel's parameters and
/// `result_hint` the declared type of a `Const`/`ScalarParam` result.
pub fn result_types(
    kind: &OpKind,
    operands: &[Type],
    params: &[Param],
    const_ty: Option<&Type>,
) -> Result<Vec<Type>, String> {
    let n = operands.len();
    let want = |k: usize| -> Result<(), String> {
        if n == k {
            Ok(())
        } else {
            Err(format!("expects {k} operand(s), found {n}"))
        }
    };
    match kind {
        OpKind::Const(c) => {
            want(0)?;
            let ty = const_ty
                .cloned()
                .ok_or("a constant needs a declared type")?;
            let ok = match (c, ty.dtype()) {
                (Const::Int(_), DType::I32) => true,
                (Const::Int(v), DType::U32) => u32::try_from(*v).is_ok(),
                (Const::Float(_), d) => d.is_float(),
                (Const::Bool(_), DType::Bool) => true,
                _ => false,
            };
            if !ok || ty.shape().is_some() {
                return Err(format!("constant {c} cannot be {}", ty.words()));
            }
            Ok(vec![ty])
        }
        OpKind::ScalarParam(i) => {
            want(0)?;
            match params.get(*i) {
                Some(Param::Scalar { dtype, .. }) => Ok(vec![Type::Scalar(*dtype)]),
                _ => Err(format!("parameter {i} is not a scalar parameter")),
            }
        }
        OpKind::BlockId(_) | OpKind::GridDim(_) => {
            want(0)?;
            Ok(vec![Type::Scalar(DType::I32)])
        }
        OpKind::TensorDim { tensor, dim } => {
            want(0)?;
            let rank = tensor_param(params, *tensor)?.1;
            if *dim >= rank {
                return Err(format!(
                    "dimension {dim} is out of range for a rank-{rank} tensor"
                ));
            }
            Ok(vec![Type::Scalar(DType::I32)])
        }
        OpKind::Unary(op) => {
            want(1)?;
            let d = operands[0].dtype();
            let ok = match op {
                UnaryOp::Not => d == DType::Bool || d.is_int(),
                UnaryOp::Neg | UnaryOp::Abs => d != DType::Bool,
                _ => d.is_float(),
            };
            if !ok {
                return Err(format!("`{}` is not defined on {d}", op.name()));
            }
            Ok(vec![operands[0].clone()])
        }
        OpKind::Binary(op) => {
            want(2)?;
            let (a, b) = (&operands[0], &operands[1]);
            if a.dtype() != b.dtype() {
                return Err(format!(
                    "operands of `{}` have different element types: {} and {}; cast one with `.cast::<T>()`",
                    op.name(),
                    a.dtype(),
                    b.dtype()
                ));
            }
            let d = a.dtype();
            let ok = match op {
                BinaryOp::And | BinaryOp::Or => d == DType::Bool,
                BinaryOp::Eq | BinaryOp::Ne => true,
                BinaryOp::Rem => d.is_int(),
                BinaryOp::BitAnd
                | BinaryOp::BitOr
                | BinaryOp::BitXor
                | BinaryOp::Shl
                | BinaryOp::Shr
                | BinaryOp::MulHi => d.is_int(),
                _ => d != DType::Bool,
            };
            if !ok {
                return Err(format!("`{}` is not defined on {d}", op.name()));
            }
            let shape = broadcast(a, b)?;
            let out = if op.is_comparison() { DType::Bool } else { d };
            Ok(vec![with_shape(out, shape)])
        }
        OpKind::Select => {
            want(3)?;
            if operands[0].dtype() != DType::Bool {
                return Err(format!(
                    "the condition of `select` is {}, expected bool",
                    operands[0].dtype()
                ));
            }
            if operands[1].dtype() != operands[2].dtype() {
                return Err(format!(
                    "the branches of `select` have different element types: {} and {}",
                    operands[1].dtype(),
                    operands[2].dtype()
                ));
            }
            let s = broadcast(&operands[1], &operands[2])?;
            let cond_shape = operands[0].shape().cloned();
            let s = match (s, cond_shape) {
                (Some(s), Some(c)) => Some(s.broadcast(&c).ok_or_else(|| {
                    format!("condition shape {c} does not broadcast against {s}")
                })?),
                (s, c) => s.or(c),
            };
            Ok(vec![with_shape(operands[1].dtype(), s)])
        }
        OpKind::Cast { to } => {
            want(1)?;
            if operands[0].dtype() == DType::Bool || *to == DType::Bool {
                return Err(
                    "casts to and from bool are not supported; compare or select instead".into(),
                );
            }
            Ok(vec![operands[0].with_dtype(*to)])
        }
        OpKind::Bitcast { to } => {
            want(1)?;
            let from = operands[0].dtype();
            if from == DType::Bool || *to == DType::Bool || from.size_bytes() != to.size_bytes() {
                return Err(format!(
                    "cannot bitcast {from} to {to}: bitcasts are between types of the same width \
                     (f32, i32 and u32; bf16 and f16)"
                ));
            }
            Ok(vec![operands[0].with_dtype(*to)])
        }
        OpKind::Splat { shape } => {
            want(1)?;
            check_shape(shape)?;
            match &operands[0] {
                Type::Scalar(d) => Ok(vec![Type::Tile {
                    dtype: *d,
                    shape: shape.clone(),
                }]),
                t => Err(format!("`splat` takes a scalar, found {}", t.words())),
            }
        }
        OpKind::Iota { shape, dim } => {
            want(0)?;
            check_shape(shape)?;
            if *dim >= shape.rank() {
                return Err(format!(
                    "iota dimension {dim} is out of range for shape {shape}"
                ));
            }
            Ok(vec![Type::Tile {
                dtype: DType::I32,
                shape: shape.clone(),
            }])
        }
        OpKind::Reshape { shape } => {
            want(1)?;
            let from = tile_shape(&operands[0], "reshape")?;
            check_shape(shape)?;
            if from.numel() != shape.numel() {
                return Err(format!(
                    "cannot reshape a {from} tile ({} elements) to {shape} ({} elements): a \
                     reshape keeps the element count",
                    from.numel(),
                    shape.numel()
                ));
            }
            Ok(vec![Type::Tile {
                dtype: operands[0].dtype(),
                shape: shape.clone(),
            }])
        }
        OpKind::Convert => {
            want(1)?;
            tile_shape(&operands[0], "convert")?;
            Ok(vec![operands[0].clone()])
        }
        OpKind::Transpose => {
            want(1)?;
            let s = tile_shape(&operands[0], "transpose")?;
            if s.rank() != 2 {
                return Err(format!("`t()` needs a 2-D tile, found shape {s}"));
            }
            Ok(vec![Type::tile(operands[0].dtype(), &[s.0[1], s.0[0]])])
        }
        OpKind::Take { dim } => {
            want(3)?;
            let xs = tile_shape(&operands[0], "take")?;
            let is = tile_shape(&operands[1], "take")?;
            let dtype = operands[0].dtype();
            if dtype == DType::Bool {
                return Err("`take` of a bool tile; cast it to i32 first".into());
            }
            if operands[1].dtype() != DType::I32 {
                return Err(format!(
                    "the indices of `take` are {}, expected an i32 tile",
                    operands[1].words()
                ));
            }
            if *dim >= xs.rank() {
                return Err(format!("`take` along dimension {dim} of a {xs} tile"));
            }
            let agree =
                is.rank() == xs.rank() && (0..xs.rank()).all(|d| d == *dim || is.0[d] == xs.0[d]);
            if !agree {
                return Err(format!(
                    "`take` along dimension {dim} of a {xs} tile needs indices of the same \
                     rank and extents but along {dim}, found a {is} tile"
                ));
            }
            if operands[2] != Type::Scalar(dtype) {
                return Err(format!(
                    "the fill value of `take` is {}, expected a {dtype} scalar",
                    operands[2].words()
                ));
            }
            Ok(vec![Type::Tile {
                dtype,
                shape: is.clone(),
            }])
        }
        OpKind::Permute { perm } => {
            want(1)?;
            let s = tile_shape(&operands[0], "permute")?;
            let mut seen = vec![false; s.rank()];
            for &p in perm {
                match seen.get_mut(p) {
                    Some(x) if !*x => *x = true,
                    _ => {
                        return Err(format!(
                            "`permute({perm:?})` of a {s} tile: the order must name each of \
                             its {} dimensions (0..{}) once",
                            s.rank(),
                            s.rank()
                        ));
                    }
                }
            }
            if perm.len() != s.rank() {
                return Err(format!(
                    "`permute({perm:?})` of a {s} tile: the order must name each of its {} \
                     dimensions once",
                    s.rank()
                ));
            }
            let dims: Vec<usize> = perm.iter().map(|&p| s.0[p]).collect();
            Ok(vec![Type::tile(operands[0].dtype(), &dims)])
        }
        OpKind::Reduce { op: _, dim } => {
            want(1)?;
            let s = tile_shape(&operands[0], "reduce")?;
            if s.rank() < 2 || *dim >= s.rank() {
                return Err(format!(
                    "a reduction along dimension {dim} needs a tile of at least 2 dimensions \
                     that has it, found shape {s}"
                ));
            }
            if operands[0].dtype() == DType::Bool {
                return Err("cannot reduce a bool tile".into());
            }
            let mut dims = s.0.clone();
            dims.remove(*dim);
            Ok(vec![Type::tile(operands[0].dtype(), &dims)])
        }
        OpKind::Mma => {
            if n != 2 && n != 3 {
                return Err(format!("`mma` takes 2 or 3 operands, found {n}"));
            }
            let a = tile_shape(&operands[0], "mma")?;
            let b = tile_shape(&operands[1], "mma")?;
            let (da, db) = (operands[0].dtype(), operands[1].dtype());
            if !matches!(da, DType::Bf16 | DType::F16) || da != db {
                return Err(format!(
                    "`mma` operands must both be bf16 or both f16, found {da} and {db}; cast with `.cast::<bf16>()`"
                ));
            }
            if a.rank() != 2 || b.rank() != 2 {
                return Err(format!(
                    "`mma` multiplies 2-D tiles, found a {a} and a {b} operand; reshape a tile \
                     of more dimensions to 2-D first (`.reshape([rows, cols])`)"
                ));
            }
            if a.0[1] != b.0[0] {
                return Err(format!(
                    "`mma` shapes do not agree: a is {a}, b is {b}; a's columns must equal b's rows"
                ));
            }
            let out = Type::tile(DType::F32, &[a.0[0], b.0[1]]);
            if n == 3 && operands[2] != out {
                return Err(format!(
                    "`mma` accumulator is {}, expected {} (the product's rows by its columns)",
                    operands[2].words(),
                    out.words()
                ));
            }
            Ok(vec![out])
        }
        OpKind::Load { tensor, shape } => {
            let (dtype, rank, _) = tensor_param(params, *tensor)?;
            want(rank)?;
            check_coords(operands)?;
            check_shape(shape)?;
            if shape.rank() > rank {
                return Err(format!(
                    "a {}-D tile cannot be taken from a rank-{rank} tensor",
                    shape.rank()
                ));
            }
            Ok(vec![Type::Tile {
                dtype,
                shape: shape.clone(),
            }])
        }
        OpKind::LoadScalar { tensor } => {
            let (dtype, rank, _) = tensor_param(params, *tensor)?;
            want(rank)?;
            check_coords(operands)?;
            Ok(vec![Type::Scalar(dtype)])
        }
        OpKind::Store { tensor, bound } => {
            let (dtype, rank, mutable) = tensor_param(params, *tensor)?;
            want(rank + 1 + usize::from(bound.is_some()))?;
            check_coords(&operands[..rank])?;
            if !mutable {
                return Err(format!(
                    "tensor `{}` is read-only; declare it `TensorMut` to store into it",
                    params[*tensor].name()
                ));
            }
            let v = &operands[rank];
            let s = tile_shape(v, "store")?;
            if s.rank() > rank {
                return Err(format!(
                    "a {}-D tile cannot be stored into a rank-{rank} tensor",
                    s.rank()
                ));
            }
            if v.dtype() != dtype {
                return Err(format!(
                    "storing a {} tile into a {dtype} tensor; cast it with `.cast::<{dtype}>()` first",
                    v.dtype()
                ));
            }
            if let Some(dim) = bound {
                // A bound on an outer dimension would clip the whole tile or nothing: a
                // runtime `if` around the store says that.
                let tile_dims = rank - s.rank()..rank;
                if !tile_dims.contains(dim) {
                    return Err(format!(
                        "a store bounded along dimension {dim} of a rank-{rank} tensor: the bound \
                         must be one of the {}-D tile's dimensions ({}..{rank})",
                        s.rank(),
                        tile_dims.start
                    ));
                }
                check_coords(&operands[rank + 1..]).map_err(|_| {
                    format!(
                        "the store's limit is {}, expected an i32 scalar",
                        operands[rank + 1].words()
                    )
                })?;
            }
            Ok(vec![])
        }
        OpKind::Gather { .. } | OpKind::Scatter { .. } | OpKind::Atomic { .. } => {
            crate::access::result_types(kind, operands, params)
        }
        OpKind::ScalarAtomic { tensor, op, .. } => {
            crate::access::scalar_atomic_types(params, *tensor, *op, operands)
        }
        OpKind::For { stages } => {
            if n < 3 {
                return Err("`for` takes lo, hi and step".into());
            }
            check_coords(&operands[..3])?;
            if let Some(s) = stages
                && !(1..=8).contains(s)
            {
                return Err(format!("pipelining depth must be in 1..=8, found {s}"));
            }
            Ok(operands[3..].to_vec())
        }
        OpKind::If => {
            want(1)?;
            if operands[0] != Type::Scalar(DType::Bool) {
                return Err(format!(
                    "the condition of `if` is {}, expected a bool scalar",
                    operands[0].words()
                ));
            }
            // The results are the yielded values' types; the builder declares them and the
            // verifier checks both branches against them.
            Ok(vec![])
        }
        OpKind::Yield => Ok(vec![]),
        OpKind::Print { pieces, elements } => {
            want(elements.len())?;
            if pieces.len() != elements.len() + 1 {
                return Err(format!(
                    "print has {} text pieces for {} arguments, expected one more",
                    pieces.len(),
                    elements.len()
                ));
            }
            for (i, (ty, element)) in operands.iter().zip(elements).enumerate() {
                match (ty.shape(), element) {
                    (None, None) => {}
                    (Some(shape), Some(idx))
                        if idx.len() == shape.rank()
                            && idx
                                .iter()
                                .zip(shape.dims())
                                .all(|(&x, &n)| (x as usize) < n) => {}
                    (Some(_), Some(idx)) => {
                        return Err(format!(
                            "print argument {i}: element {idx:?} is outside {}",
                            ty.words()
                        ));
                    }
                    (Some(_), None) => {
                        return Err(format!(
                            "print argument {i} is {}: print one element with `at(&tile, [..])`",
                            ty.words()
                        ));
                    }
                    (None, Some(_)) => {
                        return Err(format!("print argument {i} is a scalar, not a tile"));
                    }
                }
            }
            Ok(vec![])
        }
    }
}

fn check_coords(ops: &[Type]) -> Result<(), String> {
    for (i, t) in ops.iter().enumerate() {
        if *t != Type::Scalar(DType::I32) {
            return Err(format!(
                "index {i} is {}, expected an i32 scalar",
                t.words()
            ));
        }
    }
    Ok(())
}

fn tile_shape<'a>(t: &'a Type, what: &str) -> Result<&'a Shape, String> {
    t.shape()
        .ok_or_else(|| format!("`{what}` needs a tile, found {}", t.words()))
}

fn broadcast(a: &Type, b: &Type) -> Result<Option<Shape>, String> {
    match (a.shape(), b.shape()) {
        (None, None) => Ok(None),
        (Some(s), None) | (None, Some(s)) => Ok(Some(s.clone())),
        (Some(x), Some(y)) => x
            .broadcast(y)
            .map(Some)
            .ok_or_else(|| format!("tile shapes {x} and {y} do not broadcast; use `.col()`/`.row()` to broadcast a vector")),
    }
}

fn with_shape(d: DType, s: Option<Shape>) -> Type {
    match s {
        None => Type::Scalar(d),
        Some(shape) => Type::Tile { dtype: d, shape },
    }
}
