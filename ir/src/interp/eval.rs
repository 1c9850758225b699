//! Pure operations on interpreter values: elementwise maths, casts, shape ops, reductions
//! and `mma`. Each function takes operands the verifier has already type-checked and returns
//! the result, or [`Fault`] for a runtime fault that depends on data (division by zero).

use half::{bf16, f16};

use crate::kernel::{BinaryOp, ReduceOp, UnaryOp};
use crate::types::DType;

use super::value::{Elems, Value, broadcast_dims, broadcast_strides, round, round_elems, zip_with};

/// A fault found while evaluating an op, reported by the caller at the op's location.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Integer division or remainder by zero.
    DivisionByZero,
    /// Operands do not have the types the verifier guarantees (an interpreter bug).
    Mistyped,
}

/// `x`, or 0 (of `x`'s sign) when `x` is subnormal: what the GPU's exponentials
/// (`ex2.approx.ftz`) return below the normal range.
fn flush_subnormal(x: f32) -> f32 {
    if x.is_subnormal() {
        0.0f32.copysign(x)
    } else {
        x
    }
}

/// `op x`, rounded to `x`'s dtype.
pub(crate) fn unary(op: UnaryOp, x: &Value) -> Result<Value, Fault> {
    let elems = match &x.elems {
        Elems::F(v) => {
            let f: fn(f32) -> f32 = match op {
                UnaryOp::Neg => |a| -a,
                UnaryOp::Exp2 => |a| flush_subnormal(a.exp2()),
                UnaryOp::Exp => |a| flush_subnormal(a.exp()),
                UnaryOp::Log2 => crate::math::log2,
                UnaryOp::Log => crate::math::log,
                UnaryOp::Abs => f32::abs,
                UnaryOp::Sqrt => f32::sqrt,
                UnaryOp::Rsqrt => |a| 1.0 / a.sqrt(),
                UnaryOp::Recip => |a| 1.0 / a,
                UnaryOp::Sin => crate::math::sin,
                UnaryOp::Cos => crate::math::cos,
                UnaryOp::Tanh => crate::math::tanh,
                UnaryOp::Erf => crate::math::erf,
                UnaryOp::Sigmoid => crate::math::sigmoid,
                UnaryOp::Not => return Err(Fault::Mistyped),
            };
            let mut out: Vec<f32> = v.iter().map(|&a| f(a)).collect();
            round_elems(x.dtype, &mut out);
            Elems::F(out)
        }
        Elems::I(v) => {
            let f: fn(i32) -> i32 = match op {
                UnaryOp::Neg => i32::wrapping_neg,
                // A u32 is its own absolute value.
                UnaryOp::Abs if x.dtype == DType::U32 => |a| a,
                UnaryOp::Abs => i32::wrapping_abs,
                UnaryOp::Not => |a| !a,
                _ => return Err(Fault::Mistyped),
            };
            Elems::I(v.iter().map(|&a| f(a)).collect())
        }
        Elems::B(v) => match op {
            UnaryOp::Not => Elems::B(v.iter().map(|&a| !a).collect()),
            _ => return Err(Fault::Mistyped),
        },
    };
    Ok(Value {
        dtype: x.dtype,
        dims: x.dims.clone(),
        elems,
    })
}

