//! Memory and streams kiln does not own: tensors over device memory another library allocated
//! (PyTorch's caching allocator) and launches on that library's stream, so a kiln kernel joins
//! the caller's work with no copy and no synchronisation. Both rest on one CUDA context:
//! [`Device::new`] retains the device's *primary* context (`cuDevicePrimaryCtxRetain`), the one
//! the CUDA runtime, and so PyTorch, allocates and creates streams in. Nothing can check that a
//! raw address or stream is what the caller says, so the constructors are `unsafe`; the rest
//! (alignment, extents, arguments against the signature) is checked as for kiln's own tensors.

use cudarc::driver::sys;
use kiln_ir::DType;
use kiln_ir::dsl::{KernelDef, ParamSig};

use crate::device::{Device, KernelArg};
use crate::error::{LaunchError, RuntimeError};
use crate::layout::Layout;
use crate::module::LoadedKernel;
use crate::tensor::{Buffer, DeviceTensor};

/// A CUDA stream of the device's context that kiln did not create and never destroys (such as
/// `torch.cuda.current_stream().cuda_stream`). A launch on it runs after the work queued on
/// it before, and before the work queued after, as for any other kernel on that stream.
#[derive(Clone, Copy, Debug)]
pub struct ForeignStream(sys::CUstream);

impl ForeignStream {
    /// The stream whose driver handle is `handle` (0: the legacy default stream, which is
    /// what PyTorch's default stream is).
    ///
    /// # Safety
    /// `handle` must be 0 or a live `CUstream` of the context of the [`Device`] it is used
    /// with, and stay alive until every launch made on it has completed.
    pub unsafe fn from_raw(handle: u64) -> ForeignStream {
        ForeignStream(handle as usize as sys::CUstream)
    }

    /// The driver handle.
    pub fn as_raw(&self) -> u64 {
        self.0 as usize as u64
    }
}

impl Device {
    /// A tensor over device memory kiln did not allocate and never frees: element
    /// `[0, .., 0]` at device address `ptr`, `shape` and `strides` (in elements, outermost
    /// first) as the owner describes it. No copy is made; the view may be strided any way a
    /// kiln launch accepts (innermost stride 1, other strides free, overlapping included).
    ///
    /// Checked: one stride per dimension, `ptr` aligned to the element size, and an extent
    /// that fits in `usize` bytes. The tensor's allocation, as launch validation sees it, is
    /// exactly the bytes the view addresses.
    ///
    /// # Safety
    /// Every element the view addresses must be device memory of this device's context (an
    /// allocation of the primary context, such as one of PyTorch's) that stays allocated
    /// until the returned tensor, its clones, and every launch that uses them are done.
    pub unsafe fn borrow_tensor(
        &self,
        ptr: u64,
        dtype: DType,
        shape: &[usize],
        strides: &[usize],
    ) -> Result<DeviceTensor, RuntimeError> {
        let (layout, bytes) = borrowed_layout(ptr, dtype, shape, strides)?;
        // SAFETY: the caller guarantees the addressed range, which is `ptr..ptr + bytes`.
        let buf = unsafe { Buffer::borrowed(self.cuda_context(), ptr, bytes) };
        Ok(DeviceTensor::new(buf, layout))
    }

