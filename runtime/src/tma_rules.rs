//! What `cuTensorMapEncodeTiled` accepts: a tiled map's options ([`Swizzle`], [`L2Promotion`],
//! [`OobFill`]), the driver's limits, and [`TensorMapError`], which names the rule an argument
//! breaks (the checks themselves are in `crate::tma`). A leaf: it uses nothing else in the crate,
//! so the crate's error types can wrap [`TensorMapError`] without an import circle.

use cudarc::driver::sys;
use kiln_ir::DType;

/// Most dimensions a tiled tensor map may have.
pub(crate) const MAX_RANK: usize = 5;

/// Largest box extent in any dimension.
pub(crate) const MAX_BOX: u32 = 256;

/// Largest global extent (`cuda.h` 13.5: "less than or equal to 2^31").
pub(crate) const MAX_EXTENT: usize = 1 << 31;

/// Global strides must be below 2^40 bytes.
pub(crate) const MAX_STRIDE_BYTES: u128 = 1 << 40;

/// The global address, the strides and the inner box row must be multiples of this many bytes.
pub(crate) const TMA_ALIGN: usize = 16;

/// How TMA swizzles the box in shared memory; the inner box row must fit the swizzle span.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Swizzle {
    /// Rows stored as they are.
    None,
    /// 32-byte swizzle (2 chunks of 16 B permuted per row).
    B32,
    /// 64-byte swizzle.
    B64,
    /// 128-byte swizzle: the layout wgmma's SW128 descriptors expect (8-row, 1024-B atom).
    B128,
}

impl Swizzle {
    /// The swizzle span in bytes (the most bytes the inner box row may have), or `None`
    /// for no swizzle (no limit beyond the 256-element box).
    pub fn span_bytes(self) -> Option<usize> {
        match self {
            Swizzle::None => None,
            Swizzle::B32 => Some(32),
            Swizzle::B64 => Some(64),
            Swizzle::B128 => Some(128),
        }
    }

    pub(crate) fn raw(self) -> sys::CUtensorMapSwizzle {
        use sys::CUtensorMapSwizzle as S;
        match self {
            Swizzle::None => S::CU_TENSOR_MAP_SWIZZLE_NONE,
            Swizzle::B32 => S::CU_TENSOR_MAP_SWIZZLE_32B,
            Swizzle::B64 => S::CU_TENSOR_MAP_SWIZZLE_64B,
            Swizzle::B128 => S::CU_TENSOR_MAP_SWIZZLE_128B,
        }
    }
}

/// How far TMA loads promote their L2 fetches (a performance hint; never changes results).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum L2Promotion {
    /// No promotion.
    None,
    /// Fetch 64-byte sectors.
    B64,
    /// Fetch 128-byte lines.
    B128,
    /// Fetch 256 bytes (CUTLASS's default for GEMM operands).
    B256,
}

impl L2Promotion {
    pub(crate) fn raw(self) -> sys::CUtensorMapL2promotion {
        use sys::CUtensorMapL2promotion as P;
        match self {
            L2Promotion::None => P::CU_TENSOR_MAP_L2_PROMOTION_NONE,
            L2Promotion::B64 => P::CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
            L2Promotion::B128 => P::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            L2Promotion::B256 => P::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        }
    }
}

/// What a load writes for box elements outside the tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OobFill {
    /// Zeros (what masked GEMM and attention tiles need).
    Zero,
    /// NaN, which a tensor-core FMA then treats as zero (`NAN_REQUEST_ZERO_FMA`).
    NanRequestZeroFma,
}

impl OobFill {
    pub(crate) fn raw(self) -> sys::CUtensorMapFloatOOBfill {
        use sys::CUtensorMapFloatOOBfill as F;
        match self {
            OobFill::Zero => F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            OobFill::NanRequestZeroFma => F::CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA,
        }
    }
}

/// How a tiled map lays its box out in shared memory and fetches it: the options that follow
/// the box's extents in `cuTensorMapEncodeTiled`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct MapEncoding {
    /// The shared-memory swizzle.
    pub(crate) swizzle: Swizzle,
    /// The L2 promotion hint.
    pub(crate) l2_promotion: L2Promotion,
    /// What out-of-bounds elements read as.
    pub(crate) oob_fill: OobFill,
}