/// `a op b` with broadcasting; float results are rounded to the operands' dtype.
pub(crate) fn binary(op: BinaryOp, a: &Value, b: &Value) -> Result<Value, Fault> {
    let dims = broadcast_dims(&[a, b]).ok_or(Fault::Mistyped)?;
    if dims.len() > 2 {
        // Tiles of rank 3 and more broadcast element by element: both are spread to the
        // result's shape and combined as flat vectors.
        let (a, b) = (flat_to(a, &dims), flat_to(b, &dims));
        let mut out = binary(op, &a, &b)?;
        out.dims = dims;
        return Ok(out);
    }
    let out = Value {
        dtype: a.dtype,
        dims,
        elems: Elems::B(Vec::new()),
    };
    let rc = out.rows_cols();
    let (sa, sb) = (
        broadcast_strides(a, rc.0, rc.1),
        broadcast_strides(b, rc.0, rc.1),
    );
    let elems = match (&a.elems, &b.elems) {
        (Elems::F(x), Elems::F(y)) => {
            let (x, y) = ((x.as_slice(), sa), (y.as_slice(), sb));
            if op.is_comparison() {
                Elems::B(zip_with(x, y, rc, compare_fn::<f32>(op)?))
            } else {
                let f: fn(f32, f32) -> f32 = match op {
                    BinaryOp::Add => |p, q| p + q,
                    BinaryOp::Sub => |p, q| p - q,
                    BinaryOp::Mul => |p, q| p * q,
                    BinaryOp::Div => |p, q| p / q,
                    // f32::max/min return the non-NaN operand, as the IR requires.
                    BinaryOp::Max => f32::max,
                    BinaryOp::Min => f32::min,
                    _ => return Err(Fault::Mistyped),
                };
                let mut v = zip_with(x, y, rc, f);
                round_elems(a.dtype, &mut v);
                Elems::F(v)
            }
        }
        (Elems::I(x), Elems::I(y)) if a.dtype == DType::U32 => {
            let (x, y) = ((x.as_slice(), sa), (y.as_slice(), sb));
            // u32 elements are stored as their bits: read them unsigned.
            if op.is_comparison() {
                let f = compare_fn::<u32>(op)?;
                Elems::B(zip_with(x, y, rc, |p, q| f(p as u32, q as u32)))
            } else {
                let f: fn(u32, u32) -> Option<u32> = match op {
                    BinaryOp::Add => |p, q| Some(p.wrapping_add(q)),
                    BinaryOp::Sub => |p, q| Some(p.wrapping_sub(q)),
                    BinaryOp::Mul => |p, q| Some(p.wrapping_mul(q)),
                    BinaryOp::Div => |p, q| p.checked_div(q),
                    BinaryOp::Rem => |p, q| p.checked_rem(q),
                    BinaryOp::Max => |p, q| Some(p.max(q)),
                    BinaryOp::Min => |p, q| Some(p.min(q)),
                    BinaryOp::BitAnd => |p, q| Some(p & q),
                    BinaryOp::BitOr => |p, q| Some(p | q),
                    BinaryOp::BitXor => |p, q| Some(p ^ q),
                    BinaryOp::Shl => |p, q| Some(p.checked_shl(q).unwrap_or(0)),
                    BinaryOp::Shr => |p, q| Some(p.checked_shr(q).unwrap_or(0)),
                    BinaryOp::MulHi => |p, q| Some(((u64::from(p) * u64::from(q)) >> 32) as u32),
                    _ => return Err(Fault::Mistyped),
                };
                let v: Option<Vec<i32>> =
                    zip_with(x, y, rc, |p, q| f(p as u32, q as u32).map(|r| r as i32))
                        .into_iter()
                        .collect();
                Elems::I(v.ok_or(Fault::DivisionByZero)?)
            }
        }
        (Elems::I(x), Elems::I(y)) => {
            let (x, y) = ((x.as_slice(), sa), (y.as_slice(), sb));
            if op.is_comparison() {
                Elems::B(zip_with(x, y, rc, compare_fn::<i32>(op)?))
            } else {
                let f: fn(i32, i32) -> Option<i32> = match op {
                    BinaryOp::Add => |p, q| Some(p.wrapping_add(q)),
                    BinaryOp::Sub => |p, q| Some(p.wrapping_sub(q)),
                    BinaryOp::Mul => |p, q| Some(p.wrapping_mul(q)),
                    // checked_div only fails for q == 0 once i32::MIN / -1 is wrapped first.
                    BinaryOp::Div => |p, q| (q != 0).then(|| p.wrapping_div(q)),
                    BinaryOp::Rem => |p, q| (q != 0).then(|| p.wrapping_rem(q)),
                    BinaryOp::Max => |p, q| Some(p.max(q)),
                    BinaryOp::Min => |p, q| Some(p.min(q)),
                    BinaryOp::BitAnd => |p, q| Some(p & q),
                    BinaryOp::BitOr => |p, q| Some(p | q),
                    BinaryOp::BitXor => |p, q| Some(p ^ q),
                    // The amount is read unsigned and clamps at 32, as PTX's shl/shr do.
                    BinaryOp::Shl => |p, q| Some(p.checked_shl(q as u32).unwrap_or(0)),
                    BinaryOp::Shr => |p, q| Some(p >> (q as u32).min(31)),
                    BinaryOp::MulHi => |p, q| Some(((i64::from(p) * i64::from(q)) >> 32) as i32),
                    _ => return Err(Fault::Mistyped),
                };
                let v: Option<Vec<i32>> = zip_with(x, y, rc, f).into_iter().collect();
                Elems::I(v.ok_or(Fault::DivisionByZero)?)
            }
        }
        (Elems::B(x), Elems::B(y)) => {
            let f: fn(bool, bool) -> bool = match op {
                BinaryOp::And => |p, q| p && q,
                BinaryOp::Or => |p, q| p || q,
                BinaryOp::Eq => |p, q| p == q,
                BinaryOp::Ne => |p, q| p != q,
                _ => return Err(Fault::Mistyped),
            };
            Elems::B(zip_with((x, sa), (y, sb), rc, f))
        }
        _ => return Err(Fault::Mistyped),
    };
    let dtype = if op.is_comparison() {
        DType::Bool
    } else {
        a.dtype
    };
    Ok(Value {
        dtype,
        elems,
        ..out
    })
}