    /// [`Device::launch`] on `stream` instead of the null stream: the same validation,
    /// specialisation and compile cache. Asynchronous with respect to the host, ordered on
    /// `stream`.
    pub fn launch_on_stream<K: KernelDef + ?Sized>(
        &self,
        stream: ForeignStream,
        def: &K,
        comptime: &K::Comptime,
        grid: [u32; 3],
        args: &[KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        // SAFETY: `ForeignStream::from_raw`'s contract makes the handle a live stream of this
        // device's context (or null).
        unsafe { self.launch_on(stream.0, def, comptime, grid, args) }
    }

    /// [`Device::launch_loaded`] on `stream`: an already loaded kernel (hand-written PTX),
    /// validated against `signature`, ordered on `stream`.
    pub fn launch_loaded_on_stream(
        &self,
        stream: ForeignStream,
        kernel: &LoadedKernel,
        signature: &[ParamSig],
        grid: [u32; 3],
        args: &[KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        // SAFETY: as for `launch_on_stream`.
        unsafe { self.launch_loaded_on(stream.0, kernel, signature, grid, args) }
    }
}

/// The layout of a borrowed view and the bytes it addresses from `ptr`, or why it cannot be
/// one (the checks [`Device::borrow_tensor`] makes, apart from a device, for unit tests).
fn borrowed_layout(
    ptr: u64,
    dtype: DType,
    shape: &[usize],
    strides: &[usize],
) -> Result<(Layout, usize), RuntimeError> {
    if shape.len() != strides.len() {
        return Err(RuntimeError::Shape {
            what: "borrowed tensor strides",
            expected: format!("{} strides (one per dimension of {shape:?})", shape.len()),
            got: format!("{strides:?}"),
        });
    }
    let elem = dtype.size_bytes() as u64;
    if !ptr.is_multiple_of(elem) {
        return Err(RuntimeError::Shape {
            what: "borrowed tensor address",
            expected: format!("a multiple of the {dtype} element size ({elem} bytes)"),
            got: format!("{ptr:#x}"),
        });
    }
    let layout = Layout {
        dtype,
        shape: shape.to_vec(),
        strides: strides.to_vec(),
        offset: 0,
    };
    let bytes = layout.end_byte().ok_or_else(|| RuntimeError::Shape {
        what: "borrowed tensor",
        expected: "a view whose last byte is addressable (below usize::MAX)".into(),
        got: format!("shape {shape:?}, strides {strides:?}"),
    })?;
    Ok((layout, bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kiln_ir::HostTensor;

    #[test]
    fn a_bshd_view_borrows_exactly_the_bytes_it_addresses() {
        // q of shape [b=2, s=3, h=4, d=8] viewed as [b, h, s, d].
        let (b, s, h, d) = (2, 3, 4, 8);
        let (layout, bytes) = borrowed_layout(
            0x1000,
            DType::Bf16,
            &[b, h, s, d],
            &[s * h * d, d, h * d, 1],
        )
        .expect("valid view");
        assert_eq!(bytes, b * s * h * d * 2);
        assert!(!layout.is_contiguous());
        assert!(layout.aligned16(0x1000));
    }

    #[test]
    fn bad_views_are_errors_naming_the_rule() {
        let err = borrowed_layout(0x1001, DType::Bf16, &[4], &[1]).expect_err("odd address");
        assert!(err.to_string().contains("element size (2 bytes)"), "{err}");
        let err = borrowed_layout(0x1000, DType::F32, &[4, 4], &[1]).expect_err("one stride");
        assert!(err.to_string().contains("2 strides"), "{err}");
        let err =
            borrowed_layout(0, DType::F32, &[3, 2], &[usize::MAX / 2, 1]).expect_err("overflow");
        assert!(err.to_string().contains("addressable"), "{err}");
        let (_, bytes) = borrowed_layout(0x1000, DType::F32, &[0, 5], &[5, 1]).expect("empty");
        assert_eq!(bytes, 0);
    }

    /// On a GPU: a borrowed view of kiln's own allocation reads the same elements, and
    /// dropping it leaves the allocation alone (the owner still reads it). Without a driver
    /// there is no memory to borrow, and the test checks only that opening a device fails.
    #[test]
    fn borrowed_memory_is_read_in_place_and_never_freed() {
        let dev = match Device::new(0) {
            Ok(dev) => dev,
            Err(e) => {
                assert!(matches!(e, RuntimeError::NoDriver { .. }), "{e}");
                return;
            }
        };
        let host = HostTensor::from_fn(&[2, 3, 4], DType::F32, |i| i as f64);
        let owner = dev.upload(&host).expect("upload");
        // SAFETY: the view addresses `owner`'s allocation, which outlives it.
        let view =
            unsafe { dev.borrow_tensor(owner.device_ptr(), DType::F32, &[2, 4, 3], &[12, 1, 4]) }
                .expect("valid view");
        let got = view.download().expect("download");
        let want = owner
            .transpose(1, 2)
            .expect("valid")
            .download()
            .expect("download");
        assert_eq!(got.data, want.data);
        drop(view);
        assert_eq!(owner.download().expect("still allocated").data, host.data);
    }
}
