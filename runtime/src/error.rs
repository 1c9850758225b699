//! The runtime's two error types: [`RuntimeError`] for device, memory and JIT operations, and
//! [`LaunchError`] for a kernel launch, which names the offending argument.

use cudarc::driver::DriverError;
use kiln_ir::{DType, Diagnostic};
use kiln_ptx::CodegenError;

use crate::cluster::ClusterError;
use crate::tma_rules::TensorMapError;

/// A failure of a device, memory or module operation.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No usable CUDA driver: `libcuda` cannot be loaded, `cuInit` fails, or no GPU exists.
    #[error("no CUDA driver: {reason}")]
    NoDriver {
        /// What was tried and what went wrong.
        reason: String,
    },
    /// The ordinal names no GPU.
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoDevice {
        /// The ordinal asked for.
        ordinal: usize,
        /// How many devices the driver reports.
        count: usize,
    },
    /// No candidate of an autotuning search compiled and ran.
    #[error("autotuning `{kernel}` for {bucket}: no candidate ran ({})", timings.join("; "))]
    Autotune {
        /// The kernel.
        kernel: String,
        /// The shape bucket.
        bucket: String,
        /// Each candidate and why it failed.
        timings: Vec<String>,
    },
    /// A driver call failed.
    #[error("CUDA driver call `{call}` failed: {source}")]
    Driver {
        /// The driver function (or cudarc wrapper) that failed.
        call: &'static str,
        /// The driver's error code.
        source: DriverError,
    },
    /// The driver's JIT rejected a PTX module; `log` is its error log.
    #[error("the CUDA driver could not load the PTX of `{entry}` ({source}):\n{log}")]
    Jit {
        /// The entry point of the module.
        entry: String,
        /// The driver's error code.
        source: DriverError,
        /// The JIT error log (ptxas messages), trimmed.
        log: String,
    },
    /// A host tensor does not fit the device tensor it is copied into, or a view is out of range.
    #[error("{what}: expected {expected}, got {got}")]
    Shape {
        /// The operation and operand.
        what: &'static str,
        /// What was expected.
        expected: String,
        /// What was given.
        got: String,
    },
    /// A TMA tensor map argument breaks one of the driver's rules (checked before the driver).
    #[error("{0}")]
    TensorMap(#[from] TensorMapError),
    /// Writing a `KILN_DUMP` file failed.
    #[error("cannot write dump file {path}: {source}")]
    Dump {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// Attaches the driver call's name to a cudarc result.
pub(crate) trait DriverContext<T> {
    /// Maps a driver error to [`RuntimeError::Driver`] naming `call`.
    fn call(self, call: &'static str) -> Result<T, RuntimeError>;
}

impl<T> DriverContext<T> for Result<T, DriverError> {
    fn call(self, call: &'static str) -> Result<T, RuntimeError> {
        self.map_err(|source| RuntimeError::Driver { call, source })
    }
}

/// Why a kernel launch was refused or failed. Argument errors name the parameter (as declared
/// in the kernel signature) and say what was expected.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// Wrong number of launch arguments.
    #[error("kernel `{kernel}` takes {expected} launch argument(s), got {got}")]
    ArgCount {
        /// The kernel.
        kernel: String,
        /// Parameters in its signature.
        expected: usize,
        /// Arguments passed.
        got: usize,
    },
    /// A tensor passed for a scalar or the reverse, or a scalar of the wrong type.
    #[error("argument {index} `{param}`: expected {expected}, got {got}")]
    ArgKind {
        /// Position in the signature.
        index: usize,
        /// The parameter's name.
        param: &'static str,
        /// What the signature declares.
        expected: String,
        /// What was passed.
        got: String,
    },
    /// A tensor of the wrong element type.
    #[error("argument `{param}`: expected a {expected} tensor, got {got}")]
    DType {
        /// The parameter's name.
        param: &'static str,
        /// The declared element type.
        expected: DType,
        /// The tensor's element type.
        got: DType,
    },
    /// A tensor of the wrong rank.
    #[error("argument `{param}`: expected a tensor of rank {expected}, got rank {got}")]
    Rank {
        /// The parameter's name.
        param: &'static str,
        /// The declared rank.
        expected: usize,
        /// The tensor's rank.
        got: usize,
    },
    /// The innermost dimension is not contiguous.
    #[error(
        "argument `{param}`: the innermost stride must be 1 element (kernels read rows contiguously), got {stride}"
    )]
    InnerStride {
        /// The parameter's name.
        param: &'static str,
        /// The innermost stride, in elements.
        stride: usize,
    },
    /// An extent does not fit in the kernel's 32-bit extent parameter.
    #[error("argument `{param}`: extent {extent} of dimension {dim} must be below 2^31")]
    Extent {
        /// The parameter's name.
        param: &'static str,
        /// The dimension, outermost first.
        dim: usize,
        /// Its extent.
        extent: usize,
    },
    /// A stride does not fit in the kernel's 64-bit stride parameter.
    #[error("argument `{param}`: stride {stride} of dimension {dim} must be below 2^63")]
    Stride {
        /// The parameter's name.
        param: &'static str,
        /// The dimension, outermost first.
        dim: usize,
        /// Its stride, in elements.
        stride: usize,
    },
    /// Shape and strides address memory past the end of the allocation.
    #[error(
        "argument `{param}`: shape {shape:?} with strides {strides:?} at element offset {offset} needs {needed} bytes, but the allocation holds {available}"
    )]
    OutOfBounds {
        /// The parameter's name.
        param: &'static str,
        /// The tensor's shape.
        shape: Vec<usize>,
        /// Its strides, in elements.
        strides: Vec<usize>,
        /// Its first element's offset in the allocation, in elements.
        offset: usize,
        /// Bytes from the allocation's start to the end of the last addressed element.
        needed: usize,
        /// The allocation's size in bytes.
        available: usize,
    },
    /// The tensor lives on another device (context).
    #[error("argument `{param}`: the tensor was allocated on another device")]
    ForeignTensor {
        /// The parameter's name.
        param: &'static str,
    },
    /// A grid dimension is zero or above the device's limit.
    #[error("grid dimension {axis}: expected 1..={max}, got {got}")]
    Grid {
        /// `x`, `y` or `z`.
        axis: char,
        /// The device's limit.
        max: u32,
        /// The value passed.
        got: u32,
    },
    /// The compiled kernel asks for more threads or shared memory than the device has.
    #[error("kernel `{kernel}` needs {needed} {resource}, but the device allows {max}")]
    Resource {
        /// The kernel's entry name.
        kernel: String,
        /// `threads per block` or `bytes of dynamic shared memory`.
        resource: &'static str,
        /// What the kernel needs.
        needed: u32,
        /// The device's limit.
        max: u32,
    },
    /// A persistent kernel's logical grid has more blocks than it can count.
    #[error(
        "kernel `{kernel}` is launched on a grid of {tiles} blocks; a persistent kernel takes at most {max}"
    )]
    Tiles {
        /// The kernel's entry name.
        kernel: String,
        /// Blocks in the grid asked for.
        tiles: u64,
        /// The most it takes.
        max: u64,
    },
    /// A cluster shape that does not fit the grid or needs the non-portable opt-in.
    #[error("{0}")]
    Cluster(#[from] ClusterError),
    /// The signature has no parameter ABI (a scalar of a type kernels cannot take).
    #[error("{0}")]
    Abi(#[from] kiln_ptx::abi::AbiError),
    /// An argument does not fit its ABI slot although validation accepted it.
    #[error(
        "internal kiln error: a launch argument does not match the ABI slot `{slot}`; validation should have rejected it"
    )]
    AbiMismatch {
        /// The slot, as the entry declares it.
        slot: String,
    },
    /// The TMA descriptor of a tensor argument of an sm_90a kernel could not be encoded.
    #[error("argument `{param}`: {source}")]
    TensorMapArg {
        /// The parameter's name.
        param: String,
        /// Why (a rule of `cuTensorMapEncodeTiled`, or the driver's refusal).
        #[source]
        source: RuntimeError,
    },
    /// Building the kernel's IR for this specialisation failed (at the user's source).
    #[error("{0}")]
    Build(#[from] Diagnostic),
    /// The PTX backend failed.
    #[error("{0}")]
    Codegen(#[from] CodegenError),
    /// A device operation (JIT load, launch) failed.
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
}
