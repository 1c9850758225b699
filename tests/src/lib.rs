//! kiln-tests: support shared by the cross-crate tests. Random inputs with a printed seed
//! ([`inputs`]), f64 references computed from the already-rounded inputs ([`mod@reference`]), and
//! relative-norm-error checks over poisoned outputs ([`check`]), compiling a kernel for every
//! target into PTX ptxas assembles without spills ([`codegen`]), and kernels built from
//! arbitrary bytes for the random-kernel test and the fuzz target ([`random_kernel`]), and the
//! gemm run on the CPU execution of its schedule ([`scheduled`]), packed variable-length
//! attention batches with their per-sequence reference ([`varlen`]), and the case loop over
//! shapes and input distributions the kernel tests share ([`sweep`]).
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
