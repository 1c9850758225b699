//! Host-side tensors: the interpreter's arguments and the runtime's staging buffers.

use half::{bf16, f16};
use thiserror::Error;

use crate::rounding;
use crate::types::DType;

/// Element storage of a host tensor.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorData {
    /// bfloat16 elements.
    Bf16(Vec<bf16>),
    /// binary16 elements.
    F16(Vec<f16>),
    /// binary32 elements.
    F32(Vec<f32>),
    /// 32-bit integers.
    I32(Vec<i32>),
    /// 32-bit unsigned integers.
    U32(Vec<u32>),
}

impl TensorData {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::Bf16(_) => DType::Bf16,
            TensorData::F16(_) => DType::F16,
            TensorData::F32(_) => DType::F32,
            TensorData::I32(_) => DType::I32,
            TensorData::U32(_) => DType::U32,
        }
    }

    /// The number of stored elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::Bf16(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::F32(v) => v.len(),
            TensorData::I32(v) => v.len(),
            TensorData::U32(v) => v.len(),
        }
    }

    /// Whether no element is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f64.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`, as slice indexing does.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            TensorData::Bf16(v) => v[i].to_f64(),
            TensorData::F16(v) => v[i].to_f64(),
            TensorData::F32(v) => v[i] as f64,
            TensorData::I32(v) => v[i] as f64,
            TensorData::U32(v) => f64::from(v[i]),
        }
    }

    /// Sets element `i`, rounding `x` to nearest even in the element type.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`, as slice indexing does.
    pub fn set_f64(&mut self, i: usize, x: f64) {
        match self {
            TensorData::Bf16(v) => v[i] = rounding::to_bf16(x),
            TensorData::F16(v) => v[i] = rounding::to_f16(x),
            TensorData::F32(v) => v[i] = x as f32,
            TensorData::I32(v) => v[i] = x as i32,
            TensorData::U32(v) => v[i] = x as u32,
        }
    }
}

/// A strided tensor in host memory. Strides are in elements, outermost dimension first.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Extents, outermost first.
    pub shape: Vec<usize>,
    /// Strides in elements, outermost first.
    pub strides: Vec<usize>,
    /// Storage; every element addressed by `shape`/`strides` lies inside it.
    pub data: TensorData,
}

impl HostTensor {
    /// A contiguous row-major tensor of `shape` holding `data`; an error unless `data.len()`
    /// equals the element count of `shape`.
    pub fn new(shape: &[usize], data: TensorData) -> Result<HostTensor, HostTensorError> {
        let elements = shape.iter().try_fold(1usize, |n, &e| n.checked_mul(e));
        if elements != Some(data.len()) {
            return Err(HostTensorError::DataLength {
                shape: shape.to_vec(),
                elements,
                len: data.len(),
            });
        }
        Ok(HostTensor {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            data,
        })
    }

    /// A contiguous tensor of `shape` and `dtype` with every element set to `value` (bool
    /// tensors are stored as i32).
    ///
    /// # Panics
    ///
    /// If the element count overflows `usize` or cannot be allocated, as `vec!` does.
    pub fn full(shape: &[usize], dtype: DType, value: f64) -> HostTensor {
        let n = shape.iter().product();
        let data = match dtype {
            DType::Bf16 => TensorData::Bf16(vec![rounding::to_bf16(value); n]),
            DType::F16 => TensorData::F16(vec![rounding::to_f16(value); n]),
            DType::F32 => TensorData::F32(vec![value as f32; n]),
            DType::I32 | DType::Bool => TensorData::I32(vec![value as i32; n]),
            DType::U32 => TensorData::U32(vec![value as u32; n]),
        };
        HostTensor {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            data,
        }
    }

    /// A contiguous tensor of `shape` and `dtype` with elements `f(i)` for flat index `i`,
    /// rounded to the element type.
    ///
    /// # Panics
    ///
    /// As [`HostTensor::full`].
    pub fn from_fn(shape: &[usize], dtype: DType, mut f: impl FnMut(usize) -> f64) -> HostTensor {
        let mut t = HostTensor::full(shape, dtype, 0.0);
        for i in 0..t.data.len() {
            t.data.set_f64(i, f(i));
        }
        t
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.data.dtype()
    }

    /// The storage offset of the element at `index` (one entry per dimension).
    pub fn offset(&self, index: &[usize]) -> usize {
        index.iter().zip(&self.strides).map(|(i, s)| i * s).sum()
    }

    /// Every element in row-major order of `shape`, widened to f64.
    ///
    /// # Panics
    ///
    /// If `shape` and `strides` address an element past the end of `data` (the fields are
    /// public, so nothing else keeps them consistent).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        row_major_offsets(&self.shape, &self.strides)
            .into_iter()
            .map(|o| self.data.get_f64(o))
            .collect()
    }
}

/// Why a [`HostTensor`] could not be made.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum HostTensorError {
    /// The data does not hold exactly one element per index of the shape.
    #[error("shape {shape:?} has {} elements, but the data holds {len}", .elements.map_or("more than usize::MAX".to_string(), |n| n.to_string()))]
    DataLength {
        /// The shape asked for.
        shape: Vec<usize>,
        /// Its element count (`None` if that overflows `usize`).
        elements: Option<usize>,
        /// Elements in the data.
        len: usize,
    },
}

/// The storage offset, `sum(index[d] * strides[d])`, of every index of `shape` in row-major
/// order: the one walk that host copies, device views and reference checks share.
pub fn row_major_offsets(shape: &[usize], strides: &[usize]) -> Vec<usize> {
    let n: usize = shape.iter().product();
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; shape.len()];
    for _ in 0..n {
        out.push(idx.iter().zip(strides).map(|(i, s)| i * s).sum());
        for d in (0..idx.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

/// Row-major strides, in elements, for `shape`. A stride past `usize::MAX` saturates, so a
/// caller's checked size arithmetic reports the overflow instead of this function panicking.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1].saturating_mul(shape[d + 1]);
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_rejects_data_of_the_wrong_length() {
        let err = HostTensor::new(&[2, 3], TensorData::F32(vec![0.0; 5])).expect_err("5 != 6");
        assert_eq!(
            err.to_string(),
            "shape [2, 3] has 6 elements, but the data holds 5"
        );
        let err = HostTensor::new(&[usize::MAX, 2], TensorData::F32(vec![])).expect_err("overflow");
        assert!(err.to_string().contains("more than usize::MAX"), "{err}");
        let t = HostTensor::new(&[2, 3], TensorData::I32(vec![0; 6])).expect("6 elements");
        assert_eq!(t.strides, [3, 1]);
    }

    #[test]
    fn row_major_offsets_follow_strides() {
        // [2, 3] row-major viewed transposed: shape [3, 2], strides [1, 3].
        assert_eq!(row_major_offsets(&[3, 2], &[1, 3]), [0, 3, 1, 4, 2, 5]);
        assert!(row_major_offsets(&[4, 0], &[0, 1]).is_empty());
        assert_eq!(row_major_offsets(&[], &[]), [0]);
    }

    #[test]
    fn contiguous_strides_saturate_instead_of_overflowing() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), [12, 4, 1]);
        assert_eq!(contiguous_strides(&[1, usize::MAX, 2]), [usize::MAX, 2, 1]);
    }
}
