//! kiln: write GPU kernels as Rust functions under `#[kernel]`; kiln compiles them to PTX
//! and launches them. This facade re-exports what users need; `use kiln::prelude::*;` brings
//! the kernel vocabulary into scope.
//!
//! **Architecture invariant:** the facade holds no logic: it only re-exports the member
//! crates, so a user's `kiln::…` path and the crate that implements it cannot disagree.

/// The tile IR (crate `kiln-ir`): builder, printer, verifier, interpreter and passes.
pub use kiln_ir as ir;

/// The PTX backend (crate `kiln-ptx`): `compile`, the parameter ABI, the ptxas driver.
pub use kiln_ptx as ptx;

/// The runtime (crate `kiln-runtime`): devices, device tensors, compile cache, JIT load, launch.
pub use kiln_runtime as runtime;

/// The `kiln` command as a library (crate `kiln-cli-lib`, feature `cli`, on by default): a
/// crate's `src/bin/kiln.rs` of one line lists, dumps and checks every kernel linked into it,
/// `cargo run --bin kiln -- ptx my_kernel --target sm_90a`:
///
/// ```no_run
/// fn main() -> std::process::ExitCode {
///     kiln::cli::main()
/// }
/// ```
///
/// Every `#[kernel]` linked into the program registers itself, wherever it is defined (this
/// doc test's own kernel included); `run_args` runs the command in-process:
///
/// ```
/// use kiln::prelude::*;
///
/// /// `y = 2x`.
/// #[kernel(grid = [256, 1, 1])]
/// fn doubled(x: Tensor<f32, 1>, y: TensorMut<f32, 1>) {
///     let i = block_id().x * 256;
///     y.tile([256], [i]).store(x.tile([256], [i]).load() * 2.0);
/// }
///
/// let ir = kiln::cli::run_args(["kiln", "ir", "doubled", "--after", "build"])?;
/// assert!(ir.starts_with("kernel doubled("), "{ir}");
/// let ptx = kiln::cli::run_args(["kiln", "ptx", "doubled", "--target", "sm_90a"])?;
/// assert!(ptx.contains(".entry doubled"), "{ptx}");
/// # Ok::<(), String>(())
/// ```
#[cfg(feature = "cli")]
pub use kiln_cli_lib as cli;

/// Everything a kernel file needs: `use kiln::prelude::*;`.
pub mod prelude {
    pub use half::{bf16, f16};
    pub use kiln_ir::DType;
    pub use kiln_ir::dsl::AtomicOpts;
    pub use kiln_ir::dsl::{
        Comptime, Dim3, KernelDecl, KernelDef, Seed, Value, abs, at, bitcast, block_id,
        blocks_per_sm, cdiv, cluster, col_max, col_sum, cos, erf, exp, exp2, full, grid_dim, iota,
        log, log2, max, min, mma, mma_acc, mulhi, pipelined, rand, rand4x, randint, randint4x,
        randn, recip, reduce_max, reduce_min, reduce_sum, reject, row_max, row_min, row_sum, rsqrt,
        select, sigmoid, sin, sqrt, tanh, umulhi, unroll, warp_specialize, zeros,
    };
    pub use kiln_ir::kprint;
    pub use kiln_ir::{AtomicOp, MemScope, MemSem};
    pub use kiln_macros::{comptime, kernel, kernel_fn};
}

/// The Rust examples of the README and of `docs/`, compiled and run as doc tests
/// (`cargo test -p kiln --doc`), so that what the documentation shows stays true of the code.
#[cfg(doctest)]
pub mod doc_examples {
    #[doc = include_str!("../README.md")]
    pub struct Readme;
    #[doc = include_str!("../docs/own-crate.md")]
    pub struct OwnCrate;
    #[doc = include_str!("../docs/dsl.md")]
    pub struct DslReference;
}
