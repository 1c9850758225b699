//! kiln-tests: support shared by the cross-crate tests. Random inputs with a printed seed
//! ([`inputs`]), f64 references computed from the already-rounded inputs ([`reference`]), and
//! relative-norm-error checks over poisoned outputs ([`check`]).
//!
//! **Architecture invariant:** the references here are plain f64 Rust, independent of the
//! IR, the interpreter and the backend, so they can judge all three; the benchmarks reuse
//! them rather than keep their own.

pub mod check;
pub mod inputs;
pub mod reference;
