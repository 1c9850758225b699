//! Host arguments: checking them against the kernel's parameters, and tile loads and stores
//! that never touch memory outside a tensor (outside elements read 0; stores skip them, and a
//! bounded store those past its limit too).

use half::{bf16, f16};

use crate::host::{HostTensor, TensorData};
use crate::kernel::Param;
use crate::types::DType;

use super::HostArg;
use super::error::{ArgProblem, InterpError};
use super::eval::Fault;
use super::value::{Elems, Value};

impl HostArg<'_> {
    fn kind_name(&self) -> &'static str {
        match self {
            HostArg::Tensor(_) => "a read-only tensor",
            HostArg::TensorMut(_) => "a mutable tensor",
            HostArg::F32(_) => "an f32 scalar",
            HostArg::I32(_) => "an i32 scalar",
            HostArg::U32(_) => "a u32 scalar",
        }
    }

    /// The tensor behind a tensor argument.
    pub(crate) fn tensor(&self) -> Option<&HostTensor> {
        match self {
            HostArg::Tensor(t) => Some(t),
            HostArg::TensorMut(t) => Some(t),
            HostArg::F32(_) | HostArg::I32(_) | HostArg::U32(_) => None,
        }
    }
}

/// Checks every argument against its parameter: count, kind, dtype, rank, mutability,
/// contiguous innermost dimension, extents that fit i32, and data long enough for the
/// shape and strides.
pub(crate) fn check_args(params: &[Param], args: &[HostArg<'_>]) -> Result<(), InterpError> {
    if params.len() != args.len() {
        return Err(InterpError::ArgCount {
            expected: params.len(),
            found: args.len(),
        });
    }
    for (p, a) in params.iter().zip(args) {
        check_arg(p, a).map_err(|problem| InterpError::Arg {
            param: p.name().to_string(),
            problem,
        })?;
    }
    Ok(())
}

fn check_arg(p: &Param, a: &HostArg<'_>) -> Result<(), ArgProblem> {
    let found = a.kind_name();
    match p {
        Param::Scalar { dtype, .. } => match (dtype, a) {
            (DType::F32, HostArg::F32(_))
            | (DType::I32, HostArg::I32(_))
            | (DType::U32, HostArg::U32(_)) => Ok(()),
            _ => Err(ArgProblem::Kind {
                expected: if *dtype == DType::F32 {
                    "an f32 scalar"
                } else {
                    "an i32 scalar"
                },
                found,
            }),
        },
        Param::Tensor {
            dtype,
            rank,
            mutable,
            ..
        } => {
            let t = match (a, mutable) {
                (HostArg::TensorMut(t), _) => &**t,
                (HostArg::Tensor(t), false) => *t,
                (HostArg::Tensor(_), true) => return Err(ArgProblem::NotMutable),
                _ => {
                    return Err(ArgProblem::Kind {
                        expected: "a tensor",
                        found,
                    });
                }
            };
            check_tensor(t, *dtype, *rank)
        }
    }
}

fn check_tensor(t: &HostTensor, dtype: DType, rank: usize) -> Result<(), ArgProblem> {
    if t.dtype() != dtype {
        return Err(ArgProblem::DType {
            expected: dtype,
            found: t.dtype(),
        });
    }
    if t.shape.len() != rank || t.strides.len() != rank {
        return Err(ArgProblem::Rank {
            expected: rank,
            shape: t.shape.len(),
            strides: t.strides.len(),
        });
    }
    if let Some(&s) = t.strides.last()
        && s != 1
    {
        return Err(ArgProblem::InnerStride { stride: s });
    }
    if let Some((dim, &extent)) = t
        .shape
        .iter()
        .enumerate()
        .find(|&(_, &e)| i32::try_from(e).is_err())
    {
        return Err(ArgProblem::ExtentTooLarge { dim, extent });
    }
    if t.shape.contains(&0) {
        return Ok(());
    }
    // The last addressed element is at sum((extent - 1) * stride); it must be in `data`.
    let needed = t
        .shape
        .iter()
        .zip(&t.strides)
        .try_fold(1usize, |acc, (&e, &s)| {
            (e - 1).checked_mul(s).and_then(|x| x.checked_add(acc))
        });
    match needed {
        Some(n) if n <= t.data.len() => Ok(()),
        _ => Err(ArgProblem::DataTooShort {
            needed,
            len: t.data.len(),
        }),
    }
}

/// Whether `t`'s outer strides are multiples of 16 bytes (host addresses count as aligned).
pub(crate) fn is_aligned16(t: &HostTensor) -> bool {
    let size = t.dtype().size_bytes();
    let n = t.strides.len().saturating_sub(1);
    t.strides[..n]
        .iter()
        .all(|s| s.checked_mul(size).is_some_and(|b| b.is_multiple_of(16)))
}

/// Where a tile's elements live in a tensor's storage.
struct TileAddr {
    /// Offset of the outer (non-tile) coordinates.
    base: usize,
    /// Offset contributed by each tile row; `None` where the row is outside the tensor.
    rows: Vec<Option<usize>>,
    /// Offset contributed by each tile column; `None` where it is outside.
    cols: Vec<Option<usize>>,
}

impl TileAddr {
    /// Addresses a tile of `dims` at `coords`, covering `t`'s last `dims.len()` dimensions
    /// (a 1-D tile is one row, a 0-D one a single element). `None` if an outer coordinate is
    /// outside `t`, so that no element is. `bound`: a dimension and a limit that clips it
    /// (a bounded store's, [`crate::kernel::OpKind::Store`]).
    fn new(
        t: &HostTensor,
        coords: &[i32],
        dims: &[usize],
        bound: Option<(usize, i32)>,
    ) -> Option<TileAddr> {
        let rank = t.shape.len();
        let outer = rank.checked_sub(dims.len())?;
        if coords.len() != rank {
            return None;
        }
        let extents: Vec<usize> = (0..rank)
            .map(|d| match bound {
                Some((b, limit)) if b == d => t.shape[d].min(usize::try_from(limit).unwrap_or(0)),
                _ => t.shape[d],
            })
            .collect();
        let mut base = 0usize;
        for ((&c, &extent), &stride) in coords.iter().zip(&extents).zip(&t.strides).take(outer) {
            let c = usize::try_from(c).ok().filter(|&c| c < extent)?;
            base += c * stride;
        }
        // Offsets along one tile dimension that starts at tensor dimension `d`.
        let axis = |d: usize, n: usize| -> Vec<Option<usize>> {
            (0..n)
                .map(|i| {
                    let c = i64::from(coords[d]) + i as i64;
                    usize::try_from(c)
                        .ok()
                        .filter(|&c| c < extents[d])
                        .map(|c| c * t.strides[d])
                })
                .collect()
        };
        let Some((&c, lead)) = dims.split_last() else {
            return Some(TileAddr {
                base,
                rows: vec![Some(0)],
                cols: vec![Some(0)],
            });
        };
        // Every tile dimension but the last folds into the rows, in row-major order.
        let mut rows = vec![Some(0usize)];
        for (k, &n) in lead.iter().enumerate() {
            let along = axis(outer + k, n);
            rows = rows
                .iter()
                .flat_map(|r| along.iter().map(move |a| Some((*r)? + (*a)?)))
                .collect();
        }
        let cols = axis(rank - 1, c);
        Some(TileAddr { base, rows, cols })
    }

    /// The storage offset of each tile element in row-major order, `None` outside `t`.
    fn offsets(&self) -> impl Iterator<Item = Option<usize>> + '_ {
        self.rows.iter().flat_map(move |r| {
            self.cols
                .iter()
                .map(move |c| Some(self.base + (*r)? + (*c)?))
        })
    }
}