/// A tensor map argument that breaks one of the driver's rules. Dimensions are numbered as in
/// the tensor's shape (outermost first), the same order `box_dims` is given in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TensorMapError {
    /// TMA maps here carry bf16, f16 or f32 elements only.
    #[error("tensor map `tensor`: expected a bf16, f16 or f32 tensor, got {got}")]
    DType {
        /// The tensor's element type.
        got: DType,
    },
    /// The tensor's rank is outside 1..=5.
    #[error("tensor map `tensor`: expected rank 1..={MAX_RANK}, got rank {got}")]
    Rank {
        /// The tensor's rank.
        got: usize,
    },
    /// `box_dims` has a different length than the tensor's rank.
    #[error(
        "tensor map `box_dims`: expected {expected} extents (one per tensor dimension), got {got}"
    )]
    BoxRank {
        /// The tensor's rank.
        expected: usize,
        /// The number of box extents given.
        got: usize,
    },
    /// The innermost dimension is not contiguous (TMA's element strides here are all 1).
    #[error("tensor map `tensor`: the innermost stride must be 1 element, got {stride}")]
    InnerStride {
        /// The innermost stride, in elements.
        stride: usize,
    },
    /// The address of element `[0, .., 0]` is not 16-byte aligned.
    #[error("tensor map `tensor`: the global address must be 16-byte aligned, got {addr:#x}")]
    BaseAlignment {
        /// The address of the first element.
        addr: u64,
    },
    /// An extent is zero or above 2^31.
    #[error("tensor map `tensor`: extent of dimension {dim} must be in 1..=2^31, got {extent}")]
    Extent {
        /// The dimension, outermost first.
        dim: usize,
        /// Its extent.
        extent: usize,
    },
    /// An outer stride in bytes is not a multiple of 16.
    #[error(
        "tensor map `tensor`: stride of dimension {dim} must be a multiple of 16 bytes, got {bytes} bytes"
    )]
    StrideAlignment {
        /// The dimension, outermost first.
        dim: usize,
        /// Its stride in bytes.
        bytes: u128,
    },
    /// An outer stride in bytes is 2^40 or more.
    #[error("tensor map `tensor`: stride of dimension {dim} must be below 2^40 bytes, got {bytes}")]
    StrideTooLarge {
        /// The dimension, outermost first.
        dim: usize,
        /// Its stride in bytes.
        bytes: u128,
    },
    /// A box extent is outside 1..=256.
    #[error("tensor map `box_dims`: extent of dimension {dim} must be in 1..={MAX_BOX}, got {got}")]
    BoxDim {
        /// The dimension, outermost first.
        dim: usize,
        /// The extent given.
        got: u32,
    },
    /// The innermost box row is not a multiple of 16 bytes.
    #[error(
        "tensor map `box_dims`: the innermost box row must be a multiple of 16 bytes, got {bytes} bytes ({elems} x {dtype})"
    )]
    InnerBoxBytes {
        /// Bytes in one box row.
        bytes: usize,
        /// Elements in one box row.
        elems: u32,
        /// The element type.
        dtype: DType,
    },
    /// The innermost box row is wider than the swizzle span.
    #[error(
        "tensor map `box_dims`: with {swizzle:?} swizzle the innermost box row must be at most {span} bytes, got {bytes} bytes"
    )]
    SwizzleSpan {
        /// The swizzle mode.
        swizzle: Swizzle,
        /// Its span in bytes.
        span: usize,
        /// Bytes in one box row.
        bytes: usize,
    },
    /// The view reaches past the end of its allocation, so TMA could read outside it.
    #[error(
        "tensor map `tensor`: the view must lie inside its {available}-byte allocation, but it ends at byte {needed}"
    )]
    OutOfBounds {
        /// Bytes from the allocation's start to the view's end (`u128` so overflow cannot hide).
        needed: u128,
        /// The allocation's size.
        available: usize,
    },
    /// The tensor was allocated on another device than the one encoding the map.
    #[error("tensor map `tensor`: the tensor was allocated on another device")]
    ForeignTensor,
}
