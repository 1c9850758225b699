//! TMA tensor maps: the 128-byte `CUtensorMap` descriptor a Hopper/Blackwell kernel passes to
//! `cp.async.bulk.tensor`, encoded by the driver's `cuTensorMapEncodeTiled` after kiln has
//! checked every rule the driver imposes.

use cudarc::driver::sys;
use kiln_ir::DType;

use crate::error::{DriverContext, RuntimeError};
use crate::layout::Layout;
use crate::tensor::DeviceTensor;
use crate::tma_rules::{
    MAX_BOX, MAX_EXTENT, MAX_RANK, MAX_STRIDE_BYTES, MapEncoding, Swizzle, TMA_ALIGN,
    TensorMapError,
};

/// The driver's arguments for one map, innermost dimension first, after validation.
#[derive(Clone, Debug, PartialEq, Eq)]
struct EncodeArgs {
    dtype: sys::CUtensorMapDataType,
    rank: usize,
    /// Extents, innermost first.
    global_dim: [u64; MAX_RANK],
    /// Byte strides of dimensions 1..rank (innermost first); dimension 0 is implied.
    global_strides: [u64; MAX_RANK - 1],
    /// Box extents, innermost first.
    box_dim: [u32; MAX_RANK],
    /// Element strides: all 1 (dense boxes).
    element_strides: [u32; MAX_RANK],
    /// Bytes one full box occupies in shared memory.
    box_bytes: usize,
}

/// Checks every rule of `cuTensorMapEncodeTiled` for the view `layout` whose allocation starts
/// at `alloc_base` and holds `alloc_bytes`, and translates it to the driver's order.
///
/// The rules are `cuda.h`'s, summarised in `docs/ptx.md` §3 (the limits and the
/// error live in `crate::tma_rules`), so a bad argument is a [`TensorMapError`] naming the
/// argument and the rule rather than the driver's bare `CUDA_ERROR_INVALID_VALUE`. The checks
/// are pure functions of the tensor's layout and address, so they are unit-tested without a
/// GPU. Like [`DeviceTensor::shape`], `box_dims` are given **outermost first**; the driver
/// (and the PTX coordinates of `cp.async.bulk.tensor`) count dimensions **innermost first**.
fn encode_args(
    layout: &Layout,
    alloc_base: u64,
    alloc_bytes: usize,
    box_dims: &[u32],
    swizzle: Swizzle,
) -> Result<EncodeArgs, TensorMapError> {
    use sys::CUtensorMapDataType as T;
    let dtype = match layout.dtype {
        DType::Bf16 => T::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => T::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        got @ (DType::I32 | DType::U32 | DType::Bool) => return Err(TensorMapError::DType { got }),
    };
    let rank = layout.shape.len();
    if !(1..=MAX_RANK).contains(&rank) {
        return Err(TensorMapError::Rank { got: rank });
    }
    if box_dims.len() != rank {
        return Err(TensorMapError::BoxRank {
            expected: rank,
            got: box_dims.len(),
        });
    }
    let elem = layout.dtype.size_bytes();
    let inner = rank - 1;
    if layout.strides[inner] != 1 {
        return Err(TensorMapError::InnerStride {
            stride: layout.strides[inner],
        });
    }
    let needed = (layout.end_elem().map_or(u128::MAX, |e| e as u128)).saturating_mul(elem as u128);
    if needed > alloc_bytes as u128 {
        return Err(TensorMapError::OutOfBounds {
            needed,
            available: alloc_bytes,
        });
    }
    // In bounds, so the offset fits the allocation and cannot overflow.
    let addr = alloc_base + (layout.offset * elem) as u64;
    if !addr.is_multiple_of(TMA_ALIGN as u64) {
        return Err(TensorMapError::BaseAlignment { addr });
    }
    let mut args = EncodeArgs {
        dtype,
        rank,
        global_dim: [1; MAX_RANK],
        global_strides: [0; MAX_RANK - 1],
        box_dim: [1; MAX_RANK],
        element_strides: [1; MAX_RANK],
        box_bytes: elem,
    };
    for (dim, &b) in box_dims.iter().enumerate() {
        // Driver index: innermost is 0.
        let d = inner - dim;
        let extent = layout.shape[dim];
        if extent == 0 || extent > MAX_EXTENT {
            return Err(TensorMapError::Extent { dim, extent });
        }
        args.global_dim[d] = extent as u64;
        if dim != inner {
            let bytes = layout.strides[dim] as u128 * elem as u128;
            if !bytes.is_multiple_of(TMA_ALIGN as u128) {
                return Err(TensorMapError::StrideAlignment { dim, bytes });
            }
            if bytes >= MAX_STRIDE_BYTES {
                return Err(TensorMapError::StrideTooLarge { dim, bytes });
            }
            args.global_strides[d - 1] = bytes as u64;
        }
        if !(1..=MAX_BOX).contains(&b) {
            return Err(TensorMapError::BoxDim { dim, got: b });
        }
        args.box_dim[d] = b;
        args.box_bytes *= b as usize;
    }
    let row_bytes = box_dims[inner] as usize * elem;
    if !row_bytes.is_multiple_of(TMA_ALIGN) {
        return Err(TensorMapError::InnerBoxBytes {
            bytes: row_bytes,
            elems: box_dims[inner],
            dtype: layout.dtype,
        });
    }
    if let Some(span) = swizzle.span_bytes()
        && row_bytes > span
    {
        return Err(TensorMapError::SwizzleSpan {
            swizzle,
            span,
            bytes: row_bytes,
        });
    }
    Ok(args)
}