fn compare_fn<T: PartialOrd>(op: BinaryOp) -> Result<fn(T, T) -> bool, Fault> {
    Ok(match op {
        BinaryOp::Lt => |p, q| p < q,
        BinaryOp::Le => |p, q| p <= q,
        BinaryOp::Gt => |p, q| p > q,
        BinaryOp::Ge => |p, q| p >= q,
        BinaryOp::Eq => |p, q| p == q,
        BinaryOp::Ne => |p, q| p != q,
        _ => return Err(Fault::Mistyped),
    })
}

/// `cond ? a : b` elementwise, with all three broadcast together.
pub(crate) fn select(cond: &Value, a: &Value, b: &Value) -> Result<Value, Fault> {
    let dims = broadcast_dims(&[cond, a, b]).ok_or(Fault::Mistyped)?;
    if dims.len() > 2 {
        let (c, x, y) = (flat_to(cond, &dims), flat_to(a, &dims), flat_to(b, &dims));
        let mut out = select(&c, &x, &y)?;
        out.dims = dims;
        return Ok(out);
    }
    let mut out = Value {
        dtype: a.dtype,
        dims,
        elems: Elems::B(Vec::new()),
    };
    let rc = out.rows_cols();
    let sc = broadcast_strides(cond, rc.0, rc.1);
    let (sa, sb) = (
        broadcast_strides(a, rc.0, rc.1),
        broadcast_strides(b, rc.0, rc.1),
    );
    let Elems::B(c) = &cond.elems else {
        return Err(Fault::Mistyped);
    };
    // Pair each condition with its flat index into `a`, then pick.
    let pick = |i: usize, j: usize| {
        (
            c[i * sc.0 + j * sc.1],
            i * sa.0 + j * sa.1,
            i * sb.0 + j * sb.1,
        )
    };
    let picks: Vec<(bool, usize, usize)> = (0..rc.0)
        .flat_map(|i| (0..rc.1).map(move |j| (i, j)))
        .map(|(i, j)| pick(i, j))
        .collect();
    out.elems = match (&a.elems, &b.elems) {
        (Elems::F(x), Elems::F(y)) => Elems::F(choose(&picks, x, y)),
        (Elems::I(x), Elems::I(y)) => Elems::I(choose(&picks, x, y)),
        (Elems::B(x), Elems::B(y)) => Elems::B(choose(&picks, x, y)),
        _ => return Err(Fault::Mistyped),
    };
    Ok(out)
}