/// Loads a tile of `dims` at `coords` from `t` (no dims: the scalar there); elements outside
/// `t` read 0.
pub(crate) fn load(t: &HostTensor, coords: &[i32], dims: &[usize]) -> Value {
    let n: usize = dims.iter().product();
    let addr = TileAddr::new(t, coords, dims, None);
    fn gather<S: Copy, T: Copy + Default>(
        data: &[S],
        addr: Option<&TileAddr>,
        n: usize,
        conv: impl Fn(S) -> T,
    ) -> Vec<T> {
        match addr {
            Some(a) => a
                .offsets()
                .map(|o| {
                    o.and_then(|o| data.get(o))
                        .map_or(T::default(), |&x| conv(x))
                })
                .collect(),
            None => vec![T::default(); n],
        }
    }
    let a = addr.as_ref();
    let elems = match &t.data {
        TensorData::Bf16(d) => Elems::F(gather(d, a, n, bf16::to_f32)),
        TensorData::F16(d) => Elems::F(gather(d, a, n, f16::to_f32)),
        TensorData::F32(d) => Elems::F(gather(d, a, n, |x| x)),
        TensorData::I32(d) => Elems::I(gather(d, a, n, |x| x)),
        // u32 elements travel as their bit patterns; the value's dtype says how to read them.
        TensorData::U32(d) => Elems::I(gather(d, a, n, |x| x as i32)),
    };
    Value {
        dtype: t.dtype(),
        dims: dims.to_vec(),
        elems,
    }
}

/// Stores tile `v` at `coords` into `t`, skipping elements outside `t` and, given a `bound`
/// `(dim, limit)`, those whose coordinate along `dim` is `limit` or more. Float values are
/// already rounded to `t`'s dtype, so the narrowing conversion is exact.
pub(crate) fn store(
    t: &mut HostTensor,
    coords: &[i32],
    v: &Value,
    bound: Option<(usize, i32)>,
) -> Result<(), Fault> {
    let Some(addr) = TileAddr::new(t, coords, &v.dims, bound) else {
        return Ok(());
    };
    fn scatter<S, T: Copy>(data: &mut [S], addr: &TileAddr, src: &[T], conv: impl Fn(T) -> S) {
        for (o, &x) in addr.offsets().zip(src) {
            if let Some(slot) = o.and_then(|o| data.get_mut(o)) {
                *slot = conv(x);
            }
        }
    }
    match (&mut t.data, &v.elems) {
        (TensorData::Bf16(d), Elems::F(s)) => scatter(d, &addr, s, bf16::from_f32),
        (TensorData::F16(d), Elems::F(s)) => scatter(d, &addr, s, f16::from_f32),
        (TensorData::F32(d), Elems::F(s)) => scatter(d, &addr, s, |x| x),
        (TensorData::I32(d), Elems::I(s)) => scatter(d, &addr, s, |x| x),
        (TensorData::U32(d), Elems::I(s)) => scatter(d, &addr, s, |x| x as u32),
        // The verifier guarantees the tile's dtype equals the tensor's.
        _ => return Err(Fault::Mistyped),
    }
    Ok(())
}
