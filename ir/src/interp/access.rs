//! The addressed memory ops under the interpreter: masked loads and gathers, masked stores
//! and scatters, and atomics, one element at a time in row-major order (so an atomic tile's
//! duplicate addresses accumulate in a defined order). No element outside the tensor or
//! masked off is touched.

use half::{bf16, f16};

use crate::access::tile_dim;
use crate::host::{HostTensor, TensorData};
use crate::kernel::{Access, Addr, AtomicOp};

use super::eval::Fault;
use super::value::{Elems, Value};

/// The row-major multi-indices of a tile of `dims`.
fn indices(dims: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = dims.iter().product();
    (0..n)
        .map(|mut flat| {
            let mut idx = vec![0; dims.len()];
            for k in (0..dims.len()).rev() {
                idx[k] = flat % dims[k];
                flat /= dims[k];
            }
            idx
        })
        .collect()
}

/// The flat position in `v` (a scalar, or a tile broadcasting to the accessed tile) of the
/// accessed tile's element `idx`.
fn at(v: &Value, idx: &[usize]) -> usize {
    if v.dims.is_empty() {
        return 0;
    }
    v.dims
        .iter()
        .zip(idx)
        .fold(0, |acc, (&n, &i)| acc * n + if n == 1 { 0 } else { i })
}

/// Per element of the tile of `dims`, its storage offset in `t`, or `None` where it is
/// outside `t` or masked off.
pub(crate) fn offsets(
    t: &HostTensor,
    access: &Access,
    addr: &[Value],
    mask: Option<&Value>,
    dims: &[usize],
) -> Result<Vec<Option<usize>>, Fault> {
    let rank = t.shape.len();
    if addr.len() != rank || access.dims.len() != rank {
        return Err(Fault::Mistyped);
    }
    let mut out = Vec::new();
    for idx in indices(dims) {
        let on = match mask {
            None => true,
            Some(m) => match &m.elems {
                Elems::B(b) => *b.get(at(m, &idx)).ok_or(Fault::Mistyped)?,
                _ => return Err(Fault::Mistyped),
            },
        };
        let mut offset = Some(0usize);
        for (d, (a, v)) in access.dims.iter().zip(addr).enumerate() {
            let Elems::I(x) = &v.elems else {
                return Err(Fault::Mistyped);
            };
            let c = match a {
                Addr::Coord => {
                    let off = tile_dim(d, rank, dims.len()).map_or(0, |k| idx[k]);
                    i64::from(*x.first().ok_or(Fault::Mistyped)?) + off as i64
                }
                Addr::Index => i64::from(*x.get(at(v, &idx)).ok_or(Fault::Mistyped)?),
            };
            offset = match (offset, usize::try_from(c)) {
                (Some(o), Ok(c)) if c < t.shape[d] => Some(o + c * t.strides[d]),
                _ => None,
            };
        }
        out.push(offset.filter(|_| on));
    }
    Ok(out)
}

/// A masked load or gather: each element from `t`, or `other` where it is skipped.
pub(crate) fn gather(
    t: &HostTensor,
    offs: &[Option<usize>],
    dims: &[usize],
    other: &Value,
) -> Result<Value, Fault> {
    fn pick<S: Copy, T: Copy>(
        data: &[S],
        offs: &[Option<usize>],
        other: T,
        conv: impl Fn(S) -> T,
    ) -> Vec<T> {
        offs.iter()
            .map(|o| o.and_then(|o| data.get(o)).map_or(other, |&x| conv(x)))
            .collect()
    }
    let elems = match (&t.data, &other.elems) {
        (TensorData::Bf16(d), Elems::F(o)) => Elems::F(pick(d, offs, o[0], bf16::to_f32)),
        (TensorData::F16(d), Elems::F(o)) => Elems::F(pick(d, offs, o[0], f16::to_f32)),
        (TensorData::F32(d), Elems::F(o)) => Elems::F(pick(d, offs, o[0], |x| x)),
        (TensorData::I32(d), Elems::I(o)) => Elems::I(pick(d, offs, o[0], |x| x)),
        _ => return Err(Fault::Mistyped),
    };
    Ok(Value {
        dtype: t.dtype(),
        dims: dims.to_vec(),
        elems,
    })
}

/// A masked store or scatter of `v`, in row-major order (the last of duplicates lands).
pub(crate) fn scatter(t: &mut HostTensor, offs: &[Option<usize>], v: &Value) -> Result<(), Fault> {
    fn put<S, T: Copy>(data: &mut [S], offs: &[Option<usize>], src: &[T], conv: impl Fn(T) -> S) {
        for (o, &x) in offs.iter().zip(src) {
            if let Some(slot) = o.and_then(|o| data.get_mut(o)) {
                *slot = conv(x);
            }
        }
    }
    match (&mut t.data, &v.elems) {
        (TensorData::Bf16(d), Elems::F(s)) => put(d, offs, s, bf16::from_f32),
        (TensorData::F16(d), Elems::F(s)) => put(d, offs, s, f16::from_f32),
        (TensorData::F32(d), Elems::F(s)) => put(d, offs, s, |x| x),
        (TensorData::I32(d), Elems::I(s)) => put(d, offs, s, |x| x),
        _ => return Err(Fault::Mistyped),
    }
    Ok(())
}

