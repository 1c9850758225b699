//! Shared parts of kiln's benchmark binaries: timing loops with CUDA events and rotated
//! inputs, random device inputs, cuBLAS, a minimal JSON writer, the run's metadata and a text
//! table. Benchmarks run by hand on a GPU (`bench/README` in the binaries' docs); they are
//! never tests.

pub mod cli;
pub mod cublas;
pub mod error;
pub mod harness;
pub mod inputs;
pub mod json;
pub mod report;

pub use error::BenchError;
