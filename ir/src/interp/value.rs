//! Runtime values of the interpreter: scalars and tiles stored as flat row-major vectors.
//!
//! Float elements of every float dtype are held as `f32`; a bf16 or f16 value always holds
//! an `f32` that is exactly representable in its dtype (every op rounds its result with
//! [`round_elems`]), so widening back is never needed.

use half::{bf16, f16};

use crate::types::{DType, Shape, Type};

/// Flat element storage. Which variant a value uses follows from its dtype: floats in `F`,
/// `i32` and `u32` in `I` (a `u32` as its bit pattern), `bool` in `B`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Elems {
    /// bf16, f16 and f32 elements, widened to f32.
    F(Vec<f32>),
    /// i32 elements, and u32 elements as their bit patterns.
    I(Vec<i32>),
    /// Predicates.
    B(Vec<bool>),
}

impl Elems {
    /// The number of elements.
    pub(crate) fn len(&self) -> usize {
        match self {
            Elems::F(v) => v.len(),
            Elems::I(v) => v.len(),
            Elems::B(v) => v.len(),
        }
    }
}

/// A scalar (empty `dims`) or a tile of rank 1 or 2 with row-major `elems`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Value {
    /// Element type.
    pub(crate) dtype: DType,
    /// Tile extents, outermost first; empty for a scalar.
    pub(crate) dims: Vec<usize>,
    /// `dims.iter().product()` elements (one for a scalar).
    pub(crate) elems: Elems,
}

impl Value {
    /// A scalar i32.
    pub(crate) fn i32(v: i32) -> Value {
        Value {
            dtype: DType::I32,
            dims: Vec::new(),
            elems: Elems::I(vec![v]),
        }
    }

    /// A scalar u32 (stored as its bit pattern).
    pub(crate) fn u32(v: u32) -> Value {
        Value {
            dtype: DType::U32,
            dims: Vec::new(),
            elems: Elems::I(vec![v as i32]),
        }
    }

    /// A scalar float of `dtype`, rounded to it.
    pub(crate) fn float(dtype: DType, v: f32) -> Value {
        Value {
            dtype,
            dims: Vec::new(),
            elems: Elems::F(vec![round(dtype, v)]),
        }
    }

    /// A scalar bool.
    pub(crate) fn bool(v: bool) -> Value {
        Value {
            dtype: DType::Bool,
            dims: Vec::new(),
            elems: Elems::B(vec![v]),
        }
    }

    /// The IR type this value has.
    pub(crate) fn ty(&self) -> Type {
        if self.dims.is_empty() {
            Type::Scalar(self.dtype)
        } else {
            Type::Tile {
                dtype: self.dtype,
                shape: Shape(self.dims.clone()),
            }
        }
    }

    /// The `(rows, cols)` view used by every kernel loop: a scalar is `1x1`, a rank-1 tile
    /// of extent `n` is `1xn`.
    pub(crate) fn rows_cols(&self) -> (usize, usize) {
        match self.dims.as_slice() {
            [] => (1, 1),
            [n] => (1, *n),
            [r, c, ..] => (*r, *c),
        }
    }

    /// The single element of a scalar i32, or `None` if this is not one.
    pub(crate) fn as_i32(&self) -> Option<i32> {
        match (&self.elems, self.dims.is_empty()) {
            (Elems::I(v), true) => v.first().copied(),
            _ => None,
        }
    }

    /// The single element of a scalar bool, or `None` if this is not one.
    pub(crate) fn as_bool(&self) -> Option<bool> {
        match (&self.elems, self.dims.is_empty()) {
            (Elems::B(v), true) => v.first().copied(),
            _ => None,
        }
    }
}

/// Rounds an f32 to the nearest value of the float `dtype` (ties to even); identity for f32
/// and non-float dtypes.
pub(crate) fn round(dtype: DType, x: f32) -> f32 {
    match dtype {
        DType::Bf16 => bf16::from_f32(x).to_f32(),
        DType::F16 => f16::from_f32(x).to_f32(),
        DType::F32 | DType::I32 | DType::U32 | DType::Bool => x,
    }
}

/// Rounds every element to `dtype` in place (a no-op for f32).
pub(crate) fn round_elems(dtype: DType, v: &mut [f32]) {
    if matches!(dtype, DType::Bf16 | DType::F16) {
        for x in v {
            *x = round(dtype, *x);
        }
    }
}

/// Element strides `(row, col)` with which `v` is read when broadcast to an output of
/// `rows x cols`: a scalar and every extent-1 dimension read with stride 0.
pub(crate) fn broadcast_strides(v: &Value, rows: usize, cols: usize) -> (usize, usize) {
    let (r, c) = v.rows_cols();
    if v.dims.is_empty() {
        return (0, 0);
    }
    let col_stride = if c == 1 && cols != 1 { 0 } else { 1 };
    let row_stride = if r == 1 && rows != 1 { 0 } else { c };
    (row_stride, col_stride)
}

/// The broadcast result dims of operands (scalars broadcast everywhere), or `None` if the
/// tile shapes disagree (the verifier rejects such kernels).
pub(crate) fn broadcast_dims(values: &[&Value]) -> Option<Vec<usize>> {
    let mut out: Option<Shape> = None;
    for v in values.iter().filter(|v| !v.dims.is_empty()) {
        let s = Shape(v.dims.clone());
        out = Some(match out {
            None => s,
            Some(o) => o.broadcast(&s)?,
        });
    }
    Some(out.map(|s| s.0).unwrap_or_default())
}

/// Builds `rows x cols` elements `f(a[i, j], b[i, j])` reading `a` and `b` with the given
/// broadcast strides.
pub(crate) fn zip_with<A: Copy, B: Copy, R>(
    (a, sa): (&[A], (usize, usize)),
    (b, sb): (&[B], (usize, usize)),
    (rows, cols): (usize, usize),
    mut f: impl FnMut(A, B) -> R,
) -> Vec<R> {
    let mut out = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        let (ra, rb) = (i * sa.0, i * sb.0);
        for j in 0..cols {
            out.push(f(a[ra + j * sa.1], b[rb + j * sb.1]));
        }
    }
    out
}