fn choose<T: Copy>(picks: &[(bool, usize, usize)], a: &[T], b: &[T]) -> Vec<T> {
    picks
        .iter()
        .map(|&(c, i, j)| if c { a[i] } else { b[j] })
        .collect()
}

/// Converts to `to`: float to float and int to float round to nearest even; float to int
/// truncates toward zero, saturates, and maps NaN to 0 (PTX `cvt.rzi.sat`, Rust `as`).
pub(crate) fn cast(x: &Value, to: DType) -> Result<Value, Fault> {
    let elems = match (&x.elems, to.is_float(), to) {
        (Elems::F(v), true, _) => {
            let mut out = v.clone();
            round_elems(to, &mut out);
            Elems::F(out)
        }
        (Elems::F(v), false, DType::I32) => Elems::I(v.iter().map(|&a| a as i32).collect()),
        // Saturating at 0 and u32::MAX, NaN to 0: PTX's `cvt.rzi.u32.f32`.
        (Elems::F(v), false, DType::U32) => Elems::I(v.iter().map(|&a| a as u32 as i32).collect()),
        (Elems::I(v), true, _) if x.dtype == DType::U32 => {
            Elems::F(v.iter().map(|&a| round(to, a as u32 as f32)).collect())
        }
        (Elems::I(v), true, _) => Elems::F(v.iter().map(|&a| round(to, a as f32)).collect()),
        // Between i32 and u32 the bits stay (two's complement wrap, as Rust's `as`).
        (Elems::I(v), false, DType::I32 | DType::U32) => Elems::I(v.clone()),
        _ => return Err(Fault::Mistyped),
    };
    Ok(Value {
        dtype: to,
        dims: x.dims.clone(),
        elems,
    })
}

/// Reinterprets the bits of every element as `to` (the verifier checks the widths agree).
pub(crate) fn bitcast(x: &Value, to: DType) -> Result<Value, Fault> {
    let half_bits = |dtype: DType, a: f32| match dtype {
        DType::Bf16 => Some(bf16::from_f32(a).to_bits()),
        DType::F16 => Some(f16::from_f32(a).to_bits()),
        _ => None,
    };
    let elems = match (&x.elems, x.dtype, to) {
        // A bitcast to its own type (which the verifier accepts) keeps the value.
        (e, from, to) if from == to && from != DType::Bool => e.clone(),
        (Elems::F(v), DType::F32, DType::I32 | DType::U32) => {
            Elems::I(v.iter().map(|&a| a.to_bits() as i32).collect())
        }
        (Elems::I(v), DType::I32 | DType::U32, DType::F32) => {
            Elems::F(v.iter().map(|&a| f32::from_bits(a as u32)).collect())
        }
        (Elems::I(v), DType::I32 | DType::U32, DType::I32 | DType::U32) => Elems::I(v.clone()),
        (Elems::F(v), from @ (DType::Bf16 | DType::F16), DType::Bf16 | DType::F16) => {
            let bits: Option<Vec<u16>> = v.iter().map(|&a| half_bits(from, a)).collect();
            let bits = bits.ok_or(Fault::Mistyped)?;
            Elems::F(match to {
                DType::Bf16 => bits.iter().map(|&b| bf16::from_bits(b).to_f32()).collect(),
                _ => bits.iter().map(|&b| f16::from_bits(b).to_f32()).collect(),
            })
        }
        _ => return Err(Fault::Mistyped),
    };
    Ok(Value {
        dtype: to,
        dims: x.dims.clone(),
        elems,
    })
}