/// Element `i` of `v` broadcast to the accessed tile (`idx` its multi-index).
fn elem_f(v: &Value, idx: &[usize]) -> Result<f32, Fault> {
    match &v.elems {
        Elems::F(x) => x.get(at(v, idx)).copied().ok_or(Fault::Mistyped),
        _ => Err(Fault::Mistyped),
    }
}

fn elem_i(v: &Value, idx: &[usize]) -> Result<i32, Fault> {
    match &v.elems {
        Elems::I(x) => x.get(at(v, idx)).copied().ok_or(Fault::Mistyped),
        _ => Err(Fault::Mistyped),
    }
}

/// The float read-modify-write of one element (`m` as read, `v` applied, `c` compared).
fn rmw_f(op: AtomicOp, m: f32, v: f32, c: f32) -> f32 {
    match op {
        AtomicOp::Add => m + v,
        AtomicOp::Max => m.max(v),
        AtomicOp::Min => m.min(v),
        AtomicOp::Xchg => v,
        AtomicOp::Cas if m.to_bits() == c.to_bits() => v,
        AtomicOp::Cas => m,
    }
}

/// Atomic `op` of an integer element `m` with `v` (`c`: the compare value of a CAS).
fn rmw_int<T: Ord + Copy>(op: AtomicOp, m: T, v: T, c: T, add: fn(T, T) -> T) -> T {
    match op {
        AtomicOp::Add => add(m, v),
        AtomicOp::Max => m.max(v),
        AtomicOp::Min => m.min(v),
        AtomicOp::Xchg => v,
        AtomicOp::Cas if m == c => v,
        AtomicOp::Cas => m,
    }
}

/// Applies atomic `op` element by element in row-major order; returns the values read (0
/// where an element is skipped). 16-bit floats round each sum to their dtype, as the
/// hardware's 16-bit adds do.
pub(crate) fn atomic(
    t: &mut HostTensor,
    op: AtomicOp,
    offs: &[Option<usize>],
    v: &Value,
    compare: Option<&Value>,
) -> Result<Value, Fault> {
    let idxs = indices(&v.dims);
    fn run<S: Copy, T: Copy + Default>(
        data: &mut [S],
        offs: &[Option<usize>],
        idxs: &[Vec<usize>],
        mut step: impl FnMut(S, &[usize]) -> Result<(S, T), Fault>,
    ) -> Result<Vec<T>, Fault> {
        let mut old = Vec::with_capacity(offs.len());
        for (o, idx) in offs.iter().zip(idxs) {
            match o.and_then(|o| data.get_mut(o)) {
                Some(slot) => {
                    let (new, read) = step(*slot, idx)?;
                    *slot = new;
                    old.push(read);
                }
                None => old.push(T::default()),
            }
        }
        Ok(old)
    }
    let cmp_f = |idx: &[usize]| compare.map_or(Ok(0.0), |c| elem_f(c, idx));
    let cmp_i = |idx: &[usize]| compare.map_or(Ok(0), |c| elem_i(c, idx));
    let elems = match &mut t.data {
        TensorData::F32(d) => Elems::F(run(d, offs, &idxs, |m, idx| {
            Ok((rmw_f(op, m, elem_f(v, idx)?, cmp_f(idx)?), m))
        })?),
        TensorData::Bf16(d) => Elems::F(run(d, offs, &idxs, |m, idx| {
            let (mf, c) = (m.to_f32(), cmp_f(idx)?);
            Ok((bf16::from_f32(rmw_f(op, mf, elem_f(v, idx)?, c)), mf))
        })?),
        TensorData::F16(d) => Elems::F(run(d, offs, &idxs, |m, idx| {
            let (mf, c) = (m.to_f32(), cmp_f(idx)?);
            Ok((f16::from_f32(rmw_f(op, mf, elem_f(v, idx)?, c)), mf))
        })?),
        TensorData::I32(d) => Elems::I(run(d, offs, &idxs, |m, idx| {
            Ok((
                rmw_int(op, m, elem_i(v, idx)?, cmp_i(idx)?, i32::wrapping_add),
                m,
            ))
        })?),
        // u32 values travel as their bit patterns in i32 lanes.
        TensorData::U32(d) => Elems::I(run(d, offs, &idxs, |m, idx| {
            let (x, c) = (elem_i(v, idx)? as u32, cmp_i(idx)? as u32);
            Ok((rmw_int(op, m, x, c, u32::wrapping_add), m as i32))
        })?),
    };
    Ok(Value {
        dtype: v.dtype,
        dims: v.dims.clone(),
        elems,
    })
}
