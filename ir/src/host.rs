//! Host-side tensors: the interpreter's arguments and the runtime's staging buffers.

use half::{bf16, f16};

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
}

impl TensorData {
    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            TensorData::Bf16(_) => DType::Bf16,
            TensorData::F16(_) => DType::F16,
            TensorData::F32(_) => DType::F32,
            TensorData::I32(_) => DType::I32,
        }
    }

    /// The number of stored elements.
    pub fn len(&self) -> usize {
        match self {
            TensorData::Bf16(v) => v.len(),
            TensorData::F16(v) => v.len(),
            TensorData::F32(v) => v.len(),
            TensorData::I32(v) => v.len(),
        }
    }

    /// Whether no element is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` widened to f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            TensorData::Bf16(v) => v[i].to_f64(),
            TensorData::F16(v) => v[i].to_f64(),
            TensorData::F32(v) => v[i] as f64,
            TensorData::I32(v) => v[i] as f64,
        }
    }

    /// Sets element `i`, rounding `x` to nearest even in the element type.
    pub fn set_f64(&mut self, i: usize, x: f64) {
        match self {
            TensorData::Bf16(v) => v[i] = bf16::from_f64(x),
            TensorData::F16(v) => v[i] = f16::from_f64(x),
            TensorData::F32(v) => v[i] = x as f32,
            TensorData::I32(v) => v[i] = x as i32,
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
    /// A contiguous row-major tensor of `shape` holding `data` (`data.len()` must equal the
    /// element count).
    pub fn new(shape: &[usize], data: TensorData) -> HostTensor {
        assert_eq!(
            shape.iter().product::<usize>(),
            data.len(),
            "shape and data length disagree"
        );
        HostTensor {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            data,
        }
    }

    /// A contiguous tensor of `shape` and `dtype` with every element set to `value`.
    pub fn full(shape: &[usize], dtype: DType, value: f64) -> HostTensor {
        let n = shape.iter().product();
        let data = match dtype {
            DType::Bf16 => TensorData::Bf16(vec![bf16::from_f64(value); n]),
            DType::F16 => TensorData::F16(vec![f16::from_f64(value); n]),
            DType::F32 => TensorData::F32(vec![value as f32; n]),
            DType::I32 | DType::Bool => TensorData::I32(vec![value as i32; n]),
        };
        HostTensor::new(shape, data)
    }

    /// A contiguous tensor of `shape` and `dtype` with elements `f(i)` for flat index `i`,
    /// rounded to the element type.
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
    pub fn to_f64_vec(&self) -> Vec<f64> {
        let n: usize = self.shape.iter().product();
        let mut out = Vec::with_capacity(n);
        let mut idx = vec![0usize; self.shape.len()];
        for _ in 0..n {
            out.push(self.data.get_f64(self.offset(&idx)));
            for d in (0..idx.len()).rev() {
                idx[d] += 1;
                if idx[d] < self.shape[d] {
                    break;
                }
                idx[d] = 0;
            }
        }
        out
    }
}

/// Row-major strides, in elements, for `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    strides
}
