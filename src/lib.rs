//! kiln: write GPU kernels as Rust functions under `#[kernel]`; kiln compiles them to PTX
//! and launches them. This facade re-exports what users need; `use kiln::prelude::*;` brings
//! the kernel vocabulary into scope.

/// The tile IR (crate `kiln-ir`), plus the interpreter entry point generated code calls.
pub mod ir {
    pub use kiln_ir::*;

    /// PLACEHOLDER until the interpreter (`kiln_ir::interp`) is merged: the exact signatures
    /// the `#[kernel]` macro's `interpret` method calls. The lead replaces this module with
    /// the real one at merge.
    pub mod interp {
        use std::collections::BTreeMap;

        use kiln_ir::HostTensor;
        use kiln_ir::dsl::{ComptimeValue, KernelDef};

        /// An argument of an interpreted launch.
        pub enum HostArg<'a> {
            /// A read-only tensor.
            Tensor(&'a HostTensor),
            /// A tensor the kernel writes.
            TensorMut(&'a mut HostTensor),
            /// An f32 scalar.
            F32(f32),
            /// An i32 scalar.
            I32(i32),
        }

        /// Why an interpreted run failed.
        #[derive(Debug)]
        pub enum InterpError {
            /// The interpreter is not linked into this build yet.
            NotAvailable,
        }

        /// Runs `def` specialised on `comptime` over `grid` on the CPU.
        pub fn run_def(
            _def: &dyn KernelDef,
            _comptime: &BTreeMap<String, ComptimeValue>,
            _grid: [u32; 3],
            _args: &mut [HostArg<'_>],
        ) -> Result<(), InterpError> {
            Err(InterpError::NotAvailable)
        }
    }
}

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
