//! The benchmarks' error type.

use kiln_runtime::{LaunchError, RuntimeError};

/// Why a benchmark run stopped.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// A device operation failed (including "no CUDA driver").
    #[error("{0}")]
    Runtime(#[from] RuntimeError),
    /// A kiln kernel could not be compiled or launched.
    #[error("{0}")]
    Launch(#[from] LaunchError),
    /// `libcublas` could not be loaded.
    #[error("cuBLAS is not available: libcublas (libcublas.so.13 / .so.12) could not be loaded")]
    NoCublas,
    /// A cuBLAS call failed.
    #[error("cuBLAS call `{call}` failed: {source}")]
    Cublas {
        /// The call.
        call: &'static str,
        /// The status.
        source: cudarc::cublas::result::CublasError,
    },
    /// A `--set NAME=VALUE` does not fit the kernel's comptime struct.
    #[error("--set: {0}")]
    Define(#[from] kiln_ir::dsl::DefineError),
    /// A kiln result disagrees with the peer's.
    #[error("{what}: relative error {error:.3e} against {peer} exceeds {tolerance:.0e}")]
    Wrong {
        /// The configuration.
        what: String,
        /// The peer compared with.
        peer: &'static str,
        /// The relative L2 error.
        error: f64,
        /// The tolerance.
        tolerance: f64,
    },
    /// Writing results failed.
    #[error("cannot write {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
}