/// A tiled TMA descriptor (`CUtensorMap`: 128 bytes, aligned to 128 in memory, at least the
/// 64 the driver requires) over a device tensor, which it keeps alive, so the global address
/// inside it never dangles.
///
/// Pass it to a kernel **by value**: the entry declares `.param .align 64 .b8 name[128]`, and
/// the launch's `kernelParams` slot points at [`TensorMap::as_raw`] (see
/// [`KernelParams::tensor_map`](crate::KernelParams::tensor_map)). In the kernel, take the
/// parameter's address with `mov.b64` then `cvta.param.u64` before `cp.async.bulk.tensor`.
///
/// The kernel's innermost coordinate (elements, innermost first) must be a whole number of
/// 16-byte chunks (a multiple of 8 for bf16/f16, of 4 for f32; negative is fine): otherwise
/// the load dies with `CUDA_ERROR_ILLEGAL_INSTRUCTION`, sticky for the context (seen on an
/// H200, with and without swizzle). Outer coordinates are free. Coordinates are run-time
/// values in the kernel, so no check here can catch this.
#[derive(Clone, Debug)]
pub struct TensorMap {
    raw: sys::CUtensorMap,
    tensor: DeviceTensor,
    box_dims: Vec<u32>,
    box_bytes: usize,
    swizzle: Swizzle,
}

