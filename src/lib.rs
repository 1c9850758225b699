//! kiln: write GPU kernels as Rust functions under `#[kernel]`; kiln compiles them to PTX
//! and launches them. This facade re-exports what users need; `use kiln::prelude::*;` brings
//! the kernel vocabulary into scope.

/// The tile IR (crate `kiln-ir`): builder, printer, verifier, interpreter and passes.
pub use kiln_ir as ir;

/// The PTX backend (crate `kiln-ptx`): `compile`, the parameter ABI, the ptxas driver.
pub use kiln_ptx as ptx;

/// PLACEHOLDER until `kiln-runtime` is merged: the exact signatures the `#[kernel]` macro's
/// `launch` method calls. The lead replaces this module with `pub use kiln_runtime as
/// runtime;` at merge.
pub mod runtime {
    use std::collections::BTreeMap;

    use kiln_ir::dsl::{ComptimeValue, KernelDef};

    /// A CUDA device.
    pub struct Device;

    /// A tensor in device memory.
    pub struct DeviceTensor;

    /// An argument of a launch.
    pub enum KernelArg<'a> {
        /// A tensor.
        Tensor(&'a DeviceTensor),
        /// An f32 scalar.
        F32(f32),
        /// An i32 scalar.
        I32(i32),
    }

    /// Why a launch failed.
    #[derive(Debug)]
    pub enum LaunchError {
        /// The runtime is not linked into this build yet.
        NotAvailable,
    }

    impl Device {
        /// Compiles `def` for `comptime` (cached) and launches it over `grid`.
        pub fn launch(
            &self,
            _def: &dyn KernelDef,
            _comptime: &BTreeMap<String, ComptimeValue>,
            _grid: [u32; 3],
            _args: &[KernelArg<'_>],
        ) -> Result<(), LaunchError> {
            Err(LaunchError::NotAvailable)
        }
    }
}

/// Everything a kernel file needs: `use kiln::prelude::*;`.
pub mod prelude {
    pub use half::{bf16, f16};
    pub use kiln_ir::dsl::{
        Dim3, KernelDef, Value, abs, block_id, cdiv, col_max, col_sum, exp, exp2, full, grid_dim,
        iota, log2, max, min, mma, mma_acc, pipelined, recip, row_max, row_min, row_sum, rsqrt,
        select, sqrt, unroll, zeros,
    };
    pub use kiln_macros::{kernel, kernel_fn};
}
