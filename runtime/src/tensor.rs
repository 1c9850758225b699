//! Device tensors: a [`Layout`] over a shared device allocation, with strided views and
//! copies to and from [`HostTensor`]s.

use std::sync::Arc;

use cudarc::driver::{CudaContext, result, sys};
use half::{bf16, f16};
use kiln_ir::{DType, HostTensor, TensorData};

use crate::error::{DriverContext, RuntimeError};
use crate::layout::Layout;

/// A device allocation, freed when the last tensor viewing it is dropped, or (`owned`
/// false) memory another library owns and frees ([`crate::foreign`]).
#[derive(Debug)]
pub(crate) struct Buffer {
    ctx: Arc<CudaContext>,
    ptr: u64,
    bytes: usize,
    owned: bool,
}

impl Buffer {
    /// Allocates `bytes` (at least one, as the driver refuses empty allocations) on `ctx`.
    pub(crate) fn alloc(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Buffer, RuntimeError> {
        ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the context is current; the pointer is freed exactly once, in Drop.
        let ptr = unsafe { result::malloc_sync(bytes.max(1)) }.call("cuMemAlloc")?;
        Ok(Buffer {
            ctx: ctx.clone(),
            ptr,
            bytes,
            owned: true,
        })
    }

    /// `bytes` of device memory at `ptr` in `ctx` that someone else allocated and frees: kiln
    /// never frees it.
    ///
    /// # Safety
    /// The range must be device memory usable in `ctx` for as long as the buffer, and any
    /// work queued on it, lives.
    pub(crate) unsafe fn borrowed(ctx: &Arc<CudaContext>, ptr: u64, bytes: usize) -> Buffer {
        Buffer {
            ctx: ctx.clone(),
            ptr,
            bytes,
            owned: false,
        }
    }

    /// Identity of the owning context, compared at launch.
    pub(crate) fn context_id(&self) -> usize {
        self.ctx.cu_ctx() as usize
    }

    /// Copies `src` to byte offset `at` (synchronous; `at + src.len()` must be in bounds).
    fn write(&self, at: usize, src: &[u8]) -> Result<(), RuntimeError> {
        debug_assert!(at + src.len() <= self.bytes);
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the destination range lies inside this allocation (callers derive it from a
        // layout checked against `bytes`).
        unsafe { result::memcpy_htod_sync(self.ptr + at as u64, src) }.call("cuMemcpyHtoD")
    }

    /// Copies `len` bytes from byte offset `at` (synchronous; in bounds as for `write`).
    fn read(&self, at: usize, len: usize) -> Result<Vec<u8>, RuntimeError> {
        debug_assert!(at + len <= self.bytes);
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let mut out = vec![0u8; len];
        // SAFETY: the source range lies inside this allocation.
        unsafe { result::memcpy_dtoh_sync(&mut out, self.ptr + at as u64) }.call("cuMemcpyDtoH")?;
        Ok(out)
    }

    /// Fills `len` bytes from byte offset `at` with copies of `pattern` (1, 2 or 4 bytes, as
    /// the element size; `len` a multiple of it), on the null stream.
    fn memset(&self, at: usize, len: usize, pattern: &[u8]) -> Result<(), RuntimeError> {
        debug_assert!(at + len <= self.bytes && len.is_multiple_of(pattern.len()));
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let dst = self.ptr + at as u64;
        let stream = std::ptr::null_mut();
        // SAFETY: the range lies inside this allocation; counts are in units of the width.
        let rc = unsafe {
            match *pattern {
                [b] => sys::cuMemsetD8Async(dst, b, len, stream),
                [b0, b1] => {
                    sys::cuMemsetD16Async(dst, u16::from_le_bytes([b0, b1]), len / 2, stream)
                }
                [b0, b1, b2, b3] => sys::cuMemsetD32Async(
                    dst,
                    u32::from_le_bytes([b0, b1, b2, b3]),
                    len / 4,
                    stream,
                ),
                _ => {
                    return Err(RuntimeError::Shape {
                        what: "fill pattern",
                        expected: "1, 2 or 4 bytes".into(),
                        got: format!("{} bytes", pattern.len()),
                    });
                }
            }
        };
        rc.result().call("cuMemsetAsync")
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        self.ctx.record_err(self.ctx.bind_to_thread());
        // SAFETY: allocated by `malloc_sync` in `alloc`, freed only here.
        self.ctx.record_err(unsafe { result::free_sync(self.ptr) });
    }
}

/// A tensor in device memory: dynamic element type, shape and strides (in elements) over a
/// device allocation that views share. Cloning a tensor clones the view, not the data.
#[derive(Clone, Debug)]
pub struct DeviceTensor {
    buf: Arc<Buffer>,
    layout: Layout,
}

impl DeviceTensor {
    /// A tensor covering `buf` with `layout` (which must fit inside it).
    pub(crate) fn new(buf: Buffer, layout: Layout) -> DeviceTensor {
        DeviceTensor {
            buf: Arc::new(buf),
            layout,
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.layout.dtype
    }

    /// Extents, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.layout.shape
    }

    /// Strides in elements, outermost first.
    pub fn strides(&self) -> &[usize] {
        &self.layout.strides
    }

    /// The full layout (element type, shape, strides and offset in the allocation).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Device address of element `[0, .., 0]` (for passing the tensor to other CUDA libraries).
    pub fn device_ptr(&self) -> u64 {
        self.buf.ptr + (self.layout.offset * self.layout.dtype.size_bytes()) as u64
    }

    /// Device address of the start of the underlying allocation.
    pub fn alloc_ptr(&self) -> u64 {
        self.buf.ptr
    }

    /// Whether the view is 16-byte aligned ([`Layout::aligned16`] at its allocation's address):
    /// the fact a launch specialises each tensor parameter on ([`kiln_ir::dsl::Spec`]), so a
    /// caller that picks a loaded kernel itself picks it by this.
    pub fn aligned16(&self) -> bool {
        self.layout.aligned16(self.buf.ptr)
    }

    /// Size of the underlying allocation in bytes.
    pub fn alloc_bytes(&self) -> usize {
        self.buf.bytes
    }

    /// Identity of the device context the tensor lives on.
    pub(crate) fn context_id(&self) -> usize {
        self.buf.context_id()
    }

    /// The view with dimensions `a` and `b` swapped (no copy).
    pub fn transpose(&self, a: usize, b: usize) -> Result<DeviceTensor, RuntimeError> {
        Ok(DeviceTensor {
            buf: self.buf.clone(),
            layout: self.layout.transpose(a, b)?,
        })
    }

    /// The view of `len` elements of dimension `dim` from `start` (no copy).
    pub fn narrow(
        &self,
        dim: usize,
        start: usize,
        len: usize,
    ) -> Result<DeviceTensor, RuntimeError> {
        Ok(DeviceTensor {
            buf: self.buf.clone(),
            layout: self.layout.narrow(dim, start, len)?,
        })
    }

    /// A view with any `shape`, `strides` (elements) and element `offset` over the same
    /// allocation (no copy). Only the ranks, and that the view's byte extent fits in `usize`
    /// (so address arithmetic on it cannot overflow), are checked here: a view past the
    /// allocation's end is refused by [`Device::launch`](crate::Device::launch), `download`
    /// and fills, so tests can pass one to check exactly that.
    pub fn as_strided(
        &self,
        shape: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> Result<DeviceTensor, RuntimeError> {
        if shape.len() != strides.len() {
            return Err(RuntimeError::Shape {
                what: "as_strided strides",
                expected: format!("{} strides (one per dimension of {shape:?})", shape.len()),
                got: format!("{strides:?}"),
            });
        }
        let layout = Layout {
            dtype: self.layout.dtype,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
            offset,
        };
        if layout.end_byte().is_none() {
            return Err(RuntimeError::Shape {
                what: "as_strided view",
                expected: "a view whose last byte is addressable (below usize::MAX)".into(),
                got: format!("shape {shape:?}, strides {strides:?}, offset {offset}"),
            });
        }
        Ok(DeviceTensor {
            buf: self.buf.clone(),
            layout,
        })
    }

    /// The byte range `(start, len)` from the view's first element to one past its last, or
    /// an error if it does not lie inside the allocation.
    fn span(&self) -> Result<(usize, usize), RuntimeError> {
        let elem = self.layout.dtype.size_bytes();
        let start = self.layout.offset.saturating_mul(elem);
        match self.layout.end_byte() {
            Some(end) if end <= self.buf.bytes => Ok((start, end.max(start) - start)),
            end => Err(RuntimeError::Shape {
                what: "tensor view",
                expected: format!("a view inside the {}-byte allocation", self.buf.bytes),
                got: match end {
                    Some(end) => format!("a view ending at byte {end}"),
                    None => "a view whose extent overflows".to_string(),
                },
            }),
        }
    }

    /// Copies the view to the host as a contiguous tensor (synchronous).
    pub fn download(&self) -> Result<HostTensor, RuntimeError> {
        let (start, len) = self.span()?;
        let bytes = self.buf.read(start, len)?;
        let offsets: Vec<usize> = self
            .layout
            .elem_offsets()
            .into_iter()
            .map(|o| o - self.layout.offset)
            .collect();
        let data = decode(self.layout.dtype, &bytes, &offsets)?;
        Ok(HostTensor::new(&self.layout.shape, data)
            .expect("decode returns one element per index of the layout's shape"))
    }

    /// Sets every element of the view to `pattern` (one element's bytes), leaving the rest
    /// of the allocation alone.
    pub(crate) fn fill_pattern(&self, pattern: &[u8]) -> Result<(), RuntimeError> {
        let (start, len) = self.span()?;
        if self.layout.is_contiguous() {
            return self.buf.memset(start, len, pattern);
        }
        // Strided: read the span, overwrite the view's elements, write it back, so elements
        // between them (other views' data) keep their values.
        let mut bytes = self.buf.read(start, len)?;
        let elem = pattern.len();
        for o in self.layout.elem_offsets() {
            let at = (o - self.layout.offset) * elem;
            bytes[at..at + elem].copy_from_slice(pattern);
        }
        self.buf.write(start, &bytes)
    }

    /// Copies `host` (any strides; same shape and element type) into the view.
    pub fn copy_from_host(&self, host: &HostTensor) -> Result<(), RuntimeError> {
        if host.shape != self.layout.shape || host.dtype() != self.layout.dtype {
            return Err(RuntimeError::Shape {
                what: "copy_from_host source",
                expected: format!(
                    "a {} tensor of shape {:?}",
                    self.layout.dtype, self.layout.shape
                ),
                got: format!("a {} tensor of shape {:?}", host.dtype(), host.shape),
            });
        }
        let src = encode(host)?;
        if self.layout.is_contiguous() {
            let (start, _) = self.span()?;
            return self.buf.write(start, &src);
        }
        let (start, len) = self.span()?;
        let mut bytes = self.buf.read(start, len)?;
        let elem = self.layout.dtype.size_bytes();
        for (i, o) in self.layout.elem_offsets().into_iter().enumerate() {
            let at = (o - self.layout.offset) * elem;
            bytes[at..at + elem].copy_from_slice(&src[i * elem..(i + 1) * elem]);
        }
        self.buf.write(start, &bytes)
    }
}

/// The elements of `host` in row-major order of its shape, as little-endian bytes.
pub(crate) fn encode(host: &HostTensor) -> Result<Vec<u8>, RuntimeError> {
    let layout = Layout {
        dtype: host.dtype(),
        shape: host.shape.clone(),
        strides: host.strides.clone(),
        offset: 0,
    };
    if layout.end_elem().is_none_or(|end| end > host.data.len())
        || host.strides.len() != host.shape.len()
    {
        return Err(RuntimeError::Shape {
            what: "host tensor",
            expected: format!(
                "storage covering shape {:?} with strides {:?}",
                host.shape, host.strides
            ),
            got: format!("{} stored elements", host.data.len()),
        });
    }
    let offsets = layout.elem_offsets();
    let mut out = Vec::with_capacity(offsets.len() * layout.dtype.size_bytes());
    match &host.data {
        TensorData::Bf16(v) => offsets
            .iter()
            .for_each(|&o| out.extend_from_slice(&v[o].to_bits().to_le_bytes())),
        TensorData::F16(v) => offsets
            .iter()
            .for_each(|&o| out.extend_from_slice(&v[o].to_bits().to_le_bytes())),
        TensorData::F32(v) => offsets
            .iter()
            .for_each(|&o| out.extend_from_slice(&v[o].to_le_bytes())),
        TensorData::I32(v) => offsets
            .iter()
            .for_each(|&o| out.extend_from_slice(&v[o].to_le_bytes())),
        TensorData::U32(v) => offsets
            .iter()
            .for_each(|&o| out.extend_from_slice(&v[o].to_le_bytes())),
    }
    Ok(out)
}

/// The elements of `dtype` at element `offsets` of `bytes`, in that order.
pub(crate) fn decode(
    dtype: DType,
    bytes: &[u8],
    offsets: &[usize],
) -> Result<TensorData, RuntimeError> {
    let elem = dtype.size_bytes();
    let at = |o: usize| &bytes[o * elem..(o + 1) * elem];
    let b2 = |o: usize| u16::from_le_bytes([at(o)[0], at(o)[1]]);
    let b4 = |o: usize| {
        let s = at(o);
        [s[0], s[1], s[2], s[3]]
    };
    Ok(match dtype {
        DType::Bf16 => TensorData::Bf16(offsets.iter().map(|&o| bf16::from_bits(b2(o))).collect()),
        DType::F16 => TensorData::F16(offsets.iter().map(|&o| f16::from_bits(b2(o))).collect()),
        DType::F32 => TensorData::F32(offsets.iter().map(|&o| f32::from_le_bytes(b4(o))).collect()),
        DType::I32 => TensorData::I32(offsets.iter().map(|&o| i32::from_le_bytes(b4(o))).collect()),
        DType::U32 => TensorData::U32(offsets.iter().map(|&o| u32::from_le_bytes(b4(o))).collect()),
        DType::Bool => {
            return Err(RuntimeError::Shape {
                what: "download",
                expected: "a bf16, f16, f32, i32 or u32 tensor (host tensors hold no bool)".into(),
                got: "a bool tensor".into(),
            });
        }
    })
}

/// One element's bytes of a quiet NaN of `dtype`, used to poison outputs. Integers have no
/// NaN: they get the f32 NaN's bit pattern (`0x7FC00000`), which no test expects as a result.
pub(crate) fn nan_pattern(dtype: DType) -> Vec<u8> {
    match dtype {
        DType::Bf16 => 0x7FC0u16.to_le_bytes().to_vec(),
        DType::F16 => 0x7E00u16.to_le_bytes().to_vec(),
        DType::F32 | DType::I32 | DType::U32 => 0x7FC0_0000u32.to_le_bytes().to_vec(),
        DType::Bool => vec![0xFF],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_gathers_strided_host_tensors_in_row_major_order() {
        let mut t = HostTensor::from_fn(&[2, 3], DType::F32, |i| i as f64);
        // View it transposed: shape [3, 2], strides [1, 3].
        t.shape = vec![3, 2];
        t.strides = vec![1, 3];
        let bytes = encode(&t).expect("valid");
        let got: Vec<f32> = bytes
            .chunks(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(got, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }

    #[test]
    fn encode_rejects_storage_shorter_than_the_strides_need() {
        let mut t = HostTensor::from_fn(&[2, 3], DType::F32, |i| i as f64);
        t.strides = vec![4, 1];
        let err = encode(&t).expect_err("needs 7 elements");
        assert!(err.to_string().contains("6 stored elements"), "{err}");
    }

    #[test]
    fn decode_round_trips_every_dtype() {
        for dtype in [DType::Bf16, DType::F16, DType::F32, DType::I32, DType::U32] {
            let t = HostTensor::from_fn(&[5], dtype, |i| i as f64 * 1.5 + 2.0);
            let bytes = encode(&t).expect("valid");
            let back = decode(dtype, &bytes, &[0, 1, 2, 3, 4]).expect("decodes");
            assert_eq!(back, t.data, "{dtype}");
        }
    }

    #[test]
    fn nan_patterns_are_nans() {
        let b = nan_pattern(DType::Bf16);
        assert!(bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).is_nan());
        let h = nan_pattern(DType::F16);
        assert!(f16::from_bits(u16::from_le_bytes([h[0], h[1]])).is_nan());
        let f = nan_pattern(DType::F32);
        assert!(f32::from_le_bytes([f[0], f[1], f[2], f[3]]).is_nan());
    }
}
