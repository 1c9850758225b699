//! kiln-tests: support shared by the cross-crate tests. Random inputs with a printed seed
//! ([`inputs`]), f64 references computed from the already-rounded inputs ([`reference`]), and
//! relative-norm-error checks over poisoned outputs ([`check`]).

pub mod check;
pub mod inputs;
pub mod reference;