/// A tile of `dims` filled with the scalar `x`.
pub(crate) fn splat(x: &Value, dims: &[usize]) -> Value {
    let n: usize = dims.iter().product();
    let elems = match &x.elems {
        Elems::F(v) => Elems::F(vec![v[0]; n]),
        Elems::I(v) => Elems::I(vec![v[0]; n]),
        Elems::B(v) => Elems::B(vec![v[0]; n]),
    };
    Value {
        dtype: x.dtype,
        dims: dims.to_vec(),
        elems,
    }
}

/// An i32 tile of `dims` whose elements hold their index along `dim`.
pub(crate) fn iota(dims: &[usize], dim: usize) -> Value {
    let n: usize = dims.iter().product();
    // Row-major: the index along `dim` is (flat / inner) % extent, inner = product of later dims.
    let inner: usize = dims[dim + 1..].iter().product();
    let extent = dims[dim];
    let elems = (0..n).map(|f| ((f / inner) % extent) as i32).collect();
    Value {
        dtype: DType::I32,
        dims: dims.to_vec(),
        elems: Elems::I(elems),
    }
}

/// `x[R, C]` transposed to `[C, R]`.
pub(crate) fn transpose(x: &Value) -> Value {
    let (r, c) = x.rows_cols();
    fn t<T: Copy>(v: &[T], r: usize, c: usize) -> Vec<T> {
        (0..c)
            .flat_map(|j| (0..r).map(move |i| v[i * c + j]))
            .collect()
    }
    let elems = match &x.elems {
        Elems::F(v) => Elems::F(t(v, r, c)),
        Elems::I(v) => Elems::I(t(v, r, c)),
        Elems::B(v) => Elems::B(t(v, r, c)),
    };
    Value {
        dtype: x.dtype,
        dims: vec![c, r],
        elems,
    }
}

/// `x` gathered along `dim` at the indices `idx` ([`crate::kernel::OpKind::Take`]); `other`
/// where an index is outside `x`.
pub(crate) fn take(x: &Value, idx: &Value, other: &Value, dim: usize) -> Result<Value, Fault> {
    let Elems::I(iv) = &idx.elems else {
        return Err(Fault::Mistyped);
    };
    if dim >= x.dims.len() || idx.dims.len() != x.dims.len() {
        return Err(Fault::Mistyped);
    }
    let extent = x.dims[dim];
    // Row-major strides of x, and each result element's source position (None: `other`).
    let mut strides = vec![1usize; x.dims.len()];
    for d in (0..x.dims.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * x.dims[d + 1];
    }
    let src: Vec<Option<usize>> = (0..iv.len())
        .map(|flat| {
            let (mut rest, mut pos) = (flat, 0usize);
            for d in (0..idx.dims.len()).rev() {
                let c = rest % idx.dims[d];
                rest /= idx.dims[d];
                let c = if d == dim {
                    usize::try_from(iv[flat]).ok().filter(|&i| i < extent)?
                } else {
                    c
                };
                pos += c * strides[d];
            }
            Some(pos)
        })
        .collect();
    fn pick<T: Copy>(v: &[T], src: &[Option<usize>], other: T) -> Result<Vec<T>, Fault> {
        src.iter()
            .map(|s| match s {
                Some(p) => v.get(*p).copied().ok_or(Fault::Mistyped),
                None => Ok(other),
            })
            .collect()
    }
    let elems = match (&x.elems, &other.elems) {
        (Elems::F(v), Elems::F(o)) => Elems::F(pick(v, &src, *o.first().ok_or(Fault::Mistyped)?)?),
        (Elems::I(v), Elems::I(o)) => Elems::I(pick(v, &src, *o.first().ok_or(Fault::Mistyped)?)?),
        _ => return Err(Fault::Mistyped),
    };
    Ok(Value {
        dtype: x.dtype,
        dims: idx.dims.clone(),
        elems,
    })
}

