//! What a compiled kernel hands the runtime: the module's text and how to launch it.

use kiln_ir::Target;

/// A compiled kernel: PTX text plus what the runtime needs to launch it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxModule {
    /// The whole PTX module (`.version`, `.target`, one `.entry`).
    pub ptx: String,
    /// The entry's name.
    pub entry: String,
    /// Threads per block the kernel must be launched with.
    pub threads_per_block: u32,
    /// Dynamic shared memory bytes the launch must request.
    pub dynamic_smem_bytes: u32,
    /// The target it was compiled for.
    pub target: Target,
    /// The TMA descriptors the runtime must encode and pass (sm_90a), one per
    /// [`crate::abi::SlotRole::TensorMap`] slot, in slot order. Empty for other targets.
    pub tensor_maps: Vec<TensorMapSpec>,
    /// Whether the kernel is persistent (`kiln_ir::sched::tiles`): its CTAs walk the
    /// logical grid passed in its [`crate::abi::SlotRole::Grid`] slots.
    pub persistent: bool,
}

/// How the runtime encodes one tensor map (`cuTensorMapEncodeTiled`) for a launch: over the
/// whole tensor argument `param` (its extents and strides), bf16/f16 elements, interleave none,
/// element strides 1, out-of-bounds elements filled with zeros.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorMapSpec {
    /// The tensor parameter (index into the kernel's parameters).
    pub param: usize,
    /// Box extents, outermost dimension first (like the tensor's shape).
    pub box_dims: Vec<u32>,
    /// Swizzle span in bytes: 32, 64 or 128 (the inner box row's bytes).
    pub swizzle_bytes: u32,
}
