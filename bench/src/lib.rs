//! Shared parts of kiln's benchmark binaries: timing loops with CUDA events and rotated
//! inputs, random device inputs, cuBLAS, the run's metadata as JSON (serde_json) and a text
//! table. Benchmarks are never tests; they run by hand on a GPU host (docs/benchmarking.md).
//!
//! **Architecture invariant:** no benchmark is a test and no test runs a benchmark; a
//! benchmark checks its own output (against the peer or an f64 reference from `kiln-tests`)
//! and exits non-zero when it disagrees, but never on timing.

pub mod cli;
pub mod cublas;
pub mod error;
pub mod harness;
pub mod inputs;
pub mod kernels;
pub mod report;

pub use error::BenchError;

use std::process::ExitCode;

/// A benchmark binary's exit: success when `run` finished and every result agreed with its
/// check; otherwise the error, or `disagreed` (what disagreed with what), on stderr and a
/// failure code.
pub fn exit(run: Result<bool, BenchError>, disagreed: &str) -> ExitCode {
    match run {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: {disagreed}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