impl TensorMap {
    /// Encodes a tiled map over `tensor` (see [`Device::tensor_map`](crate::Device::tensor_map),
    /// which checks first that `tensor` lives on the device's context).
    pub(crate) fn tiled(
        tensor: &DeviceTensor,
        box_dims: &[u32],
        encoding: MapEncoding,
    ) -> Result<TensorMap, RuntimeError> {
        let args = encode_args(
            tensor.layout(),
            tensor.alloc_ptr(),
            tensor.alloc_bytes(),
            box_dims,
            encoding.swizzle,
        )?;
        let mut raw = sys::CUtensorMap { opaque: [0; 16] };
        // SAFETY: every array has at least `rank` (or `rank - 1` for the strides) entries, all
        // values were checked against the driver's rules, `raw` is a properly aligned map, and
        // the address lies inside a live allocation that the map keeps alive. A `DeviceTensor`
        // exists, so the driver library is loaded.
        unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut raw,
                args.dtype,
                args.rank as u32,
                tensor.device_ptr() as *mut std::ffi::c_void,
                args.global_dim.as_ptr(),
                args.global_strides.as_ptr(),
                args.box_dim.as_ptr(),
                args.element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                encoding.swizzle.raw(),
                encoding.l2_promotion.raw(),
                encoding.oob_fill.raw(),
            )
        }
        .result()
        .call("cuTensorMapEncodeTiled")?;
        Ok(TensorMap {
            raw,
            tensor: tensor.clone(),
            box_dims: box_dims.to_vec(),
            box_bytes: args.box_bytes,
            swizzle: encoding.swizzle,
        })
    }

    /// The encoded descriptor, as a launch passes it by value.
    pub fn as_raw(&self) -> &sys::CUtensorMap {
        &self.raw
    }

    /// The tensor the map addresses.
    pub fn tensor(&self) -> &DeviceTensor {
        &self.tensor
    }

    /// Box extents, outermost first.
    pub fn box_dims(&self) -> &[u32] {
        &self.box_dims
    }

    /// Bytes one box load writes to shared memory (and counts toward an mbarrier's tx-count),
    /// out-of-bounds fill included.
    pub fn box_bytes(&self) -> usize {
        self.box_bytes
    }

    /// The swizzle mode.
    pub fn swizzle(&self) -> Swizzle {
        self.swizzle
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x7f00_0000_0000;

    fn check(
        layout: &Layout,
        box_dims: &[u32],
        swizzle: Swizzle,
    ) -> Result<EncodeArgs, TensorMapError> {
        let bytes = layout.end_byte().expect("small layout");
        encode_args(layout, BASE, bytes, box_dims, swizzle)
    }

    #[test]
    fn bf16_matrix_translates_to_innermost_first_with_byte_strides() {
        // The H200-verified map: {128 cols, 64 rows}, stride 256 B, box {64, 64}, SW128.
        let l = Layout::contiguous(DType::Bf16, &[64, 128]);
        let a = check(&l, &[64, 64], Swizzle::B128).expect("valid");
        assert_eq!(a.rank, 2);
        assert_eq!(
            a.dtype,
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        );
        assert_eq!(a.global_dim[..2], [128, 64]);
        assert_eq!(a.global_strides[..1], [256]);
        assert_eq!(a.box_dim[..2], [64, 64]);
        assert_eq!(a.element_strides[..2], [1, 1]);
        assert_eq!(a.box_bytes, 8192);
    }

    #[test]
    fn rank5_f32_orders_every_dimension_and_stride() {
        let l = Layout::contiguous(DType::F32, &[2, 3, 5, 7, 8]);
        let a = check(&l, &[1, 2, 3, 4, 8], Swizzle::None).expect("valid");
        assert_eq!(a.global_dim, [8, 7, 5, 3, 2]);
        assert_eq!(a.global_strides, [32, 32 * 7, 32 * 35, 32 * 105]);
        assert_eq!(a.box_dim, [8, 4, 3, 2, 1]);
        assert_eq!(a.box_bytes, 4 * 8 * 4 * 3 * 2);
    }

    #[test]
    fn a_column_window_keeps_the_parent_stride_and_offset() {
        let l = Layout::contiguous(DType::F16, &[16, 64])
            .narrow(1, 8, 32)
            .expect("in range");
        let a = check(&l, &[8, 32], Swizzle::B64).expect("16-B aligned window");
        assert_eq!(a.global_dim[..2], [32, 16]);
        assert_eq!(a.global_strides[0], 128);
        let odd = Layout::contiguous(DType::F16, &[16, 64])
            .narrow(1, 4, 32)
            .expect("in range");
        assert_eq!(
            check(&odd, &[8, 32], Swizzle::None),
            Err(TensorMapError::BaseAlignment { addr: BASE + 8 })
        );
    }

    #[test]
    fn dtype_and_rank_rules() {
        let l = Layout::contiguous(DType::I32, &[4, 4]);
        assert_eq!(
            check(&l, &[4, 4], Swizzle::None),
            Err(TensorMapError::DType { got: DType::I32 })
        );
        let l = Layout::contiguous(DType::F32, &[2, 2, 2, 2, 2, 4]);
        assert_eq!(
            check(&l, &[1; 6], Swizzle::None),
            Err(TensorMapError::Rank { got: 6 })
        );
        let l = Layout::contiguous(DType::F32, &[]);
        assert_eq!(
            check(&l, &[], Swizzle::None),
            Err(TensorMapError::Rank { got: 0 })
        );
        let l = Layout::contiguous(DType::F32, &[4, 4]);
        assert_eq!(
            check(&l, &[4], Swizzle::None),
            Err(TensorMapError::BoxRank {
                expected: 2,
                got: 1
            })
        );
    }

    #[test]
    fn inner_dimension_must_be_contiguous() {
        let l = Layout::contiguous(DType::Bf16, &[64, 64])
            .transpose(0, 1)
            .expect("2-D");
        assert_eq!(
            check(&l, &[8, 8], Swizzle::None),
            Err(TensorMapError::InnerStride { stride: 64 })
        );
    }

    #[test]
    fn extent_rules() {
        let mut l = Layout::contiguous(DType::Bf16, &[4, 8]);
        l.shape[0] = 0;
        assert_eq!(
            encode_args(&l, BASE, 64, &[1, 8], Swizzle::None),
            Err(TensorMapError::Extent { dim: 0, extent: 0 })
        );
        // One row of 2^31 + 8 elements: in bounds of a (pretend) allocation, but too long.
        let l = Layout::contiguous(DType::Bf16, &[(1 << 31) + 8]);
        assert_eq!(
            encode_args(&l, BASE, 1 << 33, &[8], Swizzle::None),
            Err(TensorMapError::Extent {
                dim: 0,
                extent: (1 << 31) + 8
            })
        );
    }

    #[test]
    fn stride_rules() {
        // 60 bf16 columns: a 120-B row stride (the driver refuses it, docs/ptx.md §3).
        let l = Layout::contiguous(DType::Bf16, &[8, 60]);
        assert_eq!(
            check(&l, &[8, 8], Swizzle::None),
            Err(TensorMapError::StrideAlignment { dim: 0, bytes: 120 })
        );
        // A stride of 2^39 elements of f32 is 2^41 bytes.
        let l = Layout {
            dtype: DType::F32,
            shape: vec![1, 4],
            strides: vec![1 << 39, 1],
            offset: 0,
        };
        assert_eq!(
            encode_args(&l, BASE, 16, &[1, 4], Swizzle::None),
            Err(TensorMapError::StrideTooLarge {
                dim: 0,
                bytes: 1 << 41
            })
        );
    }

    #[test]
    fn box_rules() {
        let l = Layout::contiguous(DType::Bf16, &[512, 512]);
        assert_eq!(
            check(&l, &[257, 64], Swizzle::None),
            Err(TensorMapError::BoxDim { dim: 0, got: 257 })
        );
        assert_eq!(
            check(&l, &[0, 64], Swizzle::None),
            Err(TensorMapError::BoxDim { dim: 0, got: 0 })
        );
        assert_eq!(
            check(&l, &[64, 12], Swizzle::None),
            Err(TensorMapError::InnerBoxBytes {
                bytes: 24,
                elems: 12,
                dtype: DType::Bf16
            })
        );
        // 128 bf16 = 256 B does not fit the 128-B swizzle span (driver error 1, docs/ptx.md §3).
        assert_eq!(
            check(&l, &[64, 128], Swizzle::B128),
            Err(TensorMapError::SwizzleSpan {
                swizzle: Swizzle::B128,
                span: 128,
                bytes: 256
            })
        );
        assert!(check(&l, &[64, 128], Swizzle::None).is_ok());
        assert!(check(&l, &[256, 16], Swizzle::B32).is_ok());
        assert_eq!(
            check(&l, &[256, 32], Swizzle::B32),
            Err(TensorMapError::SwizzleSpan {
                swizzle: Swizzle::B32,
                span: 32,
                bytes: 64
            })
        );
    }

    #[test]
    fn a_box_larger_than_the_tensor_is_allowed() {
        // Out-of-range box elements are filled, so a 40x50 tensor may use a 64x64 box.
        let l = Layout::contiguous(DType::Bf16, &[50, 40]);
        let bytes = l.end_byte().expect("small");
        // The row stride is 80 B, a multiple of 16.
        let a = encode_args(&l, BASE, bytes, &[64, 64], Swizzle::B128).expect("valid");
        assert_eq!(a.global_dim[..2], [40, 50]);
        assert_eq!(a.box_bytes, 8192);
    }

    #[test]
    fn a_view_past_its_allocation_is_refused() {
        let l = Layout::contiguous(DType::F32, &[4, 8]);
        assert_eq!(
            encode_args(&l, BASE, 64, &[4, 8], Swizzle::None),
            Err(TensorMapError::OutOfBounds {
                needed: 128,
                available: 64
            })
        );
    }

    #[test]
    fn the_raw_map_is_128_bytes_at_64_byte_alignment_or_more() {
        assert_eq!(std::mem::size_of::<sys::CUtensorMap>(), 128);
        assert!(std::mem::align_of::<sys::CUtensorMap>().is_multiple_of(64));
    }

    #[test]
    fn errors_name_the_argument_and_the_rule() {
        let e = TensorMapError::SwizzleSpan {
            swizzle: Swizzle::B128,
            span: 128,
            bytes: 256,
        };
        assert_eq!(
            e.to_string(),
            "tensor map `box_dims`: with B128 swizzle the innermost box row must be at most 128 bytes, got 256 bytes"
        );
        let e = TensorMapError::StrideAlignment { dim: 0, bytes: 120 };
        assert!(
            e.to_string()
                .starts_with("tensor map `tensor`: stride of dimension 0")
        );
    }
}