/// Reduces dimension `dim` of a tile. Elements combine in index order, a float sum
/// pairwise (a balanced tree over the elements, as a GPU's threads, lanes and warps combine:
/// its error grows with the logarithm of the length, not the length); a float sum
/// accumulates in f32 and is rounded to the dtype once at the end; integer sums wrap.
pub(crate) fn reduce(op: ReduceOp, x: &Value, dim: usize) -> Result<Value, Fault> {
    if dim >= x.dims.len() {
        return Err(Fault::Mistyped);
    }
    // Row-major: `outer` blocks of `len` slices of `inner` elements; result `(o, i)` combines
    // elements `(o, k, i)` for k in order (a float sum pairwise).
    let outer: usize = x.dims[..dim].iter().product();
    let len = x.dims[dim];
    let inner: usize = x.dims[dim + 1..].iter().product();
    fn fold<T: Copy>(
        v: &[T],
        (outer, len, inner): (usize, usize, usize),
        init: T,
        f: impl Fn(T, T) -> T,
    ) -> Vec<T> {
        (0..outer)
            .flat_map(|o| (0..inner).map(move |i| (o, i)))
            .map(|(o, i)| (0..len).fold(init, |acc, k| f(acc, v[(o * len + k) * inner + i])))
            .collect()
    }
    let geom = (outer, len, inner);
    let mut dims = x.dims.clone();
    dims.remove(dim);
    let elems = match &x.elems {
        Elems::F(v) => {
            let mut out = match op {
                ReduceOp::Max => fold(v, geom, f32::NEG_INFINITY, f32::max),
                ReduceOp::Min => fold(v, geom, f32::INFINITY, f32::min),
                ReduceOp::Sum => (0..outer)
                    .flat_map(|o| (0..inner).map(move |i| (o, i)))
                    .map(|(o, i)| {
                        let run: Vec<f32> =
                            (0..len).map(|k| v[(o * len + k) * inner + i]).collect();
                        pairwise_sum(&run)
                    })
                    .collect(),
            };
            round_elems(x.dtype, &mut out);
            Elems::F(out)
        }
        Elems::I(v) if x.dtype == DType::U32 => {
            let v: Vec<u32> = v.iter().map(|&a| a as u32).collect();
            let out = match op {
                ReduceOp::Max => fold(&v, geom, 0, u32::max),
                ReduceOp::Min => fold(&v, geom, u32::MAX, u32::min),
                ReduceOp::Sum => fold(&v, geom, 0, u32::wrapping_add),
            };
            Elems::I(out.into_iter().map(|a| a as i32).collect())
        }
        Elems::I(v) => Elems::I(match op {
            ReduceOp::Max => fold(v, geom, i32::MIN, i32::max),
            ReduceOp::Min => fold(v, geom, i32::MAX, i32::min),
            ReduceOp::Sum => fold(v, geom, 0, i32::wrapping_add),
        }),
        Elems::B(_) => return Err(Fault::Mistyped),
    };
    Ok(Value {
        dtype: x.dtype,
        dims,
        elems,
    })
}

/// The f32 sum of `v` as a balanced tree: the halves split at a power of two, each summed
/// the same way.
fn pairwise_sum(v: &[f32]) -> f32 {
    match v.len() {
        0 => 0.0,
        1 => v[0],
        n => {
            let half = n.div_ceil(2).next_power_of_two().min(n - 1).max(1);
            pairwise_sum(&v[..half]) + pairwise_sum(&v[half..])
        }
    }
}

