//! The frontend the `#[kernel]` macro's generated code calls to build IR.

pub mod def;

pub use def::{ComptimeKind, ComptimeParam, ComptimeValue, KernelDef, ParamSig, Spec, SpecError};
