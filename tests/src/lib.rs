//! kiln-tests: support shared by the cross-crate tests (seeded inputs, f64 references, error
//! checks, code generation checks, random kernels, packed varlen batches, the case sweep; each
//! module says what it holds).
//!
//! **Architecture invariant:** the references here are plain f64 Rust, independent of the
//! IR, the interpreter and the backend, so they can judge all three; the benchmarks reuse
//! them rather than keep their own.

pub mod check;
pub mod codegen;
pub mod inputs;
pub mod random_kernel;
pub mod reference;
pub mod scheduled;
pub mod sweep;
pub mod varlen;