/// `x` permuted: result dimension `i` is `x`'s dimension `perm[i]`.
pub(crate) fn permute(x: &Value, perm: &[usize]) -> Result<Value, Fault> {
    let rank = x.dims.len();
    if perm.len() != rank || perm.iter().any(|&p| p >= rank) {
        return Err(Fault::Mistyped);
    }
    let dims: Vec<usize> = perm.iter().map(|&p| x.dims[p]).collect();
    let mut src_strides = vec![1usize; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        src_strides[d] = src_strides[d + 1] * x.dims[d + 1];
    }
    // Each result element's flat index in `x`, in the result's row-major order.
    let n: usize = dims.iter().product();
    let from: Vec<usize> = (0..n)
        .map(|mut flat| {
            let mut at = 0;
            for i in (0..rank).rev() {
                at += (flat % dims[i]) * src_strides[perm[i]];
                flat /= dims[i];
            }
            at
        })
        .collect();
    fn pick<T: Copy>(v: &[T], from: &[usize]) -> Vec<T> {
        from.iter().map(|&i| v[i]).collect()
    }
    let elems = match &x.elems {
        Elems::F(v) => Elems::F(pick(v, &from)),
        Elems::I(v) => Elems::I(pick(v, &from)),
        Elems::B(v) => Elems::B(pick(v, &from)),
    };
    Ok(Value {
        dtype: x.dtype,
        dims,
        elems,
    })
}

/// `v` (a scalar, or a tile broadcasting to `dims`) spread to `dims` and viewed as a flat
/// vector; a scalar stays a scalar.
fn flat_to(v: &Value, dims: &[usize]) -> Value {
    if v.dims.is_empty() {
        return v.clone();
    }
    let rank = dims.len();
    // `v` has `dims`' rank (the verifier's broadcasting rule); an extent of 1 repeats.
    let mut strides = vec![0usize; rank];
    let mut s = 1;
    for d in (0..rank).rev() {
        let n = v.dims.get(d).copied().unwrap_or(1);
        strides[d] = if n == 1 { 0 } else { s };
        s *= n;
    }
    let n: usize = dims.iter().product();
    let from: Vec<usize> = (0..n)
        .map(|mut flat| {
            let mut at = 0;
            for d in (0..rank).rev() {
                at += (flat % dims[d]) * strides[d];
                flat /= dims[d];
            }
            at
        })
        .collect();
    fn pick<T: Copy>(v: &[T], from: &[usize]) -> Vec<T> {
        from.iter().map(|&i| v[i]).collect()
    }
    let elems = match &v.elems {
        Elems::F(x) => Elems::F(pick(x, &from)),
        Elems::I(x) => Elems::I(pick(x, &from)),
        Elems::B(x) => Elems::B(pick(x, &from)),
    };
    Value {
        dtype: v.dtype,
        dims: vec![n],
        elems,
    }
}

/// `a[M, K] @ b[K, N] (+ c[M, N])` in f32. Each product of two bf16/f16 elements is exact in
/// f32; each output element starts from `c` (or 0) and adds the products for k = 0..K in
/// order, rounding to f32 after every addition.
pub(crate) fn mma(a: &Value, b: &Value, c: Option<&Value>) -> Result<Value, Fault> {
    let ((m, k), (k2, n)) = (a.rows_cols(), b.rows_cols());
    let (Elems::F(av), Elems::F(bv)) = (&a.elems, &b.elems) else {
        return Err(Fault::Mistyped);
    };
    if k != k2 {
        return Err(Fault::Mistyped);
    }
    let mut acc = match c.map(|c| &c.elems) {
        Some(Elems::F(cv)) if cv.len() == m * n => cv.clone(),
        Some(_) => return Err(Fault::Mistyped),
        None => vec![0.0; m * n],
    };
    // i-k-j order keeps the inner loop contiguous; each acc[i, j] still sees k ascending.
    for i in 0..m {
        let row = &mut acc[i * n..(i + 1) * n];
        for kk in 0..k {
            let x = av[i * k + kk];
            let brow = &bv[kk * n..(kk + 1) * n];
            for (o, &y) in row.iter_mut().zip(brow) {
                *o += x * y;
            }
        }
    }
    Ok(Value {
        dtype: DType::F32,
        dims: vec![m, n],
        elems: Elems::F(acc),
    })
}
